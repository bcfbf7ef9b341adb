"""Dynamic bucketed batching by padded length, planned from metadata lengths.

A batch costs ``len(batch) * max(lengths)`` (its padded length: seconds for speech, tokens for text);
that cost never exceeds the budget. Lengths come from the metadata parquet, so batches are planned
before any audio is read; the planned batches are then filled from the shard stream.

How: the stream arrives in random length order and at most ``buffer_size`` utterances may be held
(read and not yet batched) at once. Each round the buffer is refilled and sorted by length; every run
of consecutive sorted items that fills a batch is a candidate, and only the best ``emit_fraction`` of
them (disjoint) are emitted. The rest wait for partners of similar length.

"Best" weighs a candidate's padding per item against how long partners of its length take to arrive.
The stream's length density ``f`` is known from the metadata. Holding items of length ``L`` until a
batch of width ``d`` fills costs about ``1 / (L d)`` held items (Little's law: ``budget / L`` items
arrive at rate ``f d``); the padding it saves is about ``f d``. Spending the buffer where it saves the
most gives ``d(L) ~ 1 / sqrt(L f(L))``, so a candidate's score is its padding per item divided by
that allowance: common lengths must batch tightly, rare ones may not wait for ever. On the benchmark
stream this halves SpeechBrain's padding at the same buffer (see ``bench/batching.py``).

A stream the buffer holds whole (a small corpus) needs no waiting: it is sorted at once and cut from a
random offset, so batch composition still varies across epochs.
"""

import bisect
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


FIRST_FILL = 64  # items read before the first round; the buffer then doubles up to ``buffer_size``
# Candidate scores are multiplied by uniform(1, 1 + SCORE_JITTER), drawn per epoch, so the same stream is
# not cut into the same batches every epoch; 0.5 costs 0.02 % padding on bench/batching.py.
SCORE_JITTER = 0.5


def sliding_windows(lengths_desc, budget, max_batch_size=None):
    """Every candidate batch of a length-sorted buffer: the items from each position down.

    Returns
    -------
    starts, ends : np.ndarray
        Candidate ``j`` is ``lengths_desc[starts[j]:ends[j]]``, as many items as its head allows.
    full : np.ndarray of bool
        Whether the buffer holds that many items from ``starts[j]`` on.
    padding_per_item : np.ndarray
        Mean padding of the candidate's items (same unit as the lengths).
    """
    sizes = batch_sizes_for_heads(lengths_desc, budget, max_batch_size)
    starts = np.arange(len(lengths_desc))
    ends = np.minimum(starts + sizes, len(lengths_desc))
    cumulative = np.concatenate([[0.0], np.cumsum(lengths_desc)])
    padding = (ends - starts) * lengths_desc - (cumulative[ends] - cumulative[starts])
    return starts, ends, ends - starts == sizes, padding / (ends - starts)


def wait_allowance(lengths, bins=64):
    """Padding per item worth accepting at each item's length: ``1 / sqrt(L f(L))`` (module docstring).

    ``f`` is the histogram density of the whole stream, which the metadata gives before reading.
    """
    counts, edges = np.histogram(lengths, bins=bins)
    density = np.maximum(counts / (len(lengths) * np.diff(edges)), 1e-12)
    bin_of_item = np.clip(np.searchsorted(edges, lengths, side="right") - 1, 0, bins - 1)
    return 1.0 / np.sqrt(lengths * density[bin_of_item])


def pick_disjoint(starts, ends, count):
    """Positions of the first ``count`` ranges (in the given order) that overlap no range picked before."""
    picked_starts, picked_ends, picked = [], [], []
    for j, (start, end) in enumerate(zip(starts, ends)):
        i = bisect.bisect_right(picked_starts, start)
        if (i and picked_ends[i - 1] > start) or (i < len(picked_starts) and picked_starts[i] < end):
            continue
        picked_starts.insert(i, start)
        picked_ends.insert(i, end)
        picked.append(j)
        if len(picked) == count:
            break
    return picked


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
        Most items held at once (larger = less padding, more memory). A longer stream's first round
        reads only ``FIRST_FILL`` items and the buffer doubles from there: a dataloader worker yields
        its first batch after 64 decodes, not ``buffer_size`` (at each epoch start), for ~0.02 % more
        padding. A stream of at most ``buffer_size`` items is sorted whole (``whole_stream_batches``).
    emit_fraction : float
        Share of the buffer's batches emitted per round, best first (0 < f <= 1); smaller = tighter
        batches and more CPU (the buffer is re-sorted more often).
    rng : np.random.Generator, optional
        Jitters the candidates' scores and shuffles the batch order within each round (batch order and
        composition vary across epochs).

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
    if not len(lengths):
        return []
    rng = rng or np.random.default_rng(0)
    if len(lengths) <= buffer_size:
        return whole_stream_batches(lengths, budget, max_batch_size, rng)
    allowance = wait_allowance(lengths)
    per_round = emit_fraction / float(np.median(batch_sizes_for_heads(lengths, budget, max_batch_size)))
    batches, held, position = [], np.empty(0, dtype=np.int64), 0
    while position < len(lengths):
        fill = min(buffer_size, max(FIRST_FILL, 2 * position))
        taken = min(fill - len(held), len(lengths) - position)
        held = np.concatenate([held, np.arange(position, position + taken)])
        position += taken
        held = held[np.argsort(-lengths[held], kind="stable")]
        ranges = best_windows(lengths[held], allowance[held], budget, max_batch_size,
                              max(1, int(len(held) * per_round)), rng)
        emitted = np.zeros(len(held), dtype=bool)
        for j in rng.permutation(len(ranges)):
            start, end = ranges[j]
            batches.append(held[start:end])
            emitted[start:end] = True
        held = held[~emitted]
    return batches + sorted_cut(held, lengths, budget, max_batch_size, rng)  # stream ended: what is left


def whole_stream_batches(lengths, budget, max_batch_size, rng):
    """A stream the buffer holds whole (a small corpus): sorted at once and cut from a random offset
    (batch composition varies across epochs), the batches in random order."""
    offset = int(rng.integers(0, batch_sizes_for_heads(lengths.max(keepdims=True), budget, max_batch_size)[0]))
    return sorted_cut(np.arange(len(lengths)), lengths, budget, max_batch_size, rng, offset)


def sorted_cut(items, lengths, budget, max_batch_size, rng, offset=0):
    """``items`` sorted by length, cut greedily from the longest (after ``offset``), in random order."""
    items = items[np.argsort(-lengths[items], kind="stable")]
    starts, ends, _ = cut_sorted(lengths[items], budget, max_batch_size, offset)
    return [items[starts[j] : ends[j]] for j in rng.permutation(len(starts))]


def best_windows(lengths_desc, allowance, budget, max_batch_size, count, rng):
    """(start, end) of up to ``count`` disjoint full candidates of a sorted buffer, best score first.

    With no full candidate (a buffer of long items whose batches need more than it holds), the
    longest items form one batch, so every round emits something.
    """
    starts, ends, full, padding_per_item = sliding_windows(lengths_desc, budget, max_batch_size)
    score = np.where(full, padding_per_item / allowance, np.inf)
    score *= rng.uniform(1.0, 1.0 + SCORE_JITTER, len(score))
    pool = min(len(score), 6 * count)  # enough candidates to find ``count`` disjoint ones
    ranked = np.argpartition(score, pool - 1)[:pool]
    ranked = ranked[np.argsort(score[ranked], kind="stable")]
    ranked = ranked[np.isfinite(score[ranked])]
    ranked_starts, ranked_ends = starts[ranked].tolist(), ends[ranked].tolist()
    picked = pick_disjoint(ranked_starts, ranked_ends, count)
    if not picked:
        return [(0, int(ends[0]))]
    return [(ranked_starts[j], ranked_ends[j]) for j in picked]


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
