"""local/make_text_shards.py: mono / paired text -> text shards and their metadata; bad lines rejected."""

import json
import os

import pyarrow as pa
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


def shard_rows(metadata):
    """Every row of the shards of a metadata parquet, in shard order."""
    names = pq.read_table(metadata)["shard_name"].unique().to_pylist()
    return pa.concat_tables([pq.read_table(metadata.parent / name) for name in names]).to_pylist()


def run(tmp_path, name, data, *options):
    source = tmp_path / name
    source.write_bytes(data)
    out = tmp_path / "text" / (source.stem + ".parquet")
    make_text_shards.main([str(source), str(out), *options])
    rejects = [json.loads(line) for line in open(out.with_suffix(".rejects.jsonl"), encoding="utf-8")]
    return out, shard_rows(out), rejects


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


def test_sentences_stream_into_shards_whose_metadata_lists_each_key_once(tmp_path):
    """25 lines, --shard-sentences 7: shards of 7, 7, 7, 4 sentences; the metadata holds each key once
    with its shard and character count, in shard order; a rerun over a shorter input removes the
    shards it no longer writes."""
    lines = "".join(f"sentence number {i}\n" for i in range(25)).encode()
    out, rows, _ = run(tmp_path, "many.txt", lines, "--shard-sentences", "7")
    metadata = pq.read_table(out).to_pylist()
    assert [m["sample_key"] for m in metadata] == [r["sample_key"] for r in rows] and len(rows) == 25
    assert [m["shard_name"] for m in metadata] == [f"many-{i // 7:06d}.parquet" for i in range(25)]
    assert [m["chars"] for m in metadata] == [len(r["text"]) for r in rows]
    out, rows, _ = run(tmp_path, "many.txt", lines[: lines.index(b"sentence number 10")], "--shard-sentences", "7")
    assert len(rows) == 10 and sorted(p.name for p in out.parent.glob("many-*.parquet")) == [
        "many-000000.parquet", "many-000001.parquet"]


@pytest.mark.parametrize("stalled_write", ["*-000001.parquet", "*.rejects.jsonl"])
def test_rerun_after_kill_9_gives_the_uninterrupted_output(tmp_path, stalled_write):
    """kill -9 with the second shard (or then the rejects file) complete under its temporary name only:
    the rerun keeps the complete shards of the killed run (not rewritten), writes the rest, and ends with
    exactly the files of an uninterrupted run and no temporary file."""
    source = tmp_path / "pairs.txt"
    source.write_bytes(b"".join(PAIRED_LINES))
    options = ["--paired", "--lang", "en", "--tgt-lang", "fr", "--max-chars", "100", "--shard-sentences", "1"]
    reference = tmp_path / "reference" / "pairs.parquet"
    make_text_shards.main([str(source), str(reference), *options])
    out = tmp_path / "killed" / "pairs.parquet"
    command = ["local/make_text_shards.py", source, out, *options]
    kill_at_rename(command, stalled_write, 1, tmp_path / "stalled")
    stalled = "pairs-000001.parquet" if stalled_write != "*.rejects.jsonl" else "pairs.rejects.jsonl"
    assert stalled in temporary_files(out.parent) and not out.exists()
    first_shard = out.parent / "pairs-000000.parquet"
    written_at = first_shard.stat().st_mtime_ns
    run_to_the_end(command)
    assert temporary_files(out.parent) == [] and first_shard.stat().st_mtime_ns == written_at
    assert sorted(os.listdir(out.parent)) == sorted(os.listdir(reference.parent))
    for name in os.listdir(reference.parent):
        if name.endswith(".parquet"):
            assert pq.read_table(out.parent / name).equals(pq.read_table(reference.parent / name)), name
        else:
            assert (out.parent / name).read_bytes() == (reference.parent / name).read_bytes(), name
