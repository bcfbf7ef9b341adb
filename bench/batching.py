"""Batching benchmark: padding, batch count and cost of Tandem's planner against SpeechBrain's.

Same stream for every method: 20,000 LibriSpeech-like lengths (lognormal, median 12 s, sigma 0.5,
clipped 1-35 s), 200 s padded budget (batch size x longest). Methods:
- tandem / tandem_<buffer>: ``common.data.batching.buffered_batches`` (buffer 1024, then each
  ``--buffers`` size; ``--emit-fraction`` sets its tightness).
- speechbrain_1024 / speechbrain_4096: ``speechbrain.dataio.iterators.dynamic_bucketed_batch`` with
  ``max_batch_numel`` = ``target_batch_numel`` = the budget (in 16 kHz samples).
- sort_buffer_1024: sort each block of 1024 lengths, cut greedily from the long end.
- oracle: sort all 20,000 at once, cut greedily.

    python bench/batching.py [--json]
"""

import argparse
import json
import logging
import random
import time

import numpy as np
from speechbrain.dataio.iterators import dynamic_bucketed_batch

from common.data.batching import buffered_batches, padding_percent, sorted_oracle_batches

logger = logging.getLogger(__name__)
BUDGET = 200.0  # s of padded audio per batch (default of --budget)
RATE = 16000  # samples per second, SpeechBrain counts lengths in samples


def speechbrain_batches(lengths, budget, buffer_size):
    """SpeechBrain's dynamic bucketed batching over the stream; returns index arrays."""
    samples = [{"i": i, "n": int(round(x * RATE))} for i, x in enumerate(lengths)]
    budget = int(budget * RATE)
    rng = random.Random(0)
    return list(dynamic_bucketed_batch(
        samples, len_key="n", len_fn=None, buffersize=buffer_size,
        collate_fn=lambda items: np.array([item["i"] for item in items]),
        sampler_kwargs={"target_batch_numel": budget, "max_batch_numel": budget, "randint_generator": rng.randint},
    ))


def sort_buffer_batches(lengths, budget, buffer_size):
    """Sort each block of ``buffer_size`` lengths and cut it greedily (partial batch per block)."""
    batches = []
    for start in range(0, len(lengths), buffer_size):
        block = sorted_oracle_batches(lengths[start : start + buffer_size], budget)
        batches += [b + start for b in block]
    return batches


def tandem_methods(buffers, emit_fraction):
    """Tandem's planner at each buffer size (``tandem`` is the buffer of 1024 the goals name)."""
    return {("tandem" if size == 1024 else f"tandem_{size}"): (
        lambda lengths, budget, size=size: buffered_batches(lengths, budget, buffer_size=size,
                                                            emit_fraction=emit_fraction))
        for size in [1024] + [b for b in buffers if b != 1024]}


BASELINES = {
    "speechbrain_1024": lambda lengths, budget: speechbrain_batches(lengths, budget, 1024),
    "speechbrain_4096": lambda lengths, budget: speechbrain_batches(lengths, budget, 4096),
    "sort_buffer_1024": lambda lengths, budget: sort_buffer_batches(lengths, budget, 1024),
    "oracle": sorted_oracle_batches,
}


def measure(lengths, budget, make_batches, oracle_count):
    """Figures of one method (best of 3 timings)."""
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        batches = make_batches(lengths, budget)
        seconds.append(time.perf_counter() - start)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    return {
        "padding_pct": round(padding_percent(lengths, batches), 4),
        "batches": len(batches),
        "oracle_batches": oracle_count,
        "us_per_utt": round(min(seconds) / len(lengths) * 1e6, 3),
        "over_budget_batches": int(sum(len(b) * lengths[b].max() > budget for b in batches)),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    parser.add_argument("--count", type=int, default=20000, help="utterances in the stream")
    parser.add_argument("--buffers", type=int, nargs="+", default=[4096], help="Tandem's buffers besides 1024")
    parser.add_argument("--budget", type=float, default=BUDGET, help="padded seconds per batch")
    parser.add_argument("--emit-fraction", type=float, default=0.25, help="Tandem's emit_fraction")
    args = parser.parse_args(argv)
    lengths = np.clip(np.random.default_rng(0).lognormal(np.log(12), 0.5, args.count), 1, 35)
    oracle_count = len(sorted_oracle_batches(lengths, args.budget))
    methods = {**tandem_methods(args.buffers, args.emit_fraction), **BASELINES}
    results = {name: measure(lengths, args.budget, make, oracle_count) for name, make in methods.items()}
    print(f"{args.count} lengths, lognormal median 12 s sigma 0.5 clipped 1-35 s, budget {args.budget:.0f} s padded")
    print(f"{'method':18} {'padding %':>9} {'batches':>8} {'vs oracle':>9} {'us/utt':>7} {'over budget':>11} "
          f"{'padding vs SB1024':>17}")
    reference = results["speechbrain_1024"]["padding_pct"]
    for name, r in results.items():
        print(f"{name:18} {r['padding_pct']:9.3f} {r['batches']:8d} {r['batches'] / oracle_count:9.4f} "
              f"{r['us_per_utt']:7.2f} {r['over_budget_batches']:11d} {r['padding_pct'] / reference:17.3f}")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
