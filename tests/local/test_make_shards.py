"""local/make_shards.py: every layout, audio conversion, resume after kill -9, bad input, the parquet."""

import json
import os
import signal
import subprocess
import sys
import tarfile
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from common.audio_io import decode_opus
from common.shard_format import METADATA_SCHEMA
from local import make_shards
from local.check_shards import check_folder
from tests.conftest import tone_corpus, write_manifest, write_tone

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args):
    make_shards.main([str(a) for a in args] + ["--jobs", "1"])


def pool_rows(out):
    return pq.read_table(out / "metadata_pool.parquet").to_pylist()


def rejects(out):
    with open(out / "rejects.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def tar_samples(out):
    """{key: (shard name, json dict)} read back from the tars themselves."""
    found = {}
    for name in sorted(f for f in os.listdir(out) if f.endswith(".tar")):
        with tarfile.open(out / name) as tar:
            for info in tar:
                key, _, ext = info.name.partition(".")
                if ext == "json":
                    found[key] = (name, json.loads(tar.extractfile(info).read()))
    return found


def test_jsonl_layout_carries_fields_and_passes_the_checker(tmp_path):
    """Every JSONL entry becomes a sample whose json keeps text, speaker, lang and extra fields."""
    write_tone(tmp_path / "a.wav", 1.0)
    write_tone(tmp_path / "b.wav", 2.0)
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": "a", "audio": "a.wav", "text": "hello", "speaker": "s1", "lang": "en",
         "translation": "hallo"},
        {"audio": "b.wav", "text": "world"}])
    run([manifest, tmp_path / "out"])
    samples = tar_samples(tmp_path / "out")
    assert set(samples) == {"a", "b"}
    assert samples["a"][1]["translation"] == "hallo" and samples["a"][1]["speaker"] == "s1"
    row = {r["sample_key"]: r for r in pool_rows(tmp_path / "out")}["a"]
    assert (row["speaker"], row["lang"], json.loads(row["extra"])) == ("s1", "en", {"translation": "hallo"})
    assert check_folder(str(tmp_path / "out")) == []


def test_tsv_layout(tmp_path):
    """A TSV with a header (path, text, extra columns) gives one sample per row."""
    write_tone(tmp_path / "x.flac", 1.0, format="FLAC")
    (tmp_path / "m.tsv").write_text("id\tpath\ttext\tspeaker\nx1\tx.flac\tsome words\tbob\n")
    run([tmp_path / "m.tsv", tmp_path / "out"])
    assert tar_samples(tmp_path / "out")["x1"][1]["speaker"] == "bob"


def test_kaldi_layout_with_segments_and_utt2spk(tmp_path):
    """Kaldi segments cut one recording into utterances of the declared lengths, speakers carried."""
    write_tone(tmp_path / "rec.wav", 4.0)
    (tmp_path / "wav.scp").write_text(f"rec1 {tmp_path / 'rec.wav'}\n")
    (tmp_path / "segments").write_text("u1 rec1 0.0 1.5\nu2 rec1 2.0 3.25\n")
    (tmp_path / "text").write_text("u1 first part\nu2 second part\n")
    (tmp_path / "utt2spk").write_text("u1 spk\nu2 spk\n")
    run([tmp_path, tmp_path / "out"])
    rows = {r["sample_key"]: r for r in pool_rows(tmp_path / "out")}
    assert rows["u1"]["duration"] == pytest.approx(1.5, abs=0.01)
    assert rows["u2"]["duration"] == pytest.approx(1.25, abs=0.01)
    assert rows["u2"]["text"] == "second part" and rows["u2"]["speaker"] == "spk"


def test_folder_layout(tmp_path):
    """A folder of audio with same-named .txt files; keys come from the relative path."""
    (tmp_path / "corpus" / "sub").mkdir(parents=True)
    write_tone(tmp_path / "corpus" / "sub" / "one.wav", 1.0)
    (tmp_path / "corpus" / "sub" / "one.txt").write_text("the first\n")
    run([tmp_path / "corpus", tmp_path / "out"])
    assert tar_samples(tmp_path / "out")["sub_one"][1]["text"] == "the first"


def dominant_frequency(samples, rate):
    spectrum = np.abs(np.fft.rfft(samples))
    return np.argmax(spectrum) * rate / len(samples)


@pytest.mark.parametrize("fmt,subtype", [("WAV", "PCM_16"), ("FLAC", "PCM_16"), ("OGG", "VORBIS"),
                                         ("MP3", "MPEG_LAYER_III")])
def test_resampled_and_downmixed_to_16k_mono(tmp_path, fmt, subtype):
    """A 440 Hz stereo tone at 44.1 kHz comes out 16 kHz mono at 440 Hz with its duration kept."""
    path = write_tone(tmp_path / f"tone.{fmt.lower()}", 2.0, rate=44100, channels=2, format=fmt,
                      subtype=subtype)
    write_manifest(tmp_path / "m.jsonl", [{"id": "t", "audio": path.name, "text": "a tone"}])
    run([tmp_path / "m.jsonl", tmp_path / "out"])
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        audio, rate = decode_opus(tar.extractfile("t.opus").read())
    assert rate == 16000 and audio.ndim == 1
    assert dominant_frequency(audio, rate) == pytest.approx(440, abs=3)
    assert len(audio) / rate == pytest.approx(2.0, abs=0.06)  # mp3 adds encoder padding


def test_16k_mono_opus_is_copied_and_low_rates_are_counted(tmp_path):
    """A 16 kHz mono Ogg Opus file goes into the shard byte for byte (no second lossy encoding); a 48 kHz
    Opus file and an 8 kHz wav are re-encoded; summary.json counts the 8 kHz input by its rate."""
    write_tone(tmp_path / "ready.opus", 1.0, format="OGG", subtype="OPUS")
    write_tone(tmp_path / "wide.opus", 1.0, rate=48000, format="OGG", subtype="OPUS")
    write_tone(tmp_path / "narrow.wav", 1.0, rate=8000)
    write_manifest(tmp_path / "m.jsonl", [{"id": name, "audio": f"{name}.{ext}", "text": "a tone"} for name, ext in
                                          (("ready", "opus"), ("wide", "opus"), ("narrow", "wav"))])
    run([tmp_path / "m.jsonl", tmp_path / "out"])
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        members = {name: tar.extractfile(f"{name}.opus").read() for name in ("ready", "wide", "narrow")}
    assert members["ready"] == (tmp_path / "ready.opus").read_bytes()
    assert members["wide"] != (tmp_path / "wide.opus").read_bytes() and decode_opus(members["wide"])[1] == 16000
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["last_run"]["inputs_below_16k_by_rate"] == {"8000": 1}


def test_bitrate_sets_the_opus_size_and_a_bad_one_is_a_usage_error(tmp_path):
    """--bitrate 64 makes shards of noisy audio several times larger than --bitrate 12 (the bytes follow
    the requested rate, within VBR's spread); a rate Opus cannot do is exit 2 before any work."""
    write_tone(tmp_path / "a.wav", 4.0)
    write_manifest(tmp_path / "m.jsonl", [{"id": "a", "audio": "a.wav", "text": "a tone"}])
    sizes = {}
    for kbps in (12, 64):
        run([tmp_path / "m.jsonl", tmp_path / f"out{kbps}", "--bitrate", kbps])
        sizes[kbps] = pool_rows(tmp_path / f"out{kbps}")[0]["opus_size"] * 8 / 4.0 / 1000  # kbit/s
    assert 8 < sizes[12] < 18 and 45 < sizes[64] < 85, sizes
    with pytest.raises(SystemExit) as exit_info:
        run([tmp_path / "m.jsonl", tmp_path / "bad", "--bitrate", 500])
    assert exit_info.value.code == 2 and not (tmp_path / "bad").exists()


def test_duration_round_trips_through_opus(make_shard_dir):
    """The parquet duration equals both the source length and the decoded Opus length within 20 ms."""
    out = make_shard_dir(num_samples=6)
    for row in pool_rows(out):
        with tarfile.open(out / row["shard_name"]) as tar:
            audio, rate = decode_opus(tar.extractfile(row["sample_key"] + ".opus").read())
        source_s = sf.info(row["source"]).duration
        assert abs(len(audio) / rate - row["duration"]) < 0.02
        assert abs(source_s - row["duration"]) < 0.02


def test_parquet_schema_and_offsets_locate_members(make_shard_dir):
    """The pool parquet has the documented schema; its offsets point at the members' bytes."""
    out = make_shard_dir(num_samples=5)
    table = pq.read_table(out / "metadata_pool.parquet")
    assert table.schema.equals(METADATA_SCHEMA)
    row = table.to_pylist()[3]
    with open(out / row["shard_name"], "rb") as handle:
        handle.seek(row["json_offset"])
        assert json.loads(handle.read(row["json_size"]))["text"] == row["text"]


def test_shards_respect_the_size_limit_and_keep_input_order(make_shard_dir):
    """No shard is larger than --shard-size; samples appear in input order across shards."""
    out = make_shard_dir(num_samples=20, shard_size_mb=0.03)
    tars = sorted(f for f in os.listdir(out) if f.endswith(".tar"))
    assert len(tars) > 3
    assert all(os.path.getsize(out / t) <= 0.03e6 for t in tars)
    assert [r["sample_key"] for r in pool_rows(out)] == [f"utt{i:05d}" for i in range(20)]


def test_core_parquet_applies_duration_and_key_filters(tmp_path):
    """metadata_core keeps only rows within the duration bounds and, if given, the key list."""
    manifest = tone_corpus(tmp_path / "c", 10, min_s=0.3, max_s=3.0)
    (tmp_path / "keys.txt").write_text("utt00001\nutt00002\nutt00003\n")
    run([manifest, tmp_path / "out", "--core-min-duration", "1.0", "--core-keys", tmp_path / "keys.txt"])
    core = pq.read_table(tmp_path / "out" / "metadata_core.parquet").to_pylist()
    assert {r["sample_key"] for r in core} <= {"utt00001", "utt00002", "utt00003"}
    assert all(r["duration"] >= 1.0 for r in core)
    pool = {r["sample_key"]: r["duration"] for r in pool_rows(tmp_path / "out")}
    assert {k for k in ("utt00001", "utt00002", "utt00003") if pool[k] >= 1.0} == {
        r["sample_key"] for r in core}


def make_bad_corpus(folder):
    """A manifest mixing two good entries with one entry of every bad kind; returns (path, good keys)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_tone(folder / "good1.wav", 1.0)
    write_tone(folder / "good2.wav", 1.5)
    write_tone(folder / "long.wav", 5.0)
    write_tone(folder / "cut.wav", 2.0)
    data = (folder / "cut.wav").read_bytes()
    (folder / "cut.wav").write_bytes(data[:len(data) // 2])
    (folder / "empty.wav").write_bytes(b"")
    (folder / "junk.wav").write_bytes(b"this is not audio" * 50)
    sf.write(folder / "zero.wav", np.zeros((0,), np.float32), 16000)
    lines = [json.dumps({"id": "good1", "audio": "good1.wav", "text": "fine"}),
             json.dumps({"id": "good2", "audio": "good2.wav", "text": "also fine"}),
             json.dumps({"id": "missing", "audio": "nowhere.wav", "text": "x"}),
             json.dumps({"id": "empty", "audio": "empty.wav", "text": "x"}),
             json.dumps({"id": "junk", "audio": "junk.wav", "text": "x"}),
             json.dumps({"id": "cut", "audio": "cut.wav", "text": "x"}),
             json.dumps({"id": "zero", "audio": "zero.wav", "text": "x"}),
             json.dumps({"id": "long", "audio": "long.wav", "text": "x"}),
             json.dumps({"id": "notext", "audio": "good1.wav", "text": "  "}),
             json.dumps({"id": "good1", "audio": "good2.wav", "text": "duplicate"}),
             '{"id": "broken", "audio": ',
             ]
    body = "\n".join(lines).encode() + b'\n{"id": "latin", "audio": "good1.wav", "text": "caf\xe9"}\n'
    (folder / "m.jsonl").write_bytes(body)
    return folder / "m.jsonl", {"good1", "good2"}


def test_every_bad_entry_is_rejected_with_its_reason_and_good_ones_kept(tmp_path):
    """Bad audio, text and lines never abort the run: each lands in rejects.jsonl with its reason."""
    manifest, good = make_bad_corpus(tmp_path / "c")
    run([manifest, tmp_path / "out", "--max-duration", "4"])
    assert {r["sample_key"] for r in pool_rows(tmp_path / "out")} == good
    reasons = {r["key"] or r["origin"]: r["reason"] for r in rejects(tmp_path / "out")}
    assert reasons == {"missing": "missing_audio", "empty": "empty_audio", "junk": "undecodable_audio",
                       "cut": "truncated_audio", "zero": "zero_length_audio", "long": "too_long",
                       "notext": "empty_text", "good1": "duplicate_key",
                       "m.jsonl:11": "malformed_line", "m.jsonl:12": "non_utf8_text"}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["kept"] == 2 and summary["rejected"] == 10


def test_nothing_usable_exits_non_zero_with_the_reason(tmp_path):
    """A corpus with no usable entry fails (exit 1) naming the rejection reasons."""
    write_manifest(tmp_path / "m.jsonl", [{"audio": "missing.wav", "text": "x"}])
    result = subprocess.run([sys.executable, "local/make_shards.py", tmp_path / "m.jsonl",
                             tmp_path / "out"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 1 and "missing_audio" in result.stderr


def test_a_folder_of_another_input_is_refused(tmp_path):
    """Resuming into a folder made from a different input would mix corpora: exit 2 instead."""
    first = tone_corpus(tmp_path / "a", 2, seed=1)
    second = tone_corpus(tmp_path / "b", 3, seed=2)
    run([first, tmp_path / "out"])
    with pytest.raises(SystemExit) as raised:
        run([second, tmp_path / "out"])
    assert raised.value.code == 2



def test_rebuild_replaces_the_shards_of_an_edited_manifest(tmp_path):
    """With --rebuild (run.sh stage 0 passes it), an edited manifest (a line dropped, a transcript
    changed) reshards the folder: the parquet and the tars then hold exactly the new input."""
    manifest = tone_corpus(tmp_path / "a", 4, seed=1)
    run([manifest, tmp_path / "out", "--shard-size", "0.02"])
    with open(manifest, encoding="utf-8") as handle:
        edited = [json.loads(line) for line in handle.readlines()[:2]]
    edited[0]["text"] = "an edited transcript"
    write_manifest(manifest, edited)
    run([manifest, tmp_path / "out", "--shard-size", "0.02", "--rebuild"])
    rows = pool_rows(tmp_path / "out")
    assert sorted((r["sample_key"], r["text"]) for r in rows) == sorted((r["id"], r["text"]) for r in edited)
    assert sorted(tar_samples(tmp_path / "out")) == sorted(r["id"] for r in edited)


def shard_contents(out):
    """(shard name, key) pairs of the tars plus the parquet rows, for run-to-run comparison."""
    rows = sorted((r["shard_name"], r["sample_key"], r["opus_offset"]) for r in pool_rows(out))
    return rows, sorted(tar_samples(out).items())


def test_rerun_after_kill_9_gives_exactly_the_uninterrupted_result(tmp_path):
    """kill -9 at several points, then a rerun: same samples in the same shards, none lost or doubled."""
    manifest = tone_corpus(tmp_path / "c", 60, min_s=1.0, max_s=3.0)
    args = [sys.executable, "local/make_shards.py", str(manifest), None, "--jobs", "2",
            "--shard-size", "0.04"]
    subprocess.run(args[:3] + [str(tmp_path / "full")] + args[4:], cwd=REPO, check=True,
                   capture_output=True)
    killed = tmp_path / "killed"
    for sealed_before_kill in (0, 2, 6):
        process = subprocess.Popen(args[:3] + [str(killed)] + args[4:], cwd=REPO,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        _wait_for_sidecars(killed, sealed_before_kill, process)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    subprocess.run(args[:3] + [str(killed)] + args[4:], cwd=REPO, check=True, capture_output=True)
    assert shard_contents(killed) == shard_contents(tmp_path / "full")
    assert check_folder(str(killed)) == []


def _wait_for_sidecars(out, count, process, timeout_s=60):
    parts = out / ".parts"
    deadline = time.time() + timeout_s
    while time.time() < deadline and process.poll() is None:
        if parts.is_dir() and len([p for p in os.listdir(parts) if p.endswith(".tar.json")]) >= count:
            return
        time.sleep(0.02)


def test_kaldi_pipes_run_with_allow_pipes_and_failures_are_rejected_with_their_stderr(tmp_path):
    """With --allow-pipes a wav.scp command's output is sharded like a file (a segment of it too); a
    command that fails is a pipe_failed reject carrying its stderr, one that hangs a pipe_timeout."""
    kaldi = tmp_path / "kaldi"
    kaldi.mkdir()
    write_tone(tmp_path / "a.flac", 2.0, format="FLAC")
    (kaldi / "wav.scp").write_text(f"a cat {tmp_path / 'a.flac'} |\nbad sh -c 'echo no such >&2; exit 3' |\n"
                                   "slow sleep 5 |\n")
    (kaldi / "segments").write_text("a_1 a 0.5 1.5\nbad_1 bad 0 1\nslow_1 slow 0 1\n")
    (kaldi / "text").write_text("a_1 first half\nbad_1 never\nslow_1 never\n")
    run([kaldi, tmp_path / "out", "--allow-pipes", "--pipe-timeout", "1"])
    rows = pool_rows(tmp_path / "out")
    assert [(r["sample_key"], round(r["duration"], 2)) for r in rows] == [("a_1", 1.0)]
    reasons = {r["key"]: (r["reason"], r["detail"]) for r in rejects(tmp_path / "out")}
    assert reasons["bad_1"][0] == "pipe_failed" and "no such" in reasons["bad_1"][1]
    assert reasons["slow_1"][0] == "pipe_timeout"
    with pytest.raises(SystemExit):  # without the option commands are never run: nothing usable, exit 1
        run([kaldi, tmp_path / "out2"])
    assert {r["reason"] for r in rejects(tmp_path / "out2")} == {"pipe_not_supported"}


def test_help_names_every_input_layout(capsys):
    """--help describes every layout the readers detect: a layout added to FORMATS without its
    description fails here (the help once listed 4 of 8)."""
    described = {"jsonl": ".jsonl", "tsv": ".tsv", "kaldi": "Kaldi", "folder": "folder of audio",
                 "wenet": "WeNet", "commonvoice": "Common Voice", "librispeech": "LibriSpeech",
                 "hfparquet": "Hugging Face"}
    assert set(described) == set(make_shards.FORMATS)
    with pytest.raises(SystemExit):
        make_shards.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for layout, phrase in described.items():
        assert phrase in text, f"--help does not describe {layout}"
