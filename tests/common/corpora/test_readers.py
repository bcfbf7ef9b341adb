"""common/corpora/readers.py: format detection, the real layouts corpora ship in, stable sanitized keys,
line-level rejects."""

import json

import pyarrow.parquet as pq
import pytest

from common.corpora.readers import detect_format, read_corpus, sanitize_key
from local import make_shards
from tests.conftest import write_tone


def wenet_list(folder):
    """A WeNet / CosyVoice data.list: a JSON object a line with key, wav and txt."""
    for name in ("a1", "a2"):
        write_tone(folder / f"{name}.wav", 1.0)
    lines = [{"key": "a1", "wav": str(folder / "a1.wav"), "txt": "first one"},
             {"key": "a2", "wav": "a2.wav", "txt": "second one"}]
    path = folder / "data.list"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def commonvoice_tsv(folder):
    """A Common Voice release split: TSV with client_id, path, sentence, ...; the audio in clips/."""
    (folder / "clips").mkdir()
    for name in ("cv_1.mp3", "cv_2.mp3"):
        write_tone(folder / "clips" / name, 1.0, format="MP3")
    header = "client_id\tpath\tsentence\tup_votes\tdown_votes\tage\tgender\taccents\tlocale\tsegment\n"
    rows = "c0ffee\tcv_1.mp3\tHello there.\t2\t0\t\t\t\ten\t\nbeef\tcv_2.mp3\tGood bye!\t3\t0\t\t\t\ten\t\n"
    path = folder / "train.tsv"
    path.write_text(header + rows)
    return path


def librispeech_folder(folder):
    """SPEAKER/CHAPTER/SPEAKER-CHAPTER.trans.txt beside SPEAKER-CHAPTER-UTT.flac files."""
    chapter = folder / "19" / "198"
    chapter.mkdir(parents=True)
    for utt in ("19-198-0000", "19-198-0001"):
        write_tone(chapter / f"{utt}.flac", 1.0)
    (chapter / "19-198.trans.txt").write_text("19-198-0000 NORTHANGER ABBEY\n19-198-0001 CHAPTER ONE\n")
    return folder


@pytest.mark.parametrize("layout", ["wenet", "commonvoice", "librispeech"])
def test_each_real_layout_is_detected_read_and_sharded(layout, tmp_path):
    """A WeNet data.list, a Common Voice TSV and a LibriSpeech folder are told apart from their
    contents, read with their keys, transcripts and speakers, and make_shards turns each into shards
    holding every utterance."""
    (tmp_path / "in").mkdir()
    make = {"wenet": wenet_list, "commonvoice": commonvoice_tsv, "librispeech": librispeech_folder}[layout]
    source = make(tmp_path / "in")
    assert detect_format(str(source)) == layout
    entries, rejects = read_corpus(str(source))
    expected = {"wenet": {"a1": ("first one", None), "a2": ("second one", None)},
                "commonvoice": {"cv_1": ("Hello there.", "c0ffee"), "cv_2": ("Good bye!", "beef")},
                "librispeech": {"19-198-0000": ("NORTHANGER ABBEY", "19"), "19-198-0001": ("CHAPTER ONE", "19")}}
    assert {e.key: (e.text, e.fields.get("speaker")) for e in entries} == expected[layout] and rejects == []
    make_shards.main([str(source), str(tmp_path / "shards"), "--jobs", "1"])
    pool = pq.read_table(tmp_path / "shards" / "metadata_pool.parquet").to_pydict()
    assert sorted(pool["sample_key"]) == sorted(expected[layout])


def test_field_options_name_a_manifests_fields(tmp_path):
    """A JSONL with other field names is read with --audio-field / --text-field / --id-field /
    --speaker-field (make_shards passes them through); without them every line is a reject."""
    write_tone(tmp_path / "x.wav", 1.0)
    (tmp_path / "m.jsonl").write_text(json.dumps({"uid": "u7", "file": "x.wav", "words": "hi", "who": "s3"}) + "\n")
    entries, _ = read_corpus(str(tmp_path / "m.jsonl"), audio="file", text="words", key="uid", speaker="who")
    assert [(e.key, e.text, e.fields["speaker"]) for e in entries] == [("u7", "hi", "s3")]
    assert entries[0].audio == str(tmp_path / "x.wav")
    assert read_corpus(str(tmp_path / "m.jsonl"))[1][0]["reason"] == "malformed_line"
    make_shards.main([str(tmp_path / "m.jsonl"), str(tmp_path / "shards"), "--jobs", "1", "--audio-field", "file",
                      "--text-field", "words", "--id-field", "uid", "--speaker-field", "who"])
    pool = pq.read_table(tmp_path / "shards" / "metadata_pool.parquet").to_pydict()
    assert (pool["sample_key"], pool["speaker"]) == (["u7"], ["s3"])


def test_transcripts_are_optional_when_asked(tmp_path):
    """text_required=False keeps a manifest line, a Kaldi utterance and a folder's audio without a
    transcript (text None) instead of rejecting them."""
    write_tone(tmp_path / "x.wav", 1.0)
    (tmp_path / "m.jsonl").write_text(json.dumps({"audio": "x.wav"}) + "\n")
    assert [e.text for e in read_corpus(str(tmp_path / "m.jsonl"), text_required=False)[0]] == [None]
    assert read_corpus(str(tmp_path / "m.jsonl"))[1][0]["reason"] == "empty_text"
    assert [(e.key, e.text) for e in read_corpus(str(tmp_path), "folder", text_required=False)[0]] == [("x", None)]


def test_format_is_detected_from_the_input(tmp_path):
    """.jsonl/.tsv files by extension; folders by the presence of wav.scp."""
    (tmp_path / "kaldi").mkdir()
    (tmp_path / "kaldi" / "wav.scp").write_text("")
    (tmp_path / "audio").mkdir()
    assert [detect_format(str(tmp_path / p)) for p in ("a.jsonl", "a.tsv", "kaldi", "audio")] == [
        "jsonl", "tsv", "kaldi", "folder"]
    with pytest.raises(ValueError, match="--format"):
        detect_format(str(tmp_path / "a.csv"))


def test_keys_are_shard_safe():
    """Dots and slashes would break webdataset's member grouping: they become underscores."""
    assert sanitize_key("spk1/utt.01 b") == "spk1_utt_01_b"


def test_kaldi_pipes_are_rejected_with_the_fix(tmp_path):
    """wav.scp commands are never run: the utterance is rejected, naming what to do instead."""
    (tmp_path / "wav.scp").write_text("u1 flac -c -d u1.flac |\nu2 u2.wav\n")
    (tmp_path / "text").write_text("u1 one\nu2 two\n")
    entries, rejects = read_corpus(str(tmp_path))
    assert [e.key for e in entries] == ["u2"]
    assert rejects[0]["reason"] == "pipe_not_supported" and "sox" in rejects[0]["detail"]


def test_tsv_rows_with_the_wrong_column_count_are_rejected(tmp_path):
    """A TSV row that does not match the header is a malformed_line reject naming its line."""
    (tmp_path / "m.tsv").write_text("path\ttext\na.wav\thello\nb.wav\n")
    entries, rejects = read_corpus(str(tmp_path / "m.tsv"))
    assert len(entries) == 1
    assert (rejects[0]["origin"], rejects[0]["reason"]) == ("m.tsv:3", "malformed_line")


def test_tsv_without_the_required_columns_is_an_error(tmp_path):
    """The header must name path and text: otherwise nothing can be read, and the error says so."""
    (tmp_path / "m.tsv").write_text("file\twords\na.wav\thello\n")
    with pytest.raises(ValueError, match="'path' and 'text' columns"):
        read_corpus(str(tmp_path / "m.tsv"))


def test_keys_of_id_less_lines_do_not_depend_on_where_the_corpus_sits(tmp_path):
    """Without an id, a line's key is its audio path relative to the manifest's folder (absolute or
    relative as written), or the file stem for audio outside that folder."""
    (tmp_path / "corpus" / "wav").mkdir(parents=True)
    lines = [{"audio": "wav/a.wav", "text": "x"}, {"audio": str(tmp_path / "corpus" / "wav" / "b.wav"), "text": "y"},
             {"audio": str(tmp_path / "elsewhere" / "c.flac"), "text": "z"}]
    (tmp_path / "corpus" / "m.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    entries, _ = read_corpus(str(tmp_path / "corpus" / "m.jsonl"))
    assert [e.key for e in entries] == ["wav_a", "wav_b", "c"]
