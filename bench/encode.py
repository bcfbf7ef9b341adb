#!/usr/bin/env python3
"""Shard-encoding throughput: local/make_shards.py with N jobs against N x the single-core rate.

    python bench/encode.py [--utterances 300] [--jobs 1 2] [--json]

Synthesizes a small espeak-ng corpus, measures in this process how fast one core reads + encodes it
to Opus (the work make_shards.py does per sample, without tar writing or process pools), then runs
make_shards.py on it with each --jobs value, timed whole (``_run``: interpreter and pool start-up,
parquet writing included) and as the tool times its encoding phase (``_encoding``: pool start,
encoding, tar writing). Goal: make_shards with N jobs >= 0.9 x N x single-core.
With --json the last line is {"single_core": {...}, "make_shards_jobs_N": {...}}.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from common.audio_io import encode_opus, read_audio

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def single_core_rate(manifest):
    """Audio seconds per wall second for read + resample + Opus encode on one core."""
    folder = os.path.dirname(manifest)
    with open(manifest, encoding="utf-8") as handle:
        paths = [os.path.join(folder, json.loads(line)["audio"]) for line in handle]
    began, audio_s = time.perf_counter(), 0.0
    for path in paths:
        audio = read_audio(path)
        encode_opus(audio)
        audio_s += len(audio) / 16000
    return audio_s / (time.perf_counter() - began), audio_s


def make_shards_rates(manifest, out_dir, jobs, audio_s):
    """Audio seconds per wall second of make_shards.py: (whole run with process start-up and
    parquet writing, encoding phase alone as the tool reports it in summary.json)."""
    began = time.perf_counter()
    subprocess.run([sys.executable, os.path.join(REPO, "local", "make_shards.py"), manifest, out_dir,
                    "--jobs", str(jobs)], check=True, capture_output=True)
    whole = audio_s / (time.perf_counter() - began)
    with open(os.path.join(out_dir, "summary.json"), encoding="utf-8") as handle:
        run = json.load(handle)["last_run"]
    return whole, run["encoded_audio_s"] / run["encode_wall_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--utterances", type=int, default=300, help="demo utterances to synthesize")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2], help="make_shards --jobs values")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([sys.executable, os.path.join(REPO, "local", "synth_corpus.py"), work,
                        "--num-train", str(args.utterances), "--num-dev", "0", "--num-test", "0"],
                       check=True, capture_output=True)
        manifest = os.path.join(work, "train.jsonl")
        single, audio_s = single_core_rate(manifest)
        results = {"single_core": {"audio_s_per_s": single, "jobs": 1, "target_audio_s_per_s": single}}
        for jobs in args.jobs:
            whole, encoding = make_shards_rates(manifest, os.path.join(work, f"shards{jobs}"), jobs,
                                                audio_s)
            for phase, rate in (("run", whole), ("encoding", encoding)):
                results[f"make_shards_jobs_{jobs}_{phase}"] = {
                    "audio_s_per_s": rate, "jobs": jobs, "target_audio_s_per_s": 0.9 * jobs * single}
    print(f"{audio_s:.0f} s of espeak-ng speech, {args.utterances} utterances, {os.cpu_count()} cores")
    print(f"{'method':<28} {'jobs':>4} {'audio s/s':>10} {'vs jobs x single':>17} {'goal':>6}")
    for name, row in results.items():
        ratio = row["audio_s_per_s"] / (row["jobs"] * single)
        print(f"{name:<28} {row['jobs']:>4} {row['audio_s_per_s']:>10.1f} {ratio:>17.3f} {'>=0.9':>6}")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
