"""local/extract_units.py: seeded k-means units on real speech shards, resumable, hash-checked."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from threadpoolctl import threadpool_limits

from common.data.units import KMEANS_CENTERS, KMEANS_JSON, UNITS_PARQUET, read_units
from local import extract_units
from local.extract_units import PARTS

FAST = ["--n-units", "12", "--fit-fraction", "0.25", "--min-fit-utterances", "8", "--jobs", "1"]


def extract(shard_dir, out_dir, *extra):
    extract_units.main([str(shard_dir), str(out_dir), *FAST, *extra])
    return read_units(str(out_dir))


@pytest.fixture(scope="module")
def train_units(speech_shards, tmp_path_factory):
    """Units of the 40 training utterances, seed 1; returns the units folder."""
    out = tmp_path_factory.mktemp("units") / "train"
    extract(speech_shards["train"], out, "--seed", "1")
    return out


def test_same_seed_gives_the_same_units_and_hash_another_seed_does_not(train_units, speech_shards,
                                                                         tmp_path):
    """Two fits with seed 1 agree on every unit and the hash; seed 2 gives another model (hash)."""
    first, again = read_units(str(train_units)), extract(speech_shards["train"], tmp_path / "a", "--seed", "1")
    assert first.kmeans_hash == again.kmeans_hash and len(first) == 40
    assert all(np.array_equal(first.units_by_key[k], again.units_by_key[k]) for k in first.units_by_key)
    assert extract(speech_shards["train"], tmp_path / "b", "--seed", "2").kmeans_hash != first.kmeans_hash


def test_one_unit_per_10_ms_frame_and_every_cluster_used(train_units, speech_shards):
    """MFCC frames at 100 Hz: units per sample = duration x 100 + 1 (centred frames); 12 clusters used."""
    table = read_units(str(train_units))
    durations = dict(zip(*pq.read_table(speech_shards["train"] / "metadata_pool.parquet",
                                        columns=["sample_key", "duration"]).to_pydict().values()))
    for key, units in table.units_by_key.items():
        assert abs(len(units) - durations[key] * 100) <= 2
    assert table.frame_rate_hz == 100.0 and table.n_units == 12
    assert len(np.unique(np.concatenate(list(table.units_by_key.values())))) == 12


def test_a_rerun_relabels_only_missing_shards_and_ends_identical(train_units, speech_shards, tmp_path):
    """Remove one shard's part: the rerun rewrites that part alone; units.parquet is unchanged."""
    out = tmp_path / "resume"
    extract(speech_shards["train"], out, "--seed", "1")
    parts = sorted((out / "parts").glob("*.parquet"))
    assert len(parts) > 1
    before = {p.name: p.stat().st_mtime_ns for p in parts}
    expected = pq.read_table(out / UNITS_PARQUET)
    os.remove(parts[0])
    extract(speech_shards["train"], out, "--seed", "1")
    after = {p.name: p.stat().st_mtime_ns for p in sorted((out / "parts").glob("*.parquet"))}
    assert [n for n in before if before[n] != after[n]] == [parts[0].name]
    assert pq.read_table(out / UNITS_PARQUET).equals(expected)


def test_a_rewritten_shard_is_labelled_again_and_the_model_refitted(speech_shards, tmp_path, caplog):
    """A shard file written again (as make_shards --rebuild does) is not the one its part describes:
    the rerun refits k-means (here on the same audio: the same model) and relabels that shard alone."""
    import shutil

    shards = tmp_path / "shards"
    shutil.copytree(speech_shards["train"], shards)
    out = tmp_path / "units"
    extract(shards, out, "--seed", "1")
    before = {p.name: p.stat().st_mtime_ns for p in (out / "parts").glob("*.parquet")}
    rewritten = sorted(shards.glob("*.tar"))[1]
    os.utime(rewritten, ns=(time.time_ns(), time.time_ns() + 10**9))
    caplog.set_level("WARNING")
    extract(shards, out, "--seed", "1")
    assert "shards changed since its k-means model was fitted" in caplog.text
    after = {p.name: p.stat().st_mtime_ns for p in (out / "parts").glob("*.parquet")}
    assert [n for n in before if before[n] != after[n]] == [rewritten.name + ".parquet"]


def test_applying_a_model_to_another_split_keeps_its_hash(train_units, speech_shards, tmp_path):
    """--kmeans labels the dev split with the training model; both folders read as one table."""
    extract(speech_shards["dev"], tmp_path / "dev", "--kmeans", str(train_units / KMEANS_JSON))
    table = read_units([str(train_units), str(tmp_path / "dev")])
    assert len(table) == 48


def test_units_of_another_model_are_refused(train_units, speech_shards, tmp_path):
    """A caller expecting another k-means hash, or a folder whose rows disagree with it, fails."""
    with pytest.raises(ValueError, match="k-means"):
        read_units(str(train_units), expected_hash="0" * 64)
    other = tmp_path / "other"
    extract(speech_shards["dev"], other, "--seed", "3")
    info = json.loads((other / KMEANS_JSON).read_text())
    info["hash"] = "f" * 64
    (other / KMEANS_JSON).write_text(json.dumps(info))
    with pytest.raises(ValueError, match="k-means"):
        read_units(str(other))


def test_a_rerun_with_other_options_is_refused(train_units, speech_shards):
    """Reusing a folder with another --n-units exits with status 2 instead of mixing models."""
    with pytest.raises(SystemExit) as exit_info:
        extract_units.main([str(speech_shards["train"]), str(train_units), "--n-units", "7"])
    assert exit_info.value.code == 2


# A run stalled at one rename (its temporary file complete, not yet renamed), then killed with
# SIGKILL: the kill is guaranteed mid-run and leaves what a kill during that write leaves behind.
STALL_AT_RENAME = """
import fnmatch, os, runpy, sys, time
pattern, nth, flag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
real_replace, matched = os.replace, []
def replace_or_stall(source, destination):
    if fnmatch.fnmatch(os.path.basename(destination), pattern):
        matched.append(destination)
        if len(matched) == nth:
            open(flag, "w").close()
            time.sleep(600)
    real_replace(source, destination)
os.replace = replace_or_stall
sys.argv = sys.argv[4:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# One OpenMP thread: k-means threads that spin for a core shared with other jobs slow a fit 100x.
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def kill_at_rename(command, pattern, nth, flag, timeout_s=60):
    """Run ``command`` ([script, args...]) up to its ``nth`` rename onto a name matching
    ``pattern`` and SIGKILL it there; fails unless the run got there (so the kill was mid-run)."""
    process = subprocess.Popen([sys.executable, "-c", STALL_AT_RENAME, pattern, str(nth), str(flag),
                                *map(str, command)], cwd=REPO, env=ONE_THREAD,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    deadline = time.time() + timeout_s
    while not os.path.exists(flag) and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    stderr = process.communicate()[1].decode(errors="replace")
    assert os.path.exists(flag), f"the run ended before its rename #{nth} of {pattern}: {stderr}"
    os.remove(flag)


def run_to_the_end(command):
    """Run ``command`` ([script, args...]) as a user would, one OpenMP thread."""
    subprocess.run([sys.executable, *map(str, command)], cwd=REPO, env=ONE_THREAD, check=True,
                   capture_output=True)


def temporary_files(folder):
    """Files left under ``folder`` by interrupted atomic writes, named as they would have been
    (``NAME.tmp<pid>`` -> ``NAME``)."""
    return sorted(str(p.relative_to(folder)).rpartition(".tmp")[0] for p in folder.rglob("*.tmp*"))


def test_rerun_after_kill_9_gives_exactly_the_uninterrupted_units(make_shard_dir, tmp_path):
    """kill -9 with the k-means centres written under their temporary name only, then again with
    the second shard's units so; a rerun of the same command ends with the uninterrupted run's model
    (hash, centres) and units, every sample once, and no temporary file left."""
    shards = make_shard_dir(num_samples=10, min_s=0.5, max_s=1.0, shard_size_mb=0.02)
    tars = sorted(p.name for p in shards.glob("*.tar"))
    assert len(tars) >= 3
    with threadpool_limits(limits=1):  # as in the runs below (ONE_THREAD)
        reference = extract(shards, tmp_path / "reference")
    out, flag = tmp_path / "killed", tmp_path / "stalled"
    command = ["local/extract_units.py", shards, out, *FAST]
    kill_at_rename(command, KMEANS_CENTERS, 1, flag)
    assert temporary_files(out) == [KMEANS_CENTERS] and not (out / KMEANS_JSON).exists()
    kill_at_rename(command, "*.tar.parquet", 2, flag)
    assert temporary_files(out) == [f"{PARTS}/{tars[1]}.parquet"]
    assert [p.name for p in (out / PARTS).glob("*.parquet")] == [f"{tars[0]}.parquet"]
    assert json.loads((out / KMEANS_JSON).read_text())["hash"] == reference.kmeans_hash
    assert not (out / UNITS_PARQUET).exists()
    run_to_the_end(command)
    assert temporary_files(out) == []
    keys = pq.read_table(out / UNITS_PARQUET)["sample_key"].to_pylist()
    expected_keys = pq.read_table(shards / "metadata_pool.parquet")["sample_key"].to_pylist()
    assert sorted(keys) == sorted(expected_keys) and len(keys) == len(set(keys))
    for name in (UNITS_PARQUET, KMEANS_CENTERS, KMEANS_JSON):
        assert (out / name).read_bytes() == (tmp_path / "reference" / name).read_bytes(), name
