"""local/make_text_shards.py: mono / paired text -> the text loader's parquet; bad lines rejected."""

import json

import pyarrow.parquet as pq
import pytest

from common.data import TextLoaderConfig, make_text_loader
from common.data.synthetic import train_tiny_tokenizer
from local import make_text_shards
from tests.local.test_extract_units import kill_at_rename, run_to_the_end, temporary_files

PAIRED_LINES = [
    b"the cat sat\tthe mat sat\n",          # ok
    b"a dog  ran\t  a   tree ran \n",      # ok, whitespace collapsed
    b"no target here\n",                    # missing_target
    b"one\ttwo\tthree\n",                   # extra_fields
    b"the cat sat\tthe mat sat\n",          # duplicate
    b"\xff\xfe bad bytes\tx\n",             # not_utf8
    b"\t the house\n",                      # empty_text
    b"big " * 30 + b"\tsmall\n",            # too_long (--max-chars 100)
]


def run(tmp_path, name, data, *options):
    source = tmp_path / name
    source.write_bytes(data)
    out = tmp_path / "text" / (source.stem + ".parquet")
    make_text_shards.main([str(source), str(out), *options])
    rejects = [json.loads(line) for line in open(out.with_suffix(".rejects.jsonl"), encoding="utf-8")]
    return out, pq.read_table(out).to_pylist(), rejects


def test_paired_lines_keep_good_pairs_and_reject_each_bad_line_with_its_reason(tmp_path):
    """2 of 8 lines kept (cleaned, tagged en/fr); the 6 others rejected with the expected reasons."""
    _, rows, rejects = run(tmp_path, "pairs.txt", b"".join(PAIRED_LINES), "--paired", "--lang", "en",
                           "--tgt-lang", "fr", "--max-chars", "100")
    assert [(r["text"], r["translation"], r["lang"], r["tgt_lang"]) for r in rows] == [
        ("the cat sat", "the mat sat", "en", "fr"), ("a dog ran", "a tree ran", "en", "fr")]
    assert [(r["line"], r["reason"]) for r in rejects] == [
        (3, "missing_target"), (4, "extra_fields"), (5, "duplicate"), (6, "not_utf8"),
        (7, "empty_text"), (8, "too_long")]
    assert len({r["sample_key"] for r in rows}) == 2


def test_mono_jsonl_and_text_loader_round_trip(tmp_path):
    """A jsonl manifest's text field becomes mono text; make_text_loader batches every sentence once."""
    lines = [json.dumps({"text": t}) for t in ("the cat sat", "a dog ran on the mat", "the tree")]
    out, rows, rejects = run(tmp_path, "mono.jsonl", ("\n".join(lines + ["{oops"]) + "\n").encode(),
                             "--lang", "en")
    assert [r["translation"] for r in rows] == [None] * 3 and rejects[0]["reason"] == "malformed_json"
    tokenizer = train_tiny_tokenizer(tmp_path)
    loader = make_text_loader(str(out), str(tokenizer), TextLoaderConfig(100), lang_column="lang")
    texts = sorted(text for batch in loader for text in batch.text)
    assert texts == sorted(r["text"] for r in rows)


def test_paired_jsonl_fields_become_source_and_target(tmp_path):
    """--src-field translation --tgt-field text swaps a speech manifest into a translation pair."""
    line = json.dumps({"text": "the cat", "translation": "ethay atcay"}) + "\n"
    _, rows, _ = run(tmp_path, "st.jsonl", line.encode(), "--paired", "--src-field", "translation",
                     "--tgt-field", "text")
    assert (rows[0]["text"], rows[0]["translation"]) == ("ethay atcay", "the cat")


def test_a_tsv_without_paired_is_a_usage_error(tmp_path):
    """A .tsv holds pairs: without --paired the tool exits 2 instead of keeping tabs in the text."""
    (tmp_path / "x.tsv").write_text("a\tb\n")
    with pytest.raises(SystemExit) as exit_info:
        make_text_shards.main([str(tmp_path / "x.tsv"), str(tmp_path / "x.parquet")])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("stalled_write", ["*.parquet", "*.rejects.jsonl"])
def test_rerun_after_kill_9_gives_the_uninterrupted_output(tmp_path, stalled_write):
    """kill -9 with the parquet (or then the rejects file) complete under its temporary name only:
    the rerun writes both exactly as an uninterrupted run does and leaves no temporary file."""
    source = tmp_path / "pairs.txt"
    source.write_bytes(b"".join(PAIRED_LINES))
    options = ["--paired", "--lang", "en", "--tgt-lang", "fr", "--max-chars", "100"]
    reference = tmp_path / "reference" / "pairs.parquet"
    make_text_shards.main([str(source), str(reference), *options])
    out = tmp_path / "killed" / "pairs.parquet"
    command = ["local/make_text_shards.py", source, out, *options]
    kill_at_rename(command, stalled_write, 1, tmp_path / "stalled")
    assert temporary_files(out.parent) == [out.name if stalled_write == "*.parquet" else
                                           out.with_suffix(".rejects.jsonl").name]
    assert not out.with_suffix(".rejects.jsonl").exists()
    run_to_the_end(command)
    assert temporary_files(out.parent) == []
    assert pq.read_table(out).equals(pq.read_table(reference))
    assert (out.with_suffix(".rejects.jsonl").read_bytes()
            == reference.with_suffix(".rejects.jsonl").read_bytes())
