"""local/corpus_readers.py: format detection, stable sanitized keys, line-level rejects."""

import pytest

from local.corpus_readers import detect_format, read_corpus, sanitize_key


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
    with pytest.raises(ValueError, match="'path' and 'text'"):
        read_corpus(str(tmp_path / "m.tsv"))
