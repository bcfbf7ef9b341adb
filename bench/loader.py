"""Loader benchmark: audio seconds per second of the whole loader (tar -> opus decode -> fbank -> batch).

Writes ~8 min of tone shards to a temporary folder, then measures in one run:
- limit: two independent processes, each decoding + fbank'ing half of the shards (no loader);
- tandem with 0, 1, 2 workers, fbank in the workers;
- tandem with 2 workers, fbank in the main process (as a Brain would in compute_forward);
each with the CPU seconds it used (this process and its workers or pool processes).

Every measurement is repeated (``--repeats``, interleaved so that a slow spell of the machine hits all
of them alike); the table gives the best rate of each and, beside it, the median of the per-repeat
ratios to the limit measured in the same repeat. A last, untimed epoch measures the loader's memory:
the peak it allocates against what its planned buffer would hold as decoded audio.

    python bench/loader.py [--json] [--repeats 3]
"""

import argparse
import json
import logging
import resource
import tempfile
import time
import tracemalloc
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch
from speechbrain.lobes.features import Fbank

from common.data import SpeechLoaderConfig, make_speech_loader
from common.data.metadata import read_speech_metadata
from common.data.shard_audio import BadDataCounts, decoded_audio
from common.data.synthetic import train_tiny_tokenizer, write_shards

logger = logging.getLogger(__name__)
torch.set_num_threads(1)  # one core per process, as dataloader workers run


def decode_and_fbank(shard_paths):
    """Decode every utterance of the shards and compute fbank one by one; returns audio seconds."""
    torch.set_num_threads(1)
    fbank, seconds = Fbank(n_mels=80), 0.0
    for path in shard_paths:
        for _, waveform in decoded_audio(path, _Everything(), BadDataCounts()):
            with torch.no_grad():
                fbank(waveform[None])
            seconds += len(waveform) / 16000
    return seconds


class _Everything:
    """A set that holds every key (decode all members)."""

    def __contains__(self, key):
        return True


def cpu_seconds():
    """CPU time (user + system, s) of this process and of its children that have ended."""
    return sum(usage.ru_utime + usage.ru_stime
               for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def independent_limit(shard_paths):
    """(audio s/s, CPU s) of two processes decoding + fbank'ing half of the shards each, timed from
    their start (as the loader is timed from the start of its workers)."""
    halves = [shard_paths[0::2], shard_paths[1::2]]
    start, cpu = time.perf_counter(), cpu_seconds()
    with get_context("fork").Pool(2) as pool:
        seconds = sum(pool.map(decode_and_fbank, halves))
    return seconds / (time.perf_counter() - start), cpu_seconds() - cpu


def loader_rate(parquet, tokenizer, workers, features_in_worker):
    """(audio s/s, CPU s of the main process and its workers) of one epoch of the speech loader."""
    fbank = Fbank(n_mels=80)
    config = SpeechLoaderConfig(120.0, num_workers=workers, fbank_in_loader=features_in_worker)
    loader = make_speech_loader(parquet, tokenizer, config, fbank=fbank)
    seconds, start, cpu = 0.0, time.perf_counter(), cpu_seconds()
    for batch in loader:
        if not features_in_worker:
            with torch.no_grad():
                fbank(batch.sig.data)
        seconds += float(batch.duration.sum())
    return seconds / (time.perf_counter() - start), cpu_seconds() - cpu


def loader_memory(parquet, tokenizer):
    """(peak MB the in-process loader allocates over one epoch, MB its planned buffer would hold as
    decoded float32 audio). The first is tracemalloc's peak (numpy waveforms and Python objects, not
    torch's own allocations): the Opus bytes held for planned batches plus the batch being made."""
    loader = make_speech_loader(parquet, tokenizer, SpeechLoaderConfig(120.0))
    tracemalloc.start()
    for _ in loader:
        pass
    peak = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    return peak, decoded_buffer_peak_mb(loader)


def decoded_buffer_peak_mb(loader):
    """Most decoded audio (MB of float32 at 16 kHz) held at once if the epoch's plan held waveforms:
    the members read but not yet yielded, replayed batch by batch."""
    slot = loader.plan(0)[0][0]
    position = {int(row): i for i, row in enumerate(slot.stream_rows)}
    read_seconds = np.cumsum(loader.metadata.durations[slot.stream_rows])
    reached, yielded, peak = -1, 0.0, 0.0
    for batch in slot.batches:
        reached = max(reached, max(position[int(row)] for row in batch))
        peak = max(peak, read_seconds[reached] - yielded)
        yielded += loader.metadata.durations[batch].sum()
    return peak * 16000 * 4 / 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    parser.add_argument("--utterances-per-shard", type=int, default=48,
                        help="8 shards of 2-8 s utterances; more amortizes worker start-up")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each setting (best is shown)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        parquet = write_shards(folder, [args.utterances_per_shard] * 8, min_seconds=2.0, max_seconds=8.0)
        tokenizer = train_tiny_tokenizer(folder)
        repeats = [measure_once(parquet, tokenizer) for _ in range(args.repeats)]
        allocated, decoded = loader_memory(parquet, tokenizer)
    best = {name: max((r[name] for r in repeats), key=lambda row: row[1]) for name in repeats[0]}
    median_ratio = {name: float(np.median([r[name][1] / r["limit"][1] for r in repeats])) for name in repeats[0]}
    limit = best["limit"][1]
    print(f"{'loader':32} {'workers':>7} {'audio s/s':>10} {'vs limit':>8} {'median ratio':>12} {'CPU s':>7}")
    for name, (workers, rate, cpu) in best.items():
        label = "limit: 2 independent processes" if name == "limit" else name
        print(f"{label:32} {workers:7d} {rate:10.1f} {rate / limit:8.3f} {median_ratio[name]:12.3f} {cpu:7.2f}")
    print(f"memory, one in-process epoch: peak allocation {allocated:.1f} MB (tracemalloc) vs {decoded:.1f} MB "
          f"if the planned buffer held decoded audio: {allocated / decoded:.3f}")
    if args.json:
        print(json.dumps({name: {"audio_s_per_s": round(rate, 1), "workers": workers, "cpu_s": round(cpu, 2),
                                 "limit_audio_s_per_s": round(limit, 1), "median_ratio": round(median_ratio[name], 3)}
                          for name, (workers, rate, cpu) in best.items() if name != "limit"}))


def measure_once(parquet, tokenizer):
    """One repeat: name -> (workers, audio s/s, CPU s) of the limit and of each loader setting."""
    rows = {"limit": (2, *independent_limit(read_speech_metadata(parquet).shard_paths))}
    rows.update({f"tandem_{w}_workers": (w, *loader_rate(parquet, tokenizer, w, True)) for w in (0, 1, 2)})
    rows["tandem_2_workers_fbank_in_main"] = (2, *loader_rate(parquet, tokenizer, 2, False))
    return rows


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
