"""Span masking of frames for masked prediction (HuBERT / wav2vec 2.0 style).

Each utterance of ``n`` frames gets ``mask_prob * n / span_length`` spans of ``span_length`` frames
(rounded up or down at random, so the expected masked share is exactly ``mask_prob``), placed
uniformly at random without overlapping (adjacent spans may touch). HuBERT's 80 % starts of 10-frame
spans, which overlap, mask about 65 % of its 20 ms frames; here ``mask_prob`` is the masked share.

>>> rng = np.random.default_rng(0)
>>> mask = mask_spans(torch.tensor([100, 60]), 100, mask_prob=0.5, span_length=10, rng=rng)
>>> mask.shape, int(mask[1, 60:].sum())
(torch.Size([2, 100]), 0)
"""

import numpy as np
import torch


def num_spans(length, mask_prob, span_length, rng, min_spans=1):
    """How many spans to mask in ``length`` frames: ``mask_prob * length / span_length`` rounded at
    random (expectation exact), at least ``min_spans``, at most as many as fit without overlap."""
    if not 0.0 <= mask_prob <= 1.0:
        raise ValueError(f"mask_prob={mask_prob} must lie in [0, 1] (the share of frames masked)")
    if span_length < 1:
        raise ValueError(f"span_length={span_length} must be at least 1 frame")
    exact = mask_prob * length / span_length
    count = int(np.floor(exact + rng.random()))
    count = max(count, min_spans if mask_prob > 0 else 0)
    return min(count, length // span_length)


def span_starts(length, count, span_length, rng):
    """Start frames of ``count`` non-overlapping spans, uniform over all such placements.

    Stars and bars: choosing ``count`` distinct slots among ``length - count * (span_length - 1)``
    and shifting the ``i``-th by ``i * (span_length - 1)`` enumerates every placement exactly once.
    """
    slots = length - count * (span_length - 1)
    chosen = np.sort(rng.choice(slots, size=count, replace=False))
    return chosen + np.arange(count) * (span_length - 1)


def mask_spans(lengths, max_length, mask_prob, span_length, rng, min_spans=1):
    """Boolean masks of spans over a padded batch of frame sequences.

    Arguments
    ---------
    lengths : torch.Tensor or sequence of int
        Valid frames of each utterance (frames past them are never masked).
    max_length : int
        Padded frames of the batch.
    mask_prob : float
        Expected share of each utterance's frames that are masked.
    span_length : int
        Frames per span (e.g. 10 frames of 20 ms in HuBERT; ~200-400 ms is the usual span).
    rng : np.random.Generator
        Seeded by the caller (e.g. from seed, epoch and step) for reproducible masks.
    min_spans : int
        Spans an utterance gets at least (when it is long enough), so every utterance is trained.

    Returns
    -------
    torch.BoolTensor
        [batch, max_length], True on masked frames.
    """
    lengths = [int(n) for n in lengths]
    mask = np.zeros((len(lengths), max_length), dtype=bool)
    for row, length in enumerate(lengths):
        count = num_spans(length, mask_prob, span_length, rng, min_spans)
        for start in span_starts(length, count, span_length, rng):
            mask[row, start : start + span_length] = True
    return torch.from_numpy(mask)
