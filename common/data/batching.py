"""Dynamic bucketed batching by padded length, planned from metadata lengths.

A batch costs ``len(batch) * max(lengths)`` (its padded length: seconds for speech, tokens for text);
that cost never exceeds the budget. Lengths come from the metadata parquet, so batches are planned
before any audio is read; the planned batches are then filled from the shard stream.

Why a rolling sorted buffer that emits only its tightest batches: the stream arrives in random length
order and at most ``buffer_size`` utterances may be held (decoded) at once. A buffer sorted by length
and cut into full batches from the long end gives batches of near-equal lengths; emitting only the
``emit_fraction`` of those batches with the least padding and keeping the rest lets utterances of rare
lengths wait for partners, so padding falls below SpeechBrain's random-pivot sampler at the same
buffer (see ``bench/batching.py``). Batches that are not full (fewer utterances than the budget
allows) are never emitted before the stream ends, so the batch count stays within ~1 % of a global
sort. Smaller ``emit_fraction`` = tighter batches, more CPU (the buffer is re-sorted more often).
"""

import logging

import numpy as np

logger = logging.getLogger(__name__)


def check_budget(lengths, budget, unit="s"):
    """Raise if an item alone is longer than the padded budget (it could never be batched).

    Arguments
    ---------
    lengths : np.ndarray
        Item lengths (seconds or tokens).
    budget : float
        Padded budget of one batch, same unit.
    unit : str
        Unit name used in the error message.
    """
    if len(lengths) and lengths.max() > budget:
        raise ValueError(
            f"budget={budget} {unit} is smaller than the longest item ({lengths.max():.2f} {unit}): "
            f"raise the batch budget or lower the maximum length filter"
        )


def batch_sizes_for_heads(head_lengths, budget, max_batch_size=None):
    """How many items fit in a batch whose longest item has each given length.

    Returns an int array ``k`` with ``k * head <= budget`` (at least 1, at most ``max_batch_size``).
    """
    sizes = np.floor(budget / head_lengths).astype(np.int64)
    sizes -= sizes * head_lengths > budget  # float rounding must never exceed the budget
    if max_batch_size is not None:
        sizes = np.minimum(sizes, max_batch_size)
    return np.maximum(sizes, 1)


def cut_sorted(lengths_desc, budget, max_batch_size=None, offset=0):
    """Cut lengths sorted in descending order into consecutive batches, each as full as allowed.

    A non-zero ``offset`` makes the first batch ``lengths_desc[:offset]`` (not full) and shifts every
    later cut, so the same lengths are grouped differently (batch composition varies across epochs).

    Returns
    -------
    starts, ends : np.ndarray
        Batch ``j`` is ``lengths_desc[starts[j]:ends[j]]``; its first item is its longest.
    full : np.ndarray of bool
        Whether batch ``j`` holds as many items as its longest item allows.
    """
    sizes = batch_sizes_for_heads(lengths_desc, budget, max_batch_size)
    starts = [0] if 0 < offset < len(lengths_desc) else []
    start, n = (offset if starts else 0), len(lengths_desc)
    while start < n:
        starts.append(start)
        start += int(sizes[start])
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.append(starts[1:], n)
    return starts, ends, (ends - starts) == sizes[starts]


def padding_ratios(lengths_desc, starts, ends):
    """Fraction of each batch's padded length that is padding (0 = no padding)."""
    cumulative = np.concatenate([[0.0], np.cumsum(lengths_desc)])
    padded = (ends - starts) * lengths_desc[starts]
    return 1.0 - (cumulative[ends] - cumulative[starts]) / padded


def buffered_batches(
    lengths, budget, max_batch_size=None, buffer_size=1024, emit_fraction=0.25, rng=None
):
    """Plan batches over a stream of lengths, holding at most ``buffer_size`` items at once.

    Arguments
    ---------
    lengths : np.ndarray
        Length of each item in stream order (seconds or tokens).
    budget : float
        Padded budget per batch (``len(batch) * max length``), never exceeded.
    max_batch_size : int, optional
        Most items per batch.
    buffer_size : int
        Most items held at once (larger = less padding, more memory).
    emit_fraction : float
        Share of the buffer's full batches emitted per round, tightest first (0 < f <= 1).
    rng : np.random.Generator, optional
        Shuffles the batch order within each round (batch order varies across epochs).

    Returns
    -------
    list of np.ndarray
        Item indices (into ``lengths``) of each batch, in emission order. Every batch's items
        were all in the buffer when it was emitted, so a stream reader can yield it in this order.

    Example
    -------
    >>> batches = buffered_batches(np.array([3.0, 1.0, 2.9, 1.1]), budget=6.0)
    >>> sorted(sorted(b.tolist()) for b in batches)
    [[0, 2], [1, 3]]
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    check_budget(lengths, budget)
    if not 0 < emit_fraction <= 1:
        raise ValueError(f"emit_fraction={emit_fraction} must be in (0, 1]")
    rng = rng or np.random.default_rng(0)
    batches, held, position = [], np.empty(0, dtype=np.int64), 0
    while position < len(lengths) or len(held):
        taken = min(buffer_size - len(held), len(lengths) - position)
        held = np.concatenate([held, np.arange(position, position + taken)])
        position += taken
        held = held[np.argsort(-lengths[held], kind="stable")]
        offset = int(rng.integers(0, batch_sizes_for_heads(lengths[held[:1]], budget, max_batch_size)[0]))
        starts, ends, full = cut_sorted(lengths[held], budget, max_batch_size, offset)
        if position >= len(lengths):  # stream ended: flush everything
            chosen = np.arange(len(starts))
        else:
            chosen = choose_tightest(lengths[held], starts, ends, full, emit_fraction)
        emitted = np.zeros(len(held), dtype=bool)
        for j in rng.permutation(chosen):
            batches.append(held[starts[j] : ends[j]])
            emitted[starts[j] : ends[j]] = True
        held = held[~emitted]
    return batches


def choose_tightest(lengths_desc, starts, ends, full, emit_fraction):
    """Indices of the full batches with the least padding (at least one batch, so rounds progress)."""
    ratios = np.where(full, padding_ratios(lengths_desc, starts, ends), np.inf)
    count = max(1, int(full.sum() * emit_fraction))
    return np.argsort(ratios, kind="stable")[:count]


def sorted_oracle_batches(lengths, budget, max_batch_size=None):
    """Reference: sort all lengths at once (unbounded buffer) and cut greedily from the long end."""
    lengths = np.asarray(lengths, dtype=np.float64)
    check_budget(lengths, budget)
    order = np.argsort(-lengths, kind="stable")
    starts, ends, _ = cut_sorted(lengths[order], budget, max_batch_size)
    return [order[s:e] for s, e in zip(starts, ends)]


def padding_percent(lengths, batches):
    """Padding as a percentage of all padded length over the given batches."""
    padded = sum(len(b) * lengths[b].max() for b in batches)
    real = sum(lengths[b].sum() for b in batches)
    return 100.0 * (padded - real) / padded
