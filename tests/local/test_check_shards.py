"""local/check_shards.py: a consistent folder passes; each kind of damage is reported."""

import os
import subprocess
import sys

import pyarrow.parquet as pq

from common.shard_format import write_metadata
from local.check_shards import check_folder

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_consistent_folder_passes_and_exits_zero(make_shard_dir):
    """A fresh make_shards.py output has no problem and the command exits 0."""
    out = make_shard_dir(num_samples=8)
    assert check_folder(str(out)) == []
    assert subprocess.run([sys.executable, "local/check_shards.py", str(out)], cwd=REPO).returncode == 0


def test_truncated_shard_is_reported(make_shard_dir):
    """Cutting a tar in half loses samples: the checker names the shard and exits non-zero."""
    out = make_shard_dir(num_samples=8, shard_size_mb=1)
    tar = out / "shard-000000.tar"
    tar.write_bytes(tar.read_bytes()[: os.path.getsize(tar) // 2])
    problems = check_folder(str(out))
    assert any("shard-000000.tar" in p for p in problems)
    result = subprocess.run([sys.executable, "local/check_shards.py", str(out)], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 1 and "shard-000000.tar" in result.stdout


def test_corrupted_opus_member_is_reported(make_shard_dir):
    """Overwriting the middle of an Opus member breaks its pages: decode or duration check fails."""
    out = make_shard_dir(num_samples=3, min_s=2.0, max_s=2.5, shard_size_mb=1)
    row = pq.read_table(out / "metadata_pool.parquet").to_pylist()[1]
    with open(out / row["shard_name"], "r+b") as handle:
        handle.seek(row["opus_offset"] + row["opus_size"] // 3)
        handle.write(b"\xff" * (row["opus_size"] // 3))
    problems = check_folder(str(out))
    assert problems and all(row["sample_key"] in p for p in problems)


def test_parquet_disagreeing_with_tars_is_reported(make_shard_dir):
    """A parquet row without a sample, and a sample without a row, are both listed."""
    out = make_shard_dir(num_samples=4, shard_size_mb=1)
    rows = pq.read_table(out / "metadata_pool.parquet").to_pylist()
    dropped = rows.pop(0)
    rows.append(dict(rows[0], sample_key="ghost"))
    write_metadata(rows, str(out / "metadata_pool.parquet"))
    problems = check_folder(str(out))
    assert any(dropped["sample_key"] in p and "not in the parquet" in p for p in problems)
    assert any("ghost" in p and "not in this tar" in p for p in problems)
