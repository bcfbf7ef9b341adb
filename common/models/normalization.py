"""Feature normalization: SpeechBrain's ``InputNormalization`` and a level-free form that streams.

``normalize_type`` (the model graph's key):

- ``global``: corpus mean / std per mel bin (SpeechBrain's running statistics); streams, but keeps each
  recording's level, which differs by ±9 dB across the open corpus;
- ``sentence``: each utterance's own mean / std; removes level and channel, but needs the whole
  recording, so it cannot stream;
- ``frame``: each frame's log-mel bins minus their mean, then the global mean / std. A change of level
  multiplies the power spectrum, which moves every bin of a log-mel frame by the same amount: taking the
  frame's mean away removes the level frame by frame, with no state, so the model still streams.
"""

from speechbrain.processing.features import InputNormalization

NORM_TYPES = ("global", "sentence", "frame")


class Normalization(InputNormalization):
    """``InputNormalization`` with ``norm_type: frame`` added (see the module's docstring); the other
    types are SpeechBrain's own. A ``frame`` normalizer reports ``norm_type == "global"``: its statistics
    are global ones, saved and loaded as SpeechBrain's."""

    def __init__(self, norm_type="global", **kwargs):
        if norm_type not in NORM_TYPES:
            raise ValueError(f"normalize_type: {norm_type!r} is not one of {', '.join(NORM_TYPES)}")
        super().__init__(norm_type="global" if norm_type == "frame" else norm_type, **kwargs)
        self.frame_level = norm_type == "frame"

    def forward(self, x, lengths=None, epoch=None):
        if self.frame_level:
            x = x - x.mean(dim=-1, keepdim=True)
        return super().forward(x, lengths, epoch)
