"""Epoch plans from metadata: which (rank, worker) reads which shards, and which batches it yields.

Everything here works on metadata arrays (durations, shard of each row), so planning never decodes
audio. A plan is a pure function of (seed, epoch, metadata, world size, workers per rank), so every rank
computes the same plan on its own and a resumed run replans the same epoch exactly.

Rank balance without dummy batches or Join: shards are assigned whole to ranks, then to workers, by
longest-processing-time-first on their audio seconds (near-equal audio per rank); each (rank, worker)
slot plans its batches over its own shard stream, then slots with fewer batches split their largest
batches in two until every slot yields the same number. Every rank therefore runs the same number of
steps, and with torch's round-robin over workers the order inside a rank is known in advance.
"""

import logging
from dataclasses import dataclass, field

import numpy as np

from common.data.batching import buffered_batches

logger = logging.getLogger(__name__)


@dataclass
class SlotPlan:
    """What one dataloader worker of one rank reads and yields in one epoch.

    shards : shard indices in read order (each read front to back).
    stream_rows : metadata rows in the order the worker meets them while reading.
    batches : metadata rows of each batch, in yield order.
    """

    shards: list
    stream_rows: np.ndarray
    batches: list = field(default_factory=list)


def resolve_workers(num_shards, world_size, num_workers):
    """Workers per rank that the shards allow (every worker needs at least one whole shard).

    Fewer shards than ranks x workers: fewer workers per rank are used (logged), down to one;
    fewer shards than ranks cannot be balanced and raises.
    """
    slots = max(num_workers, 1)
    if num_shards < world_size:
        raise ValueError(
            f"{num_shards} shards cannot feed world_size={world_size} ranks (a shard is read whole by "
            f"one worker): write more, smaller shards (local/make_shards.py) or use fewer ranks"
        )
    usable = min(slots, num_shards // world_size)
    if usable < slots:
        logger.warning(
            "%d shards for %d ranks x %d workers: using %d workers per rank; write more shards to use all",
            num_shards, world_size, slots, usable,
        )
    return usable


def longest_first_assignment(sizes, bins, rng):
    """Assign items to ``bins`` bins, largest first, each to the currently lightest bin.

    Equal sizes are taken in random order (``rng``), so assignments vary across epochs.
    Returns a list of item-index lists, one per bin.
    """
    order = rng.permutation(len(sizes))
    order = order[np.argsort(-np.asarray(sizes)[order], kind="stable")]
    loads, members = np.zeros(bins), [[] for _ in range(bins)]
    for item in order:
        lightest = int(np.argmin(loads))
        members[lightest].append(int(item))
        loads[lightest] += sizes[item]
    return members


def assign_shards(shard_seconds, world_size, workers, rng):
    """Shard indices per [rank][worker]: balanced audio per rank first, then per worker."""
    per_rank = longest_first_assignment(shard_seconds, world_size, rng)
    assignment = []
    for shards in per_rank:
        per_worker = longest_first_assignment(shard_seconds[shards], workers, rng)
        assignment.append([[shards[i] for i in group] for group in per_worker])
    return assignment


def stream_rows_of(shards, rows_by_shard, rng):
    """Shuffle the shard read order; return (shard order, rows in the order the reader meets them)."""
    shards = [shards[i] for i in rng.permutation(len(shards))]
    rows = [rows_by_shard[s] for s in shards]
    return shards, np.concatenate(rows) if rows else np.empty(0, dtype=np.int64)


def split_largest_batches(batches, target):
    """Split the largest batches in two (in place of the original) until there are ``target`` batches.

    Halves stay next to each other, so a stream reader still has all their items when it yields them.
    """
    batches = list(batches)
    while len(batches) < target:
        largest = max(range(len(batches)), key=lambda j: len(batches[j]))
        if len(batches[largest]) < 2:
            raise ValueError(
                f"cannot reach {target} batches per worker with {len(batches)} single-item batches: "
                f"shards are too uneven; write shards of similar size or use fewer workers"
            )
        half = len(batches[largest]) // 2
        batch = batches[largest]
        batches[largest : largest + 1] = [batch[:half], batch[half:]]
    return batches


def plan_epoch(lengths, shard_of_row, seed, epoch, world_size=1, num_workers=1, **batching):
    """Plan one epoch for every (rank, worker) slot.

    Arguments
    ---------
    lengths : np.ndarray
        Padded-length unit of each metadata row (seconds, or tokens for text); rows already filtered
        out must be absent from ``shard_of_row`` groups (pass them with shard index -1).
    shard_of_row : np.ndarray of int
        Shard index of each row in tar order (-1: row not used this epoch).
    seed, epoch : int
        Together they fix the plan.
    world_size, num_workers : int
        Ranks, and dataloader workers per rank (0 plans one in-process stream).
    **batching
        ``budget``, ``max_batch_size``, ``buffer_size``, ``emit_fraction`` of ``buffered_batches``.

    Returns
    -------
    list of list of SlotPlan
        ``plan[rank][worker]``; every slot has the same number of batches.
    """
    rng = np.random.default_rng([seed, epoch])
    used = shard_of_row >= 0
    num_shards = int(shard_of_row.max()) + 1 if used.any() else 0
    rows_by_shard = np.split(np.flatnonzero(used)[np.argsort(shard_of_row[used], kind="stable")],
                             np.cumsum(np.bincount(shard_of_row[used], minlength=num_shards))[:-1])
    seconds = np.bincount(shard_of_row[used], weights=lengths[used], minlength=num_shards)
    workers = resolve_workers(num_shards, world_size, num_workers)
    plan = []
    for rank_shards in assign_shards(seconds, world_size, workers, rng):
        plan.append([plan_slot(shards, rows_by_shard, lengths, rng, batching) for shards in rank_shards])
    target = max(len(slot.batches) for rank in plan for slot in rank)
    for slot in (slot for rank in plan for slot in rank):
        slot.batches = split_largest_batches(slot.batches, target)
    return plan


def plan_slot(shards, rows_by_shard, lengths, rng, batching):
    """Batches of one slot over its shuffled shard stream (row indices, in yield order)."""
    shards, rows = stream_rows_of(shards, rows_by_shard, rng)
    batches = buffered_batches(lengths[rows], rng=rng, **batching)
    return SlotPlan(shards, rows, [rows[b] for b in batches])


def interleaved_order(plan_of_rank):
    """Batches of one rank in the order torch's DataLoader yields them (round-robin over workers)."""
    per_worker = [slot.batches for slot in plan_of_rank]
    return [batches[j] for j in range(len(per_worker[0])) for batches in per_worker]


def batches_to_skip(consumed, worker, workers):
    """How many of a worker's batches were consumed when a rank consumed ``consumed`` batches."""
    return max(0, -(-(consumed - worker) // workers))
