"""local/extract_units.py: seeded k-means units on real speech shards, resumable, hash-checked."""

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from common.data.units import KMEANS_JSON, UNITS_PARQUET, read_units
from local import extract_units

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
    parts = sorted((out / "parts").iterdir())
    assert len(parts) > 1
    before = {p.name: p.stat().st_mtime_ns for p in parts}
    expected = pq.read_table(out / UNITS_PARQUET)
    os.remove(parts[0])
    extract(speech_shards["train"], out, "--seed", "1")
    after = {p.name: p.stat().st_mtime_ns for p in sorted((out / "parts").iterdir())}
    assert [n for n in before if before[n] != after[n]] == [parts[0].name]
    assert pq.read_table(out / UNITS_PARQUET).equals(expected)


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
