"""common/data/planning.py: rank balance, completeness, determinism, few-shard handling."""

import numpy as np
import pytest

from common.data.planning import batches_to_skip, interleaved_order, plan_epoch


def uneven_corpus(num_shards, seed):
    """Durations (1-20 s) and tar-ordered shard index of each row; shards of 5-120 utterances."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(5, 120, num_shards)
    shard_of_row = np.repeat(np.arange(num_shards), sizes)
    return rng.uniform(1, 20, len(shard_of_row)), shard_of_row


@pytest.mark.parametrize("world_size", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_slot_yields_the_same_number_of_batches_and_rows_are_used_once(world_size, workers, seed):
    """For uneven shards, all ranks x workers have equal batch counts; each row is in one batch."""
    lengths, shard_of_row = uneven_corpus(40, seed)
    plan = plan_epoch(lengths, shard_of_row, seed, 0, world_size, workers, budget=60.0)
    counts = {len(slot.batches) for rank in plan for slot in rank}
    assert len(counts) == 1 and len(plan) == world_size
    rows = np.concatenate([b for rank in plan for slot in rank for b in slot.batches])
    assert sorted(rows.tolist()) == list(range(len(lengths)))


def test_ranks_get_near_equal_audio():
    """Audio per rank differs by less than the largest shard (whole shards, longest first)."""
    lengths, shard_of_row = uneven_corpus(60, 3)
    plan = plan_epoch(lengths, shard_of_row, 0, 0, 4, 2, budget=60.0)
    audio = [sum(lengths[b].sum() for slot in rank for b in slot.batches) for rank in plan]
    largest_shard = np.bincount(shard_of_row, weights=lengths).max()
    assert max(audio) - min(audio) <= largest_shard


def test_plan_is_a_function_of_seed_and_epoch():
    """Same (seed, epoch) -> identical batches; another epoch -> another order and composition."""
    lengths, shard_of_row = uneven_corpus(20, 4)
    keys = lambda epoch: [b.tolist() for b in interleaved_order(  # noqa: E731
        plan_epoch(lengths, shard_of_row, 7, epoch, 2, 2, budget=60.0)[0])]
    assert keys(0) == keys(0)
    assert keys(0) != keys(1)
    assert sorted(map(sorted, keys(0))) != sorted(map(sorted, keys(1)))


def test_fewer_shards_than_ranks_times_workers_uses_fewer_workers():
    """3 shards for 2 ranks x 2 workers: one worker per rank (documented fallback)."""
    lengths, shard_of_row = uneven_corpus(3, 5)
    plan = plan_epoch(lengths, shard_of_row, 0, 0, 2, 2, budget=60.0)
    assert [len(rank) for rank in plan] == [1, 1]


def test_fewer_shards_than_ranks_is_refused_with_the_fix():
    """2 shards cannot feed 3 ranks: the error says to write more shards."""
    lengths, shard_of_row = uneven_corpus(2, 6)
    with pytest.raises(ValueError, match="write more, smaller shards"):
        plan_epoch(lengths, shard_of_row, 0, 0, 3, 1, budget=60.0)


def test_resume_skip_counts_follow_round_robin():
    """After 5 batches with 2 workers, worker 0 consumed 3 and worker 1 consumed 2."""
    assert [batches_to_skip(5, w, 2) for w in (0, 1)] == [3, 2]
    assert [batches_to_skip(0, w, 3) for w in (0, 1, 2)] == [0, 0, 0]
