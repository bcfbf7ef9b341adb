"""Hugging Face datasets saved as parquet (audio as a struct of bytes / path): detected, sharded, resumed."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.corpora.readers import detect_format
from local import make_shards
from local.check_shards import check_folder
from tests.conftest import write_tone

AUDIO = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def flac_bytes(tmp_path, seconds, frequency):
    path = write_tone(tmp_path / f"tone{frequency}.flac", seconds, frequency=frequency, format="FLAC")
    return path.read_bytes()


def hub_dataset(tmp_path):
    """The Hub's layout: data/train-00000-of-00001.parquet with audio bytes, sentence, speaker_id; one
    row whose audio is a path beside the parquet, one with neither bytes nor path."""
    folder = tmp_path / "hub" / "data"
    folder.mkdir(parents=True)
    write_tone(folder / "beside.wav", 1.0)
    rows = [{"id": "a", "audio": {"bytes": flac_bytes(tmp_path, 1.0, 300), "path": "a.flac"},
             "sentence": "first words", "speaker_id": 7},
            {"id": "b", "audio": {"bytes": flac_bytes(tmp_path, 1.5, 500), "path": "b.flac"},
             "sentence": "second words", "speaker_id": 8},
            {"id": "c", "audio": {"bytes": None, "path": "beside.wav"}, "sentence": "third", "speaker_id": 7},
            {"id": "d", "audio": {"bytes": None, "path": None}, "sentence": "lost", "speaker_id": 9}]
    schema = pa.schema([("id", pa.string()), ("audio", AUDIO), ("sentence", pa.string()), ("speaker_id", pa.int64())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "train-00000-of-00001.parquet")
    return tmp_path / "hub"


def shard(source, out, *options):
    make_shards.main([str(source), str(out), "--jobs", "1", *options])
    return {row["sample_key"]: row for row in pq.read_table(out / "metadata_pool.parquet").to_pylist()}


def test_a_hub_folder_is_detected_and_sharded_with_its_text_and_speakers(tmp_path):
    """Every row with audio (bytes or a path) becomes a sample with the sentence as text and the
    speaker_id as speaker; the row with no audio is rejected, naming its row; the checker passes."""
    source = hub_dataset(tmp_path)
    assert detect_format(str(source)) == "hfparquet"
    assert detect_format(str(source / "data" / "train-00000-of-00001.parquet")) == "hfparquet"
    rows = shard(source, tmp_path / "out")
    assert sorted(rows) == ["a", "b", "c"]
    assert (rows["b"]["text"], rows["b"]["speaker"]) == ("second words", "8")
    assert rows["b"]["duration"] == pytest.approx(1.5, abs=0.02)
    rejects = [json.loads(line) for line in open(tmp_path / "out" / "rejects.jsonl")]
    assert [(r["key"], r["origin"]) for r in rejects] == [("d", "train-00000-of-00001.parquet:row 3")]
    assert check_folder(str(tmp_path / "out")) == []


def test_changed_audio_bytes_under_the_same_keys_are_not_reused(tmp_path):
    """Rewriting the dataset with other audio for the same ids changes the input fingerprint: without
    --rebuild the folder is refused (exit 2), with it the shards hold the new durations."""
    source = hub_dataset(tmp_path)
    shard(source, tmp_path / "out")
    parquet = source / "data" / "train-00000-of-00001.parquet"
    table = pq.read_table(parquet).to_pylist()
    table[0]["audio"]["bytes"] = flac_bytes(tmp_path, 2.5, 700)
    pq.write_table(pa.Table.from_pylist(table, schema=pq.read_schema(parquet)), parquet)
    with pytest.raises(SystemExit) as exit_info:
        shard(source, tmp_path / "out")
    assert exit_info.value.code == 2
    assert shard(source, tmp_path / "out", "--rebuild")["a"]["duration"] == pytest.approx(2.5, abs=0.02)


def test_field_options_and_a_dataset_without_transcripts(tmp_path):
    """--audio-field / --text-field name other columns; without a text column the reader says to pass
    --text-field or --unlabelled, and --unlabelled shards it with null texts."""
    rows = [{"speech": {"bytes": flac_bytes(tmp_path, 1.0, 400), "path": None}, "words": "hello there"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "custom.parquet")
    sharded = shard(tmp_path / "custom.parquet", tmp_path / "out", "--audio-field", "speech", "--text-field", "words")
    assert [row["text"] for row in sharded.values()] == ["hello there"]
    assert list(sharded) == ["custom_00000000"]  # no id column, no path: parquet stem and row
    bare = [{"audio": {"bytes": flac_bytes(tmp_path, 1.0, 400), "path": "x.flac"}}]
    pq.write_table(pa.Table.from_pylist(bare), tmp_path / "bare.parquet")
    with pytest.raises(SystemExit) as exit_info:
        shard(tmp_path / "bare.parquet", tmp_path / "bare_out")
    assert exit_info.value.code == 2
    unlabelled = shard(tmp_path / "bare.parquet", tmp_path / "bare_out2", "--unlabelled")
    assert [row["text"] for row in unlabelled.values()] == [None]


def test_a_shard_folder_is_not_taken_for_a_dataset(make_shard_dir):
    assert detect_format(str(make_shard_dir(num_samples=2))) != "hfparquet"


