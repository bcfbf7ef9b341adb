"""Bad input through the whole path: a corpus mixing good entries with every kind of bad one goes
through make_shards, finetune training and decoding; damaged shards are met during training; config
mistakes stop a run before any work."""

import ast
import json
import re
import shutil
from collections import Counter

import pyarrow.parquet as pq
import pytest

from common.audio_io import decode_opus
from common.recipe import ConfigError
from local import make_shards
from recipes.finetune import train
from tests.local.test_make_shards import make_bad_corpus
from tests.recipes.finetune_args import batch_log_lines, train_argv

ONE_AUDITED_EPOCH = ["--number_of_epochs=1", "--batch_log=True"]
MAX_DURATION_S = 4.5  # make_shards' limit: the espeak-ng utterances taken pass it, the 5 s tone does not
NUM_SPEECH = 20  # espeak-ng utterances mixed with the bad entries


def epoch_keys(exp, epoch=1):
    """Sample keys of every training batch of ``epoch`` in the batch log, with repeats."""
    return Counter(key for line in batch_log_lines(exp) if line["epoch"] == epoch for key in line["keys"])


def mixed_manifest(speech_corpus, folder):
    """A JSONL manifest of ``NUM_SPEECH`` espeak-ng utterances (absolute audio paths) followed by
    make_bad_corpus' lines (two good tones, one entry of every bad kind); returns (path, good keys,
    number of espeak-ng lines)."""
    bad_manifest, good = make_bad_corpus(folder)
    records = [json.loads(line) for line in open(speech_corpus / "train.jsonl", encoding="utf-8")]
    records = [r for r in records if r["duration"] <= MAX_DURATION_S - 0.5][:NUM_SPEECH]
    for record in records:
        record["audio"] = str(speech_corpus / record["audio"])
    path = folder / "mixed.jsonl"
    path.write_bytes("".join(json.dumps(r) + "\n" for r in records).encode() + bad_manifest.read_bytes())
    return path, good | {r["id"] for r in records}, len(records)


def test_bad_entries_are_rejected_with_reasons_and_every_good_one_is_trained_on_and_decoded(
        speech_corpus, speech_shards, tokenizer_file, tmp_path):
    """make_shards on a corpus of 22 good entries and one of every bad kind (missing, empty, undecodable,
    truncated, zero-length, too long audio; blank text, duplicate key, malformed line, non-UTF-8 text)
    completes, writes each bad entry to rejects.jsonl with its reason and a detail, and keeps exactly
    the good ones; one epoch of training on the shards trains every good sample exactly once and no
    other; decoding the same shards scores every good utterance."""
    manifest, good, num_speech = mixed_manifest(speech_corpus, tmp_path / "corpus")
    shards = tmp_path / "mixed"
    make_shards.main([str(manifest), str(shards), "--jobs", "2", "--max-duration", str(MAX_DURATION_S),
                      "--shard-size", "0.1"])
    rejects = [json.loads(line) for line in open(shards / "rejects.jsonl", encoding="utf-8")]
    assert {r["key"] or r["origin"]: r["reason"] for r in rejects} == {
        "missing": "missing_audio", "empty": "empty_audio", "junk": "undecodable_audio",
        "cut": "truncated_audio", "zero": "zero_length_audio", "long": "too_long", "notext": "empty_text",
        "good1": "duplicate_key", f"mixed.jsonl:{num_speech + 11}": "malformed_line",
        f"mixed.jsonl:{num_speech + 12}": "non_utf8_text"}
    assert all(r["detail"] for r in rejects)
    assert set(pq.read_table(shards / "metadata_pool.parquet")["sample_key"].to_pylist()) == good

    exp = tmp_path / "exp"
    folders = {"train": shards, "dev": speech_shards["dev"], "test": shards}
    # greedy CTC decodes every utterance as beam search does, in a fraction of its time on an untrained model
    train.main(train_argv(folders, tokenizer_file, exp, *ONE_AUDITED_EPOCH, "--do_test=True",
                          "--test_search=ctc_greedy"))
    assert epoch_keys(exp) == Counter(good)
    assert json.loads((exp / "results.json").read_text())["mixed"]["num_utterances"] == len(good)


def corrupt_silently(shard_folder, rows):
    """Overwrite 64 bytes in the middle of the first .opus member of ``rows`` that libsndfile still
    decodes without an error (it drops the Ogg page whose checksum fails: the audio comes out short,
    the transcript does not match it); returns that member's key."""
    for row in rows:
        with open(shard_folder / row["shard_name"], "r+b") as tar:
            tar.seek(row["opus_offset"])
            data = bytearray(tar.read(row["opus_size"]))
            data[len(data) // 2:len(data) // 2 + 64] = b"\xff" * 64
            try:
                decode_opus(bytes(data))
            except RuntimeError:  # an error at decoding is the easy case: try the next member
                continue
            tar.seek(row["opus_offset"])
            tar.write(data)
            return row["sample_key"]
    raise AssertionError("every corrupted member fails to decode: the silent case is not tested")


def damage(shard_folder):
    """Corrupt one .opus member of one tar silently and cut another tar in the middle; returns (the
    kept keys, the corrupted member's key, the keys whose .opus member lies past the cut)."""
    rows = pq.read_table(shard_folder / "metadata_pool.parquet").to_pylist()
    shards = sorted({row["shard_name"] for row in rows})
    corrupted = corrupt_silently(shard_folder, [row for row in rows if row["shard_name"] == shards[1]])
    with open(shard_folder / shards[3], "r+b") as tar:
        cut_at = tar.seek(0, 2) // 2
        tar.truncate(cut_at)
    past_cut = {row["sample_key"] for row in rows
                if row["shard_name"] == shards[3] and row["opus_offset"] + row["opus_size"] > cut_at}
    return {row["sample_key"] for row in rows} - past_cut - {corrupted}, corrupted, past_cut


def skipped_data(log_text, epoch=1):
    """The ``skipped data`` counts of the loader's end-of-epoch line in an experiment's log.txt."""
    found = re.search(rf"epoch {epoch} rank 0: .* skipped data (\{{.*?\}}|none)", log_text)
    assert found, f"no end-of-epoch line for epoch {epoch} in the log"
    return {} if found.group(1) == "none" else ast.literal_eval(found.group(1))


def test_damaged_shards_met_in_training_are_skipped_with_counted_warnings(
        speech_shards, tokenizer_file, tmp_path):
    """One epoch on shards where one .opus member is corrupted in the middle (libsndfile decodes it
    short without an error) and another tar is cut in half: training completes; the log warns about
    both (the corrupted member by its key, as decoding to another length than its metadata's) and the
    epoch line counts 1 undecodable member, 1 truncated shard and the samples past the cut as
    missing; every intact sample is trained on, no damaged one is."""
    shards = tmp_path / "train"
    shutil.copytree(speech_shards["train"], shards)
    kept, corrupted, past_cut = damage(shards)
    assert past_cut, "the cut lost no sample: the test checks nothing"
    exp = tmp_path / "exp"
    train.main(train_argv({**speech_shards, "train": shards}, tokenizer_file, exp, *ONE_AUDITED_EPOCH,
                          "--do_test=False"))
    log_text = (exp / "log.txt").read_text()
    assert re.search(rf"skipped \(undecodable\): {corrupted} in .* decodes to .* the metadata says", log_text)
    assert "skipped (truncated_shard): " in log_text
    counts = skipped_data(log_text)
    assert (counts.get("undecodable"), counts.get("truncated_shard"), counts.get("missing")) == (
        1, 1, len(past_cut)), counts
    assert set(epoch_keys(exp)) == kept


@pytest.mark.parametrize("override,message", [
    ("--max_batch_seconds=abc", r"--max_batch_seconds='abc' is of type str.*pass a float"),
    ("--train_loader={filters: {min_duration: 0.3, max_duration: ten}}",
     r"--train_loader\[filters\]\[max_duration\]='ten' is of type str.*pass a float"),
    ("--train_parquet=nowhere/metadata_pool.parquet",
     r"train_parquet: nowhere/metadata_pool.parquet does not exist: fix --train_parquet=.*make_shards"),
    ("--tokenizer_file=nowhere/bpe_60.model",
     r"tokenizer_file: nowhere/bpe_60.model does not exist: (?=.*--tokenizer_file=)(?=.*train_tokenizer)"),
    ("--test_parquets=[nowhere/metadata_pool.parquet]",
     r"test_parquets: nowhere/metadata_pool.parquet does not exist: fix --test_parquets="),
])
def test_wrong_types_and_missing_paths_fail_before_any_work(speech_shards, tokenizer_file, tmp_path,
                                                            override, message):
    """A number given as text (at the top level or in a nested mapping) and an input path that does not
    exist stop the run with a ConfigError naming the key, the value and the fix, before the experiment
    folder is created."""
    with pytest.raises(ConfigError, match=message):
        train.main(train_argv(speech_shards, tokenizer_file, tmp_path / "exp", override))  # the last value wins
    assert not (tmp_path / "exp").exists()
