"""Streaming recognition with a finetuned model: audio in pieces, encoder state carried across chunks,
hypotheses growing chunk by chunk (greedy CTC, or CTC prefix beam search with attention rescoring).

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

``StreamingBeamRecognizer`` searches as WeNet's U2++ runtime does: SpeechBrain's ``CTCPrefixBeamSearcher``
extends its n-best frame by frame on each chunk (partial hypotheses: the best prefix), an ``Endpointer``
(WeNet's silence rules on the CTC blank) closes a segment, and at the segment's end (or the recording's)
the attention decoder, and the language model when there is one, rescore the n-best over the segment's
encoder states with the weights of the offline joint search.

Streaming needs what can be computed chunk by chunk: a conformer encoder, relative positions
(``attention_type: RelPosMHAXL``: absolute ones would restart at each chunk) and feature statistics
that stream (``normalize_type: causal``, ``global`` or ``frame``: sentence statistics need the whole
recording).
"""

import functools
import math
from dataclasses import dataclass

import torch
from speechbrain.decoders.ctc import CTCBeam, CTCPrefixBeamSearcher
from speechbrain.lobes.models.transformer.Conformer import ConformerEncoder
from speechbrain.utils.dynamic_chunk_training import DynChunkTrainConfig
from speechbrain.utils.filter_analysis import stack_filter_properties

from common.models.normalization import STREAMING_TYPES
from common.tokens import BLANK, BOS, EOS
from common.user_errors import UserValueError

TOKEN_CHARACTERS = 0xE000  # Unicode's private use area: token id i is chr(TOKEN_CHARACTERS + i) in the CTC beams


def check_streamable(model, why):
    """Raises UserValueError (a ValueError), naming the config keys to change, when ``model`` cannot run chunk by chunk
    (``why``: what asks for streaming, for the message)."""
    problems = []
    if not isinstance(model.transformer.encoder, ConformerEncoder):
        problems.append(f"encoder_module: conformer (not {type(model.transformer.encoder).__name__})")
    if model.transformer.attention_type != "RelPosMHAXL":
        problems.append(f"attention_type: RelPosMHAXL (not {model.transformer.attention_type}: absolute positions "
                        "would restart at each chunk)")
    kind = getattr(model.normalize, "kind", model.normalize.norm_type)
    if kind not in STREAMING_TYPES:
        problems.append(f"normalize_type: causal, global or frame (not {kind}: its statistics need the whole "
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
        self.causal = getattr(model.normalize, "kind", None) == "causal"
        stft = model.compute_features.compute_STFT
        self.hop, self.half_window = stft.hop_length, stft.n_fft // 2
        # causal statistics: sums[k] = (count, sum, sum of squares) of the Fbank frames before frame
        # sums_base + k, each frame counted once, when its samples have all arrived
        self.sums, self.sums_base = [(0, 0.0, 0.0)], 0

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
        if self.causal:
            feats = self.causal_features(window, start, total, final)
        else:
            feats = self.model.normalize(self.model.compute_features(window), torch.ones(1))
        frames = self.model.frontend(feats)
        offset = start // self.stride
        last = offset + frames.shape[1] if final else complete
        out = frames[:, self.emitted - offset:last - offset]
        self.emitted = last
        keep_from = max(0, self.emitted * self.stride - self.margin)
        self.samples, self.first = self.samples[keep_from - self.first:], keep_from
        return out if out.shape[1] else None


    def causal_features(self, window, start, total, final):
        """Fbank frames of ``window`` (its first sample ``start``; ``total`` samples so far) normalized
        with the causal statistics of the whole recording: the sums of the frames before the window's
        first exact frame (one whose STFT window lies inside the audio the window holds), then the window's
        own. Frames before it feed no frame this call emits; frames complete now join the sums."""
        raw = self.model.compute_features(window)
        first = start // self.hop  # the Fbank frame at the window's start
        exact = first if start == 0 else first + -(-self.half_window // self.hop)
        feats = self.model.normalize.causal(raw, self.sums[exact - self.sums_base], first=exact - first)
        known = self.sums_base + len(self.sums) - 1  # frames counted so far
        last = first + raw.shape[1] if final else max(known, (total - self.half_window) // self.hop + 1)  # complete
        for frame in raw[0, known - first:last - first].double():
            count, total_sum, squares = self.sums[-1]
            self.sums.append((count + 1, total_sum + frame, squares + frame.square()))
        keep = max(0, first - self.sums_base)  # later windows start no earlier than this one
        self.sums, self.sums_base = self.sums[keep:], self.sums_base + keep
        return feats


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
        self.finals = []  # the ids of each closed segment (greedy CTC closes none)

    @torch.no_grad()
    def push(self, samples, final=False):
        """Feed ``samples`` (float32 mono at the model's rate); with ``final``, the recording ends and the
        last, shorter chunk is decoded. Returns whether the hypothesis (``ids``) changed."""
        frames = self.frontend.push(samples, final)
        if frames is not None:
            self.pending = frames if self.pending is None else torch.cat([self.pending, frames], dim=1)
        before = list(self.ids)
        while self.pending is not None and (self.pending.shape[1] >= self.chunk_frames or final):
            chunk, rest = self.pending[:, :self.chunk_frames], self.pending[:, self.chunk_frames:]
            self.pending = rest if rest.shape[1] else None
            self.decode_chunk(chunk)
        if final:
            self.finish()
        return self.ids != before

    def finish(self):
        """The recording has ended (greedy CTC has nothing left to do)."""

    def decode_chunk(self, frames):
        """One chunk through the encoder (its state carried in ``context``) and greedy CTC."""
        enc_states = self.model.transformer.encode_streaming(frames, self.context)
        for token in self.model.ctc_log_probs(enc_states)[0].argmax(dim=-1).tolist():
            if token != self.previous and token != BLANK:
                self.ids.append(token)
            self.previous = token


@dataclass
class Endpointer:
    """WeNet's endpoint rules (runtime ``CtcEndpoint``), checked after each chunk: a frame is silent when
    its CTC blank probability exceeds ``blank_threshold``; a segment ends after ``no_speech_ms`` of silence
    with nothing decoded, after ``trailing_silence_ms`` of silence once something is decoded, or when it
    has lasted ``max_segment_ms`` with something decoded (WeNet's defaults: 0.8, 5 s, 1 s, 20 s)."""

    frame_ms: float
    blank_threshold: float = 0.8
    no_speech_ms: float = 5000.0
    trailing_silence_ms: float = 1000.0
    max_segment_ms: float = 20000.0

    def __post_init__(self):
        self.reset()

    def reset(self):
        self.frames, self.trailing = 0, 0  # frames in the segment; silent frames at its end

    def step(self, blank_log_probs, decoded):
        """Counts a chunk's frames (their blank log-probabilities, 1-D); whether the segment ends here
        (``decoded``: the segment's best hypothesis is not empty)."""
        for silent in (blank_log_probs > math.log(self.blank_threshold)).tolist():
            self.trailing = self.trailing + 1 if silent else 0
        self.frames += len(blank_log_probs)
        silence_ms, length_ms = self.trailing * self.frame_ms, self.frames * self.frame_ms
        if not decoded:
            return silence_ms >= self.no_speech_ms
        return silence_ms >= self.trailing_silence_ms or length_ms >= self.max_segment_ms


class StreamingBeamRecognizer(StreamingRecognizer):
    """CTC prefix beam search chunk by chunk, the n-best rescored by the attention decoder (and the LM) at
    each endpoint and at the end (see the module's docstring). ``ids`` is the text so far: the rescored
    segments, then the best prefix of the open segment.

    Arguments
    ---------
    model, chunk_frames, left_chunks : as ``StreamingRecognizer``.
    beam_size : int
        Prefixes kept by the CTC search, all rescored.
    ctc_weight : float
        The rescoring score: ``ctc_weight * log p_ctc + (1 - ctc_weight) * log p_attention``
        (+ ``lm_weight * log p_lm``), over the hypothesis and </s>, as the offline joint search.
    length_normalization : bool
        Rank by that score divided by the number of scored tokens (the offline search's setting).
    lm, lm_weight : a ``recipes/lm`` model over the same pieces and its weight (None / 0: none).
    prefix_ids : token ids given to the decoder after <s> and not scored (a target-language tag).
    endpointer : Endpointer, optional
        Default: WeNet's rules at the model's frame rate; None of its rules fires before the end when
        its thresholds are infinite.
    """

    def __init__(self, model, chunk_frames, left_chunks, beam_size=10, ctc_weight=0.5, length_normalization=True,
                 lm=None, lm_weight=0.0, prefix_ids=(), endpointer=None):
        super().__init__(model, chunk_frames, left_chunks)
        self.ctc_weight, self.length_normalization = ctc_weight, length_normalization
        self.lm, self.lm_weight, self.prefix_ids = lm, lm_weight, list(prefix_ids)
        self.searcher = prefix_searcher(model.ctc_lin.w.out_features, beam_size)
        self.endpointer = endpointer or Endpointer(frame_ms=1000.0 / model.frames_per_second())
        self.start_segment()

    def start_segment(self):
        self.beams = [start_beam()]
        self.segment_states, self.segment_frames = [], 0
        self.endpointer.reset()

    def decode_chunk(self, frames):
        """One chunk through the encoder and the CTC prefix search; an endpoint closes the segment."""
        enc_states = self.model.transformer.encode_streaming(frames, self.context)
        log_probs = ctc_search_log_probs(self.model, enc_states)
        self.beams = self.searcher.partial_decoding(log_probs.numpy(), len(log_probs), self.beams, {}, {},
                                                    processed_frames=self.segment_frames)
        self.segment_states.append(enc_states)
        self.segment_frames += len(log_probs)
        best = text_ids(self.beams[0].text)
        self.ids = [token for segment in self.finals for token in segment] + best
        if self.endpointer.step(log_probs[:, BLANK], bool(best)):
            self.end_segment()

    def finish(self):
        if self.segment_frames:
            self.end_segment()

    def end_segment(self):
        """Rescore the segment's n-best, keep the best, start a new segment."""
        nbest, ctc_scores = finished_nbest(self.searcher, self.beams)
        if nbest:
            scores = self.rescore(nbest, torch.tensor(ctc_scores))
            self.finals.append(nbest[int(scores.argmax())])
        self.ids = [token for segment in self.finals for token in segment]
        self.start_segment()

    def rescore(self, nbest, ctc_scores):
        """Joint scores [n] of the hypotheses ``nbest`` (id lists) over the open segment's encoder states."""
        return rescore(self.model, torch.cat(self.segment_states, dim=1), nbest, ctc_scores, self.ctc_weight,
                       self.length_normalization, self.lm, self.lm_weight, self.prefix_ids)


def ctc_search_log_probs(model, enc_states):
    """CTC log-probabilities [frames, vocab] of one recording's encoder states [1, frames, d_model] as the
    prefix search reads them: <s> and </s>, never CTC targets, kept out of the beams."""
    log_probs = model.ctc_log_probs(enc_states)[0]
    log_probs[:, [BOS, EOS]] = -math.inf
    return log_probs


def start_beam():
    """The CTC prefix search's first beam: the empty prefix, probability 1, ending in blank."""
    return CTCBeam(text="", full_text="", next_word="", partial_word="", last_token=None, last_token_index=None,
                   text_frames=[], partial_frames=(-1, -1), score=0.0, score_ctc=0.0, p_b=0.0)


def text_ids(text):
    """The token ids a prefix's text stands for (see ``prefix_searcher``)."""
    return [ord(character) - TOKEN_CHARACTERS for character in text]


def finished_nbest(searcher, beams):
    """``(nbest, ctc_scores)``: the searcher's final hypotheses (id lists, not empty), best first, and their
    CTC log-probabilities."""
    nbest, ctc_scores = [], []
    for beam in searcher.finalize_decoding(beams, {}, {}, force_next_word=True, is_end=True):
        ids = text_ids(beam.text)
        if ids and ids not in nbest:
            nbest.append(ids)
            ctc_scores.append(beam.score)
    return nbest, ctc_scores


def rescore(model, enc_states, nbest, ctc_scores, ctc_weight, length_normalization, lm=None, lm_weight=0.0,
            prefix_ids=()):
    """Joint scores [n] of the hypotheses ``nbest`` (id lists) of one recording (encoder states [1, frames,
    d_model]; ``ctc_scores`` [n] their CTC log-probabilities): ``ctc_weight * CTC + (1 - ctc_weight) *
    attention (+ lm_weight * LM)`` log-probabilities of each hypothesis and </s>, the decoder given <s> and
    ``prefix_ids`` first; divided by the tokens scored with ``length_normalization``."""
    n, prefix = len(nbest), [BOS] + list(prefix_ids)
    lengths = torch.tensor([len(ids) + 1 for ids in nbest])  # the scored tokens: the hypothesis and </s>
    inputs = torch.full((n, len(prefix) + int(lengths.max()) - 1), EOS, dtype=torch.long)
    targets = torch.full((n, int(lengths.max())), EOS, dtype=torch.long)
    for row, ids in enumerate(nbest):
        inputs[row, :len(prefix) + len(ids)] = torch.tensor(prefix + ids)
        targets[row, :len(ids) + 1] = torch.tensor(ids + [EOS])
    scored = torch.arange(targets.shape[1])[None] < lengths[:, None]
    enc_states = enc_states.expand(n, -1, -1)
    dec_states, _ = model.transformer.decode(inputs, enc_states, torch.full((n,), enc_states.shape[1]))
    att = torch.log_softmax(model.seq_lin(dec_states), dim=-1)[:, len(prefix) - 1:]
    scores = ctc_weight * ctc_scores + (1.0 - ctc_weight) * token_log_probs(att, targets, scored)
    if lm is not None and lm_weight > 0.0:
        logits = lm(torch.cat([torch.full((n, 1), BOS), inputs[:, len(prefix):]], dim=1))
        logits = logits[0] if isinstance(logits, tuple) else logits
        scores = scores + lm_weight * token_log_probs(torch.log_softmax(logits, dim=-1), targets, scored)
    return scores / lengths if length_normalization else scores


@functools.lru_cache(maxsize=8)
def prefix_searcher(vocab_size, beam_size):
    """SpeechBrain's CTC prefix beam searcher returning ``beam_size`` hypotheses over ``vocab_size`` tokens
    (it holds settings only, so recognizers share it). It keeps prefixes as text: one private-use character
    per token id makes that text the id sequence itself (no piece is read as a word boundary; its "space" is
    the blank, which is never appended)."""
    vocab = [chr(TOKEN_CHARACTERS + i) for i in range(vocab_size)]
    return CTCPrefixBeamSearcher(blank_index=BLANK, vocab_list=vocab, space_token=vocab[BLANK], beam_size=beam_size,
                                 prune_history=False, topk=beam_size)


def token_log_probs(log_probs, targets, mask):
    """Sum over each row of ``log_probs`` [n, steps, vocab] at ``targets`` [n, steps] where ``mask``."""
    steps = targets.shape[1]
    picked = log_probs[:, :steps].gather(-1, targets[..., None])[..., 0]
    return (picked * mask).sum(dim=1)
