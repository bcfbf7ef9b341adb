"""common/data/batching.py: padded budget, completeness, buffer bound, padding quality."""

import random

import numpy as np
import pytest
from speechbrain.dataio.iterators import dynamic_bucketed_batch

from common.data.batching import (
    buffered_batches,
    padding_percent,
    pick_disjoint,
    sorted_oracle_batches,
    wait_allowance,
)


def librispeech_like(count, seed=0):
    """Lognormal lengths, median 12 s, clipped to 1-35 s."""
    return np.clip(np.random.default_rng(seed).lognormal(np.log(12), 0.5, count), 1, 35)


@pytest.mark.parametrize("max_batch_size,buffer_size,emit_fraction", [(None, 1024, 0.25), (8, 64, 1.0), (3, 16, 0.1)])
def test_every_item_once_and_budget_never_exceeded(max_batch_size, buffer_size, emit_fraction):
    """Each stream index is in exactly one batch; size x longest <= budget; size <= max_batch_size."""
    lengths = librispeech_like(3000)
    batches = buffered_batches(lengths, 200.0, max_batch_size, buffer_size, emit_fraction)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    assert all(len(b) * lengths[b].max() <= 200.0 for b in batches)
    assert all(len(b) <= (max_batch_size or len(lengths)) for b in batches)


def test_buffer_never_holds_more_than_buffer_size():
    """Replaying the stream, items read but not yet emitted never exceed buffer_size."""
    lengths = librispeech_like(5000, seed=1)
    batches = buffered_batches(lengths, 200.0, buffer_size=256)
    read = emitted = 0
    for batch in batches:
        read = max(read, int(batch.max()) + 1)
        assert read - emitted <= 256
        emitted += len(batch)


def test_first_batch_needs_only_the_first_fill():
    """A worker's first batch is made of the stream's first 64 items (not a whole buffer's worth), so
    training starts after 64 decodes at each epoch start."""
    lengths = librispeech_like(5000, seed=5)
    first = buffered_batches(lengths, 200.0, buffer_size=1024)[0]
    assert first.max() < 64


def test_padding_is_lower_than_speechbrain_at_the_same_buffer():
    """At buffer 1024, padding is at most 0.6 x SpeechBrain's dynamic_bucketed_batch, batches within 1 % of a
    global sort."""
    lengths = librispeech_like(8000, seed=2)
    ours = buffered_batches(lengths, 200.0, buffer_size=1024)
    rng = random.Random(0)
    theirs = list(dynamic_bucketed_batch(
        [{"i": i, "n": int(x * 16000)} for i, x in enumerate(lengths)], len_key="n", len_fn=None,
        buffersize=1024, collate_fn=lambda items: np.array([item["i"] for item in items]),
        sampler_kwargs={"target_batch_numel": 200 * 16000, "max_batch_numel": 200 * 16000,
                        "randint_generator": rng.randint}))
    assert padding_percent(lengths, ours) < 0.6 * padding_percent(lengths, theirs)
    assert len(ours) <= 1.01 * len(sorted_oracle_batches(lengths, 200.0))


def test_rare_lengths_may_wait_less_tightly_than_common_ones():
    """The padding allowance 1 / sqrt(L f(L)) grows where lengths are rare (the tails)."""
    lengths = librispeech_like(20000, seed=4)
    allowance = wait_allowance(lengths)
    at = lambda seconds: allowance[np.argmin(np.abs(lengths - seconds))]  # noqa: E731
    assert at(2.0) > 2 * at(12.0) and at(30.0) > 2 * at(12.0)


def test_picked_windows_are_disjoint_and_best_first():
    """Ranges are taken in the given order, skipping any that overlaps one already taken."""
    starts, ends = [4, 0, 2, 8, 6], [6, 3, 5, 10, 8]
    assert pick_disjoint(starts, ends, count=10) == [0, 1, 3, 4]
    assert pick_disjoint(starts, ends, count=2) == [0, 1]


def test_order_and_composition_change_with_the_rng():
    """Different generators (epochs) give a different batch order; the same generator the same batches."""
    lengths = librispeech_like(2000, seed=3)
    run = lambda seed: [b.tolist() for b in buffered_batches(lengths, 200.0, rng=np.random.default_rng(seed))]  # noqa: E731
    assert run(0) == run(0)
    assert run(0) != run(1)


def test_composition_varies_across_epochs_when_the_buffer_holds_the_whole_stream():
    """A small corpus held whole (1000 short utterances, buffer 4096) is not cut into the same batches
    every epoch: under 80 % of the pairs batched together in one epoch are together in the next."""
    lengths = np.clip(np.random.default_rng(6).lognormal(np.log(2.7), 0.3, 1000), 0.5, 10)

    def pairs(seed):
        batches = buffered_batches(lengths, 60.0, 32, buffer_size=4096, rng=np.random.default_rng(seed))
        return {(a, b) for batch in batches for a in batch.tolist() for b in batch.tolist() if a < b}

    first, second = pairs(0), pairs(1)
    assert len(first & second) < 0.8 * len(first)


def test_an_item_longer_than_the_budget_is_refused_with_the_fix():
    """The error names the budget, the longest item and what to change."""
    with pytest.raises(ValueError, match="smaller than the longest item.*raise the batch budget"):
        buffered_batches(np.array([1.0, 40.0]), 30.0)
