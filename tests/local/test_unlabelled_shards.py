"""Untranscribed speech (make_shards.py --unlabelled): sharded in every layout, checked, marked in the
parquet, read by pretraining's loader and refused by the finetune loader with a message naming the folder."""

import json

import pyarrow.parquet as pq
import pytest

from common.data import SpeechLoaderConfig, make_speech_loader
from common.shard_format import is_unlabelled
from local import make_shards
from local.check_shards import check_folder
from tests.conftest import write_manifest, write_tone


def shard(source, out, *options):
    make_shards.main([str(source), str(out), "--jobs", "1", *options])
    return pq.read_table(out / "metadata_pool.parquet").to_pylist()


def audio_only_folder(folder):
    (folder / "spk").mkdir(parents=True)
    for index, seconds in enumerate((1.0, 1.5, 2.0)):
        write_tone(folder / "spk" / f"u{index}.wav", seconds, frequency=300 + 50 * index, seed=index)
    return folder


def kaldi_without_text(folder):
    folder.mkdir()
    write_tone(folder / "rec.wav", 3.0)
    (folder / "wav.scp").write_text(f"rec {folder / 'rec.wav'}\n")
    (folder / "segments").write_text("a rec 0.0 1.0\nb rec 1.5 3.0\n")
    return folder


def manifest_without_text(folder):
    folder.mkdir()
    write_tone(folder / "x.wav", 1.0)
    write_tone(folder / "y.flac", 2.0, format="FLAC")
    return write_manifest(folder / "m.jsonl", [{"id": "x", "audio": "x.wav"}, {"id": "y", "audio": "y.flac"}])


def tsv_without_text(folder):
    folder.mkdir()
    write_tone(folder / "x.wav", 1.0)
    (folder / "m.tsv").write_text("id\tpath\nx\tx.wav\n")
    return folder / "m.tsv"


@pytest.mark.parametrize("layout, expected", [(audio_only_folder, 3), (kaldi_without_text, 2),
                                              (manifest_without_text, 2), (tsv_without_text, 1)])
def test_every_layout_without_transcripts_shards_with_null_texts(tmp_path, layout, expected):
    """Each layout without transcripts keeps every recording under --unlabelled (null text in the json
    and the parquet, the parquet marked), passes the checker, and is still rejected without it."""
    source = layout(tmp_path / "in")
    rows = shard(source, tmp_path / "out", "--unlabelled")
    assert len(rows) == expected and all(row["text"] is None for row in rows)
    assert is_unlabelled(tmp_path / "out" / "metadata_pool.parquet")
    assert is_unlabelled(tmp_path / "out" / "metadata_core.parquet")
    assert check_folder(str(tmp_path / "out")) == []
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["untranscribed"] == expected and summary["core"] == expected
    with pytest.raises(SystemExit) as exit_info:  # without the option nothing is usable
        shard(source, tmp_path / "labelled")
    assert exit_info.value.code != 0


def test_transcribed_shards_are_not_marked(make_shard_dir):
    assert not is_unlabelled(make_shard_dir(num_samples=3) / "metadata_pool.parquet")


def test_finetune_loader_refuses_unlabelled_shards_and_pretraining_reads_them(tmp_path, tokenizer_file):
    """require_text (finetuning) names the folder and the option; require_text=False reads every sample."""
    shard(audio_only_folder(tmp_path / "in"), tmp_path / "out", "--unlabelled")
    parquet = str(tmp_path / "out" / "metadata_pool.parquet")
    config = SpeechLoaderConfig(max_batch_seconds=10.0)
    with pytest.raises(ValueError, match=r"out holds untranscribed speech .*--unlabelled.*recipes/pretrain"):
        make_speech_loader(parquet, tokenizer_file, config)
    loader = make_speech_loader(parquet, tokenizer_file, config, require_text=False)
    ids = [key for batch in loader for key in batch.id]
    assert sorted(ids) == ["spk_u0", "spk_u1", "spk_u2"]
