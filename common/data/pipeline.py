"""Per-sample steps, each a small function configured from yaml.

Filters work on scalars or on whole metadata columns (numpy broadcasting), so the loader applies them
to the parquet before planning and never decodes audio to decide what to keep::

    filters:
        min_duration: 1.0              # s
        max_duration: 35.0             # s
        min_tokens: 1
        max_tokens: 400
        max_tokens_per_second: 30.0    # drops transcripts far too long for their audio

Tokenization, collation and features run in the dataloader workers.
"""

import itertools
import logging
import os

import numpy as np
import sentencepiece
import torch
from speechbrain.dataio.batch import PaddedBatch
from speechbrain.utils.data_utils import batch_pad_right

from common.audio_io import SAMPLE_RATE
from common.tokens import BLANK, BOS, EOS

logger = logging.getLogger(__name__)



def keep_duration(durations, min_duration=0.0, max_duration=float("inf")):
    """True where ``min_duration <= duration <= max_duration`` (seconds)."""
    return (durations >= min_duration) & (durations <= max_duration)


def keep_token_count(token_counts, min_tokens=0, max_tokens=float("inf")):
    """True where the transcript has between ``min_tokens`` and ``max_tokens`` tokens."""
    return (token_counts >= min_tokens) & (token_counts <= max_tokens)


def keep_tokens_per_second(token_counts, durations, max_tokens_per_second=float("inf")):
    """True where the transcript is not too long for its audio (tokens per second of audio)."""
    return token_counts <= max_tokens_per_second * durations


def keep_mask(durations, token_counts, filters, fastest_speed=1.0):
    """Combine the filters of a yaml ``filters`` block over metadata columns; log what was dropped.
    ``max_tokens_per_second`` holds after speed perturbation's ``fastest_speed`` shortens the audio."""
    known = {"min_duration", "max_duration", "min_tokens", "max_tokens", "max_tokens_per_second"}
    unknown = set(filters) - known
    if unknown:
        raise ValueError(f"unknown filters {sorted(unknown)}: use {sorted(known)}")
    duration_limits = {k: v for k, v in filters.items() if k.endswith("_duration")}
    token_limits = {k: v for k, v in filters.items() if k in ("min_tokens", "max_tokens")}
    rate_limit = {k: v for k, v in filters.items() if k == "max_tokens_per_second"}
    keep = keep_duration(durations, **duration_limits) & keep_token_count(token_counts, **token_limits)
    keep &= keep_tokens_per_second(token_counts, durations / fastest_speed, **rate_limit)
    logger.info("filters %s keep %d of %d samples", filters, int(keep.sum()), len(keep))
    return keep


class Tokenizer:
    """SentencePiece tokenizer loaded lazily, so it can be sent to dataloader workers by path."""

    def __init__(self, model_path):
        self.model_path = str(model_path)
        self._processor = None

    @property
    def processor(self):
        """The loaded ``sentencepiece.SentencePieceProcessor``."""
        if self._processor is None:
            self._processor = sentencepiece.SentencePieceProcessor(model_file=self.model_path)
        return self._processor

    def __getstate__(self):
        return {"model_path": self.model_path, "_processor": None}

    def encode(self, texts):
        """Token ids of one text (list of int) or of a list of texts (list of lists)."""
        return self.processor.encode(texts)

    def piece_id(self, piece):
        """Id of a user symbol such as a language tag ``<en>``; raises if the model lacks it."""
        token = self.processor.piece_to_id(piece)
        if token == self.processor.unk_id() and piece != "<unk>":
            raise ValueError(f"tokenizer {self.model_path} has no symbol {piece!r}: add it as a user symbol")
        return token


def vocab_size(model_path):
    """Number of pieces of a SentencePiece model (the model's output size); for configs:
    ``vocab_size: !apply:common.data.vocab_size [!ref <tokenizer_file>]``."""
    if not os.path.isfile(str(model_path)):
        raise FileNotFoundError(f"tokenizer_file: {model_path} does not exist: train one with "
                                "local/train_tokenizer.py (run.sh stage 1) or fix --tokenizer_file=...")
    return Tokenizer(model_path).processor.get_piece_size()


def token_fields(tokens, prefix=""):
    """``tokens``, ``tokens_bos`` (``[1] + tokens``) and ``tokens_eos`` (``tokens + [2]``) tensors: three
    views of one tensor ``[1] + tokens + [2]`` (one tensor made per sample, not three)."""
    framed = torch.tensor([BOS, *tokens, EOS], dtype=torch.long)
    return {f"{prefix}tokens": framed[1:-1], f"{prefix}tokens_bos": framed[:-1], f"{prefix}tokens_eos": framed[1:]}


def speech_sample(key, waveform, text, tokens):
    """The per-utterance dict a speech batch is collated from (``duration`` in seconds; no token
    fields when ``tokens`` is None: speech read without its text)."""
    return {"id": key, "sig": waveform, "duration": len(waveform) / SAMPLE_RATE, "text": text,
            **(token_fields(tokens) if tokens is not None else {})}


def crop_start(num_samples, max_samples, rng=None):
    """Where a crop of ``max_samples`` starts in ``num_samples``: uniform at random with ``rng``, else 0."""
    if num_samples <= max_samples or rng is None:
        return 0
    return int(rng.integers(0, num_samples - max_samples + 1))


def crop_sample(waveform, units, max_samples, start, units_per_second):
    """Waveform ``[start, start + max_samples)`` (16 kHz) and the units of the same stretch of time.

    Units at ``units_per_second`` are cut as fairseq's HuBERT dataset cuts its labels: first unit
    ``round(start / 16000 * rate)``, ``round(max_samples / 16000 * rate)`` of them, so unit ``j`` of the
    crop is still the unit of its time. ``units`` may be None (BEST-RQ: codes come from the audio).
    Shorter waveforms are returned unchanged.
    """
    if len(waveform) <= max_samples:
        return waveform, units
    waveform = waveform[start:start + max_samples]
    if units is None:
        return waveform, None
    first = int(round(start / SAMPLE_RATE * units_per_second))
    return waveform, units[first:first + int(round(max_samples / SAMPLE_RATE * units_per_second))]


def pad_right(tensors, value=0):
    """SpeechBrain's ``batch_pad_right`` (the same padded tensor and relative lengths) in one
    ``pad_sequence`` call for 1-D tensors (tokens, waveforms), about 2x faster on the loaders' batches
    (``bench/collate.py``); other shapes go to SpeechBrain's."""
    if len(tensors) < 2 or any(tensor.ndim != 1 for tensor in tensors):
        return batch_pad_right(tensors, value=value)
    padded = torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True, padding_value=value)
    return padded, torch.tensor([len(tensor) / padded.shape[1] for tensor in tensors])


def pad_id_lists(sequences, value=BLANK, prefix=None, suffix=None):
    """``(padded [n, width] long tensor, relative lengths)`` of token id lists (or arrays), each with
    ``prefix`` before and ``suffix`` after it when given: what ``batch_pad_right`` makes of the tensors
    ``[prefix] + ids + [suffix]``, built in numpy at once instead of a tensor per sentence."""
    counts = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    start = int(prefix is not None)
    lengths = counts + start + int(suffix is not None)
    width = int(lengths.max())
    padded = np.full((len(sequences), width), value, dtype=np.int64)
    columns = np.arange(width)
    inside = (columns >= start) & (columns < start + counts[:, None])
    if isinstance(sequences[0], np.ndarray):  # cached ids (common/data/text.py): one copy, not one per id
        padded[inside] = np.concatenate(sequences)
    else:
        padded[inside] = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64, count=int(counts.sum()))
    if prefix is not None:
        padded[:, 0] = prefix
    if suffix is not None:
        padded[np.arange(len(sequences)), lengths - 1] = suffix
    return torch.from_numpy(padded), torch.from_numpy(lengths / width).float()


TEXT_FIELDS = ("src_tokens", "tokens", "tokens_bos", "tokens_eos")  # the padded fields of a text batch


def text_batch(keys, texts, sources, targets):
    """The ``PaddedBatch`` a text loader yields (``id``, ``text``, ``src_tokens``, ``tokens``, ``tokens_bos``,
    ``tokens_eos``) from token id lists, padded by ``pad_id_lists`` (equal to padding per-sentence tensors
    made by ``token_fields``)."""
    samples = [{"id": key, "text": text, "src_tokens": src, "tokens": tgt, "tokens_bos": tgt, "tokens_eos": tgt}
               for key, text, src, tgt in zip(keys, texts, sources, targets)]
    padded = list(TEXT_FIELDS)
    return PaddedBatch(samples, padded_keys=padded, device_prep_keys=padded, padding_func=pad_id_lists,
                       per_key_padding_kwargs={"tokens_bos": {"prefix": BOS}, "tokens_eos": {"suffix": EOS}},
                       apply_default_convert=False)


def padded_batch(samples):
    """``PaddedBatch`` of per-sample dicts, tensors padded with 0 (the blank) by ``pad_right``."""
    return PaddedBatch(samples, padding_func=pad_right, padding_kwargs={"value": BLANK})


def collate(samples, features=None):
    """Pad samples into a ``PaddedBatch`` (pad value 0).

    With ``features`` (e.g. ``speechbrain.lobes.features.Fbank``) each waveform is replaced by its
    features ``feats``, computed in the worker before padding (no frames computed for padding, one
    padding pass). The waveform is dropped: nothing downstream reads it, and handing it to the main
    process as well would double the bytes copied through shared memory.
    """
    if features is not None:
        with torch.no_grad():
            samples = [with_features(sample, features) for sample in samples]
    return padded_batch(samples)


def with_features(sample, features):
    """The sample with ``feats`` of its waveform in place of ``sig``."""
    fields = {name: value for name, value in sample.items() if name != "sig"}
    return {**fields, "feats": features(sample["sig"][None])[0]}


def speech_input(batch):
    """What a speech batch feeds the model: ``(feats, lengths)`` when the loader computed features,
    else ``(sig, lengths)`` (waveforms; the model computes them)."""
    feats = getattr(batch, "feats", None)
    return feats if feats is not None else batch.sig


def count_tokens(tokenizer, texts):
    """Token count of each text (numpy int array)."""
    return np.fromiter((len(t) for t in tokenizer.encode(list(texts))), dtype=np.int64, count=len(texts))
