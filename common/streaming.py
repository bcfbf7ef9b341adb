"""Streaming recognition with a finetuned model: audio in pieces, encoder state carried across chunks,
greedy CTC hypotheses growing chunk by chunk.

    recognizer = StreamingRecognizer(trained.model, chunk_frames=16, left_chunks=16)
    for piece in pieces:                            # float32 16 kHz mono, any sizes
        if recognizer.push(piece):
            print(trained.tokenizer.processor.decode(recognizer.ids))   # a partial hypothesis
    recognizer.push(np.zeros(0, "float32"), final=True)                 # the rest, then the end

The encoder runs SpeechBrain's streaming conformer (``TransformerASR.make_streaming_context`` /
``encode_streaming``): each chunk of ``chunk_frames`` encoder frames attends to itself and the
``left_chunks`` chunks before it, as a model trained with dynamic chunks (``chunk_training: True``) learnt
to. The features come from ``StreamingFrontEnd``: each front-end frame is computed once, from enough
audio on both sides that it equals the offline frame (the Fbank's floor 80 dB under the loudest frame is
taken per window, not per recording). Hence a chunk covering a whole recording decodes it exactly as
offline greedy CTC does, and smaller chunks differ only by the context they hide.

Streaming needs what can be computed chunk by chunk: a conformer encoder, relative positions
(``attention_type: RelPosMHAXL``: absolute ones would restart at each chunk) and global feature
statistics (``normalize_type: global``: sentence statistics need the whole recording).
"""

import torch
from speechbrain.lobes.models.transformer.Conformer import ConformerEncoder
from speechbrain.utils.dynamic_chunk_training import DynChunkTrainConfig
from speechbrain.utils.filter_analysis import stack_filter_properties

from common.tokens import BLANK
from common.user_errors import UserValueError


def check_streamable(model, why):
    """Raises UserValueError (a ValueError), naming the config keys to change, when ``model`` cannot run chunk by chunk
    (``why``: what asks for streaming, for the message)."""
    problems = []
    if not isinstance(model.transformer.encoder, ConformerEncoder):
        problems.append(f"encoder_module: conformer (not {type(model.transformer.encoder).__name__})")
    if model.transformer.attention_type != "RelPosMHAXL":
        problems.append(f"attention_type: RelPosMHAXL (not {model.transformer.attention_type}: absolute positions "
                        "would restart at each chunk)")
    if model.normalize.norm_type != "global":
        problems.append(f"normalize_type: global (not {model.normalize.norm_type}: its statistics need the whole "
                        "recording)")
    if problems:
        raise UserValueError(f"{why} needs a model that streams; train one with " + "; ".join(problems))


class StreamingFrontEnd:
    """Waveform pieces → front-end frames [1, frames, channels, bins] (the conformer's input), each
    emitted once, as soon as the audio it depends on has arrived.

    Frame ``i`` covers the samples ``i * stride ± radius`` (the Fbank's window and the conv front-end's
    kernels, from SpeechBrain's filter analysis). Each call recomputes features over the new audio plus
    ``margin`` samples before it (``radius`` rounded up to whole frames) and keeps the frames whose
    context is complete, so they equal the offline ones.
    """

    def __init__(self, model):
        self.model = model
        properties = stack_filter_properties([model.compute_features, model.frontend])
        self.stride, self.radius = properties.stride, (properties.window_size - 1) // 2
        self.margin = -(-self.radius // self.stride) * self.stride
        self.samples, self.first = torch.zeros(0), 0  # kept audio and the index of its first sample
        self.emitted = 0  # frames returned so far

    @torch.no_grad()
    def push(self, samples, final=False):
        """The frames made complete by ``samples`` (1-D float tensor); with ``final``, all that remain."""
        self.samples = torch.cat([self.samples, torch.as_tensor(samples, dtype=torch.float32)])
        total = self.first + len(self.samples)
        complete = max(0, (total - 1 - self.radius) // self.stride + 1)
        if total == 0 or (complete <= self.emitted and not final):
            return None
        start = max(0, self.emitted * self.stride - self.margin)
        window = self.samples[start - self.first:][None]
        feats = self.model.normalize(self.model.compute_features(window), torch.ones(1))
        frames = self.model.frontend(feats)
        offset = start // self.stride
        last = offset + frames.shape[1] if final else complete
        out = frames[:, self.emitted - offset:last - offset]
        self.emitted = last
        keep_from = max(0, self.emitted * self.stride - self.margin)
        self.samples, self.first = self.samples[keep_from - self.first:], keep_from
        return out if out.shape[1] else None


class StreamingRecognizer:
    """Greedy CTC over a ``SpeechEncoderDecoder`` fed audio piece by piece (see the module's example).

    Arguments
    ---------
    model : common.models.SpeechEncoderDecoder
        In eval mode; must pass ``check_streamable``.
    chunk_frames : int
        Encoder frames per chunk (16 at 40 ms frames: 640 ms).
    left_chunks : int
        Chunks before the current one that its frames attend to (the encoder keeps their states).
    """

    def __init__(self, model, chunk_frames, left_chunks):
        check_streamable(model, "streaming")
        if chunk_frames < 1 or left_chunks < 0:
            raise UserValueError(f"chunk_frames={chunk_frames}, left_chunks={left_chunks}: need at least one frame "
                             "per chunk and zero or more left chunks")
        self.model, self.chunk_frames = model, chunk_frames
        self.frontend = StreamingFrontEnd(model)
        self.context = model.transformer.make_streaming_context(DynChunkTrainConfig(chunk_frames, left_chunks))
        self.pending = None  # front-end frames waiting for a full chunk
        self.ids, self.previous = [], BLANK  # the hypothesis so far; the last frame's best token

    @torch.no_grad()
    def push(self, samples, final=False):
        """Feed ``samples`` (float32 mono at the model's rate); with ``final``, the recording ends and the
        last, shorter chunk is decoded. Returns whether the hypothesis (``ids``) grew."""
        frames = self.frontend.push(samples, final)
        if frames is not None:
            self.pending = frames if self.pending is None else torch.cat([self.pending, frames], dim=1)
        before = len(self.ids)
        while self.pending is not None and (self.pending.shape[1] >= self.chunk_frames or final):
            chunk, rest = self.pending[:, :self.chunk_frames], self.pending[:, self.chunk_frames:]
            self.pending = rest if rest.shape[1] else None
            self.decode_chunk(chunk)
        return len(self.ids) > before

    def decode_chunk(self, frames):
        """One chunk through the encoder (its state carried in ``context``) and greedy CTC."""
        enc_states = self.model.transformer.encode_streaming(frames, self.context)
        for token in self.model.ctc_log_probs(enc_states)[0].argmax(dim=-1).tolist():
            if token != self.previous and token != BLANK:
                self.ids.append(token)
            self.previous = token
