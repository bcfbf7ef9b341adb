#!/usr/bin/env python3
"""Check a shard folder for consistency; exit 0 only when every check passes.

    python local/check_shards.py SHARD_DIR [--jobs N]

Checks, per sample: both members ({key}.opus and {key}.json) present; the json parses and holds text (null
for untranscribed speech) and duration; the opus decodes to 16 kHz mono; its duration matches the parquet within 20 ms;
the members lie at the parquet's offsets. Across the folder: no duplicate keys; every parquet row is in
a tar and every tar sample in the parquet; the core parquet is a subset of the pool. Each problem is
printed on its own line (shard, key, what is wrong).
"""

import argparse
import json
import logging
import os
import sys
import tarfile

import pyarrow.compute

from common.audio_io import SAMPLE_RATE, decode_opus
from common.parallel import process_pool
from common.shard_format import CORE_PARQUET, METADATA_SCHEMA, POOL_PARQUET, read_metadata
from common.user_errors import run_command

logger = logging.getLogger("check_shards")
DURATION_TOLERANCE_S = 0.020


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Check a shard folder made by local/make_shards.py.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("shard_dir", help="folder with the .tar shards and metadata parquets")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="processes decoding shards")
    return parser.parse_args(argv)


def check_shard(path):
    """Read one tar front to back: returns ({key: (duration, offsets)}, [problems])."""
    name, samples, problems, members = os.path.basename(path), {}, [], {}
    try:
        with tarfile.open(path) as tar:
            for info in tar:
                key, _, extension = info.name.partition(".")
                members.setdefault(key, {})[extension] = (info.offset_data, info.size,
                                                          tar.extractfile(info).read())
    except (tarfile.TarError, OSError, EOFError) as error:
        problems.append(f"{name}: unreadable tar ({error}): the shard is truncated or corrupted; "
                        "rerun make_shards.py into a fresh folder")
    for key, parts in members.items():
        result = check_sample(name, key, parts)
        if isinstance(result, str):
            problems.append(result)
        else:
            samples[key] = result
    return name, samples, problems


def check_sample(shard, key, parts):
    """(decoded duration, offsets) for one sample, or a problem line."""
    where = f"{shard}: {key}"
    missing = {"opus", "json"} - set(parts)
    if missing:
        return f"{where}: missing member(s) {sorted(missing)}"
    try:
        meta = json.loads(parts["json"][2].decode("utf-8"))
        text_ok = isinstance(meta.get("text"), str) or (meta.get("text") is None and "text" in meta)
        if not text_ok or not isinstance(meta.get("duration"), (int, float)):
            return f"{where}: json lacks text (null when untranscribed) or duration"
    except (UnicodeDecodeError, ValueError) as error:
        return f"{where}: json does not parse ({error})"
    try:
        audio, rate = decode_opus(parts["opus"][2])
    except Exception as error:  # noqa: BLE001 - any decoder failure is a finding, not a crash
        return f"{where}: opus does not decode ({error})"
    if rate != SAMPLE_RATE:
        return f"{where}: opus is {rate} Hz, expected {SAMPLE_RATE}"
    offsets = (parts["opus"][0], parts["opus"][1], parts["json"][0], parts["json"][1])
    return len(audio) / rate, offsets


def compare_with_parquet(table, shard_samples):
    """Problems between the parquet rows and what the tars hold."""
    problems, seen = [], {}
    for shard, samples in shard_samples.items():
        for key in samples:
            if key in seen:
                problems.append(f"{shard}: {key}: duplicate key, also in {seen[key]}")
            seen[key] = shard
    rows = table.to_pylist()
    row_keys = set()
    for row in rows:
        key, shard = row["sample_key"], row["shard_name"]
        if key in row_keys:
            problems.append(f"parquet: {key}: duplicate row")
        row_keys.add(key)
        problems += _compare_row(row, shard_samples.get(shard, {}).get(key), shard, key)
    problems += [f"{shard}: {key}: in the tar but not in the parquet"
                 for key, shard in seen.items() if key not in row_keys]
    return problems


def _compare_row(row, found, shard, key):
    if found is None:
        return [f"{shard}: {key}: in the parquet but not in this tar"]
    duration, offsets = found
    problems = []
    if abs(duration - row["duration"]) > DURATION_TOLERANCE_S:
        problems.append(f"{shard}: {key}: decoded duration {duration:.3f} s, parquet says "
                        f"{row['duration']:.3f} s")
    expected = (row["opus_offset"], row["opus_size"], row["json_offset"], row["json_size"])
    if offsets != expected:
        problems.append(f"{shard}: {key}: members at {offsets}, parquet says {expected}")
    return problems


def check_folder(shard_dir, jobs=1):
    """All problems found in ``shard_dir`` (an empty list when consistent)."""
    problems = []
    try:
        pool_table = read_metadata(os.path.join(shard_dir, POOL_PARQUET))
    except (FileNotFoundError, OSError) as error:
        return [f"{POOL_PARQUET}: {error}"]
    if not pool_table.schema.equals(METADATA_SCHEMA):
        problems.append(f"{POOL_PARQUET}: schema {pool_table.schema} differs from the expected one")
    tars = sorted(os.path.join(shard_dir, f) for f in os.listdir(shard_dir) if f.endswith(".tar"))
    with process_pool(jobs) as pool:
        results = pool.map(check_shard, tars)
    shard_samples = {name: samples for name, samples, _ in results}
    problems += [p for _, _, shard_problems in results for p in shard_problems]
    problems += compare_with_parquet(pool_table, shard_samples)
    problems += _check_core(shard_dir, pool_table)
    return problems


def _check_core(shard_dir, pool_table):
    path = os.path.join(shard_dir, CORE_PARQUET)
    if not os.path.isfile(path):
        return [f"{CORE_PARQUET}: missing"]
    extra = set(read_metadata(path).column("sample_key").to_pylist()) - set(
        pool_table.column("sample_key").to_pylist())
    return [f"{CORE_PARQUET}: {key}: not in the pool" for key in sorted(extra)]


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    if not os.path.isdir(args.shard_dir):
        print(f"error: {args.shard_dir} is not a folder", file=sys.stderr)
        sys.exit(2)
    problems = check_folder(args.shard_dir, args.jobs)
    for problem in problems:
        print(problem)
    if problems:
        logger.error("%d problem(s) in %s", len(problems), args.shard_dir)
        sys.exit(1)
    logger.info("%s is consistent: %s", args.shard_dir, audio_summary(args.shard_dir))


def audio_summary(shard_dir):
    """Samples, hours and Opus bytes per second of audio, from the pool parquet."""
    table = read_metadata(os.path.join(shard_dir, POOL_PARQUET))
    seconds = pyarrow.compute.sum(table.column("duration")).as_py() or 0.0
    opus_bytes = pyarrow.compute.sum(table.column("opus_size")).as_py() or 0
    rate = opus_bytes / 1000 / seconds if seconds else 0.0
    return f"{table.num_rows} samples, {seconds / 3600:.2f} h, Opus {rate:.1f} kB per second of audio"


if __name__ == "__main__":
    run_command(main)
