"""Feature normalization: SpeechBrain's ``InputNormalization`` and two forms that stream.

``normalize_type`` (the model graph's key):

- ``global``: corpus mean / std per mel bin (SpeechBrain's running statistics); streams, but keeps each
  recording's level and channel;
- ``sentence``: each utterance's own mean / std per bin; removes level and channel, but needs the whole
  recording, so it cannot stream;
- ``frame``: each frame's log-mel bins minus their mean, then the global mean / std. A change of level
  multiplies the power spectrum, which moves every bin of a log-mel frame by the same amount: taking the
  frame's mean away removes the level frame by frame, with no state;
- ``causal``: each bin's mean / std over the frames so far (Kaldi's online CMVN), the corpus statistics
  counting as ``PRIOR_FRAMES`` frames before the first: removes level and channel as ``sentence`` does
  once a few seconds have passed, and streams (``causal`` with ``history`` carries the sums).
"""

import torch
from speechbrain.processing.features import InputNormalization, make_padding_mask

NORM_TYPES = ("global", "sentence", "frame", "causal")
STREAMING_TYPES = ("global", "frame", "causal")  # computable chunk by chunk (common/streaming.py)
PRIOR_FRAMES = 100  # causal: the corpus statistics weigh as 1 s of frames


class Normalization(InputNormalization):
    """``InputNormalization`` with ``norm_type`` ``frame`` and ``causal`` added (see the module's
    docstring); ``global`` and ``sentence`` are SpeechBrain's own. ``kind`` is the type asked for; the
    added types keep global statistics, saved and loaded as SpeechBrain's (``norm_type == "global"``)."""

    def __init__(self, norm_type="global", **kwargs):
        if norm_type not in NORM_TYPES:
            raise ValueError(f"normalize_type: {norm_type!r} is not one of {', '.join(NORM_TYPES)}")
        super().__init__(norm_type="global" if norm_type in ("frame", "causal") else norm_type, **kwargs)
        self.kind = norm_type

    def forward(self, x, lengths=None, epoch=None):
        if self.kind == "frame":
            x = x - x.mean(dim=-1, keepdim=True)
        if self.kind != "causal":
            return super().forward(x, lengths, epoch)
        if self._should_update(epoch):
            self._update_global_stats(x, make_padding_mask(x, lengths, length_dim=1))
        return self.causal(x)

    def causal(self, x, history=None, first=0):
        """``x`` [batch, frames, bins] normalized by each bin's mean / std over the frames up to each one,
        after ``history`` ``(count, sum, sum of squares)`` of the frames before ``x`` (None: ``x`` starts
        the recording) and the corpus statistics as ``PRIOR_FRAMES`` frames. Padding after a row's end
        does not change its frames (the statistics only look back). Frames before index ``first`` (an int
        or a 0-d tensor: a streamed window's frames whose audio is not all there) are not counted and come
        out as zeros; the others come out as if ``x`` started at ``first``."""
        mean, var = self.glob_mean.to(x.device).double(), self.glob_std.to(x.device).double().square()
        count, total, squares = PRIOR_FRAMES, PRIOR_FRAMES * mean, PRIOR_FRAMES * (var + mean.square())
        if history is not None:
            count, total, squares = count + history[0], total + history[1], squares + history[2]
        kept = (torch.arange(x.shape[1], device=x.device) >= first)[None, :, None].double()
        x64 = x.double() * kept  # zeros add nothing to the sums below
        counts = count + kept.cumsum(dim=1)
        running_mean = (total + x64.cumsum(dim=1)) / counts
        running_var = (squares + x64.square().cumsum(dim=1)) / counts - running_mean.square()
        return ((x64 - running_mean) / running_var.clamp(min=self.epsilon).sqrt() * kept).to(x.dtype)
