"""local/shard_paths.sh names the shard folder's parquet as common/shard_format.py writes it."""

import os
import subprocess

from common.shard_format import POOL_PARQUET

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shell(command):
    """Run ``command`` in bash after sourcing local/shard_paths.sh; returns (exit code, stdout)."""
    result = subprocess.run(["bash", "-c", f". local/shard_paths.sh; {command}"], cwd=REPO,
                            capture_output=True, text=True)
    return result.returncode, result.stdout.strip()


def test_the_shell_helpers_name_the_parquet_the_shard_writer_writes(tmp_path):
    """pool_parquet is the Python constant's path; is_shard_dir holds only where that file exists."""
    assert shell(f"pool_parquet {tmp_path}") == (0, os.path.join(str(tmp_path), POOL_PARQUET))
    assert shell(f"is_shard_dir {tmp_path}")[0] == 1
    (tmp_path / POOL_PARQUET).write_bytes(b"")
    assert shell(f"is_shard_dir {tmp_path}")[0] == 0
