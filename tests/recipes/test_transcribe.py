"""Using a trained model: transcribe.py on files, folders and manifests; export.py to SpeechBrain."""

import json
import re
import shutil

import numpy as np
import pytest
import soundfile as sf

from common.inference import length_batches, split_at_silences
from recipes.finetune import export, transcribe

RATE = 16000


def manifest_with_absolute_paths(speech_corpus, folder, split="test", count=5):
    """The first ``count`` lines of the corpus' ``split`` manifest, audio paths made absolute."""
    records = [json.loads(line) for line in open(speech_corpus / f"{split}.jsonl", encoding="utf-8")][:count]
    for record in records:
        record["audio"] = str(speech_corpus / record["audio"])
    path = folder / "some.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path, records


def printed(capsys):
    """{key: hypothesis} of transcribe.py's standard output, and the keys in order (lines without a
    tab are log lines: a handler installed by an earlier import may write to stdout)."""
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines() if "\t" in line]
    return dict(lines), [key for key, _ in lines]


def test_a_manifest_a_file_and_broken_inputs_are_transcribed_in_order_and_scored(
        trained, speech_corpus, tmp_path, capsys, caplog):
    """Every readable recording is printed once, in input order, and written to --output; an
    undecodable file, a missing file and a missing folder are each named and skipped, and the exit
    status stays 0; the manifest's transcripts are scored."""
    manifest, records = manifest_with_absolute_paths(speech_corpus, tmp_path)
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF not really audio")
    single = tmp_path / "single.flac"
    sf.write(single, sf.read(records[0]["audio"])[0], RATE)
    out = tmp_path / "hyps.jsonl"
    status = transcribe.main([str(trained), str(manifest), str(single), str(broken), str(tmp_path / "gone.wav"),
                              str(tmp_path / "no_folder"), "--output", str(out), "--ctc_greedy"])
    hyps, order = printed(capsys)
    assert status == 0
    assert order == [r["id"] for r in records] + ["single"]
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(w["key"], w["text"]) for w in written] == [(key, hyps[key]) for key in order]
    assert written[0]["reference"] == records[0]["text"] and "reference" not in written[-1]
    log = caplog.text
    for name, reason in (("broken", "undecodable_audio"), ("gone", "missing_audio"), ("no_folder", "missing_input")):
        assert name in log and reason in log, (name, reason)
    assert "skipped 3" in log and f"against the inputs' transcripts ({len(records)}): WER" in log


def test_nothing_readable_exits_non_zero(trained, tmp_path, caplog):
    (tmp_path / "junk.wav").write_bytes(b"junk")
    assert transcribe.main([str(trained), str(tmp_path / "junk.wav")]) == 1
    assert "nothing was transcribed" in caplog.text


def test_a_recording_longer_than_the_model_saw_is_cut_and_its_pieces_joined(trained, speech_corpus, tmp_path,
                                                                             capsys):
    """Three utterances joined by pauses, with the model's max_duration set just above the longest
    utterance: the recording is cut twice, each time in silence, and its line is the three pieces' texts
    (each piece decoded on its own) joined in order."""
    _, records = manifest_with_absolute_paths(speech_corpus, tmp_path, count=3)
    pause = np.zeros(int(0.6 * RATE), dtype="float32")
    parts = [sf.read(r["audio"], dtype="float32")[0] for r in records]
    recording = np.concatenate([parts[0], pause, parts[1], pause, parts[2]])
    sf.write(tmp_path / "long.wav", recording, RATE)
    limit = max(len(p) for p in parts) / RATE + 0.5
    pieces = split_at_silences(recording, limit)
    peak = np.abs(recording).max()
    assert len(pieces) == 3 and all(np.abs(recording[cut - 200:cut + 200]).max() < 0.01 * peak for _, cut in pieces[:2])
    for index, (start, end) in enumerate(pieces):
        sf.write(tmp_path / f"piece{index}.wav", recording[start:end], RATE)
    exp = tmp_path / "exp"
    shutil.copytree(trained, exp)
    config = exp / "hyperparams.yaml"
    text, count = re.subn(r"max_duration: [0-9.]+", f"max_duration: {limit}", config.read_text())
    assert count == 1
    config.write_text(text)
    transcribe.main([str(exp), str(tmp_path / "long.wav"), *[str(tmp_path / f"piece{i}.wav") for i in range(3)],
                     "--ctc_greedy", "--max_batch_size", "1", "--raw_audio"])  # the codec would move the cuts
    hyps, _ = printed(capsys)
    assert hyps["long"] == " ".join(h for h in (hyps["piece0"], hyps["piece1"], hyps["piece2"]) if h)


def test_cuts_fall_in_the_pauses_and_no_piece_is_longer_than_allowed():
    """Noise bursts separated by silences: every cut lands inside a silence, the pieces tile the
    recording and none exceeds the limit; a recording that fits stays whole."""
    rng = np.random.default_rng(0)
    burst, gap = int(1.5 * RATE), int(0.4 * RATE)
    samples = np.concatenate([np.concatenate([rng.normal(0, 0.3, burst), np.zeros(gap)]) for _ in range(6)])
    ranges = split_at_silences(samples, max_seconds=4.0)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(samples)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(end - start <= 4.0 * RATE for start, end in ranges) and len(ranges) >= 3
    for _, cut in ranges[:-1]:
        assert cut % (burst + gap) >= burst, cut  # inside a gap
    assert split_at_silences(samples[:RATE], max_seconds=4.0) == [(0, RATE)]


def test_batches_keep_the_padded_budget_and_cover_every_item_once():
    lengths = [5, 1, 9, 3, 3, 7, 2, 8, 20]
    batches = length_batches(lengths, max_batch_samples=16, max_batch_size=3)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= 3 and (len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 16)
    assert batches[0] == [8]  # longer than the budget: alone


def test_the_exported_folder_loads_in_speechbrain_and_transcribes_as_transcribe_py(
        trained, speech_corpus, tmp_path, capsys):
    """export.py writes a folder that EncoderDecoderASR.from_hparams loads; its transcribe_file gives
    the same text as transcribe.py (one recording per batch, beam search, --raw_audio as SpeechBrain reads
    it) on 16 kHz files, and some
    of those texts are not empty (the comparison is not between blanks)."""
    from speechbrain.inference.ASR import EncoderDecoderASR

    out = tmp_path / "exported"
    assert export.main([str(trained), str(out)]) == 0
    for name in ("hyperparams.yaml", "asr.ckpt", "normalizer.ckpt", "tokenizer.ckpt", "README.md"):
        assert (out / name).is_file(), name
    assert not re.search(r"![a-z]+:common\.", (out / "hyperparams.yaml").read_text())  # SpeechBrain classes only
    _, records = manifest_with_absolute_paths(speech_corpus, tmp_path, count=4)
    files = [r["audio"] for r in records]
    transcribe.main([str(trained), *files, "--max_batch_size", "1", "--raw_audio"])
    ours, order = printed(capsys)
    asr = EncoderDecoderASR.from_hparams(source=str(out), savedir=str(tmp_path / "loaded"))
    theirs = {key: asr.transcribe_file(path) for key, path in zip(order, files)}
    assert theirs == ours
    assert any(text.strip() for text in ours.values())


def test_resuming_an_experiment_with_another_tokenizer_stops_before_any_work(trained, speech_shards, tmp_path):
    """The trained experiment's lock.json names its tokenizer; rerunning its training with another
    tokenizer (same size, other pieces) raises before a batch is read, and the checkpoints stay."""
    from common.fingerprint import ChangedInputs
    from local import train_tokenizer
    from recipes.finetune import train
    from tests.recipes.finetune_args import train_argv

    exp = tmp_path / "exp"
    shutil.copytree(trained, exp)
    texts = train_tokenizer.read_texts([str(speech_shards["train"])])
    other = train_tokenizer.train_tokenizer(texts, str(tmp_path / "tok"), 60, "unigram")
    before = sorted(p.name for p in (exp / "save").iterdir())
    with pytest.raises(ChangedInputs, match="tokenizer_file"):
        train.main(train_argv(speech_shards, other, exp, "--number_of_epochs=7"))
    assert sorted(p.name for p in (exp / "save").iterdir()) == before


def test_each_recording_goes_through_the_opus_codec_unless_raw_audio_is_asked(trained, speech_corpus, tmp_path,
                                                                              capsys, monkeypatch):
    """By default every recording passes through the shards' Opus codec (once each) before decoding,
    as the training audio did; with --raw_audio the codec is not used."""
    _, records = manifest_with_absolute_paths(speech_corpus, tmp_path, count=3)
    coded = []
    real_encode = transcribe.encode_opus
    monkeypatch.setattr(transcribe, "encode_opus", lambda samples: coded.append(len(samples)) or real_encode(samples))
    files = [r["audio"] for r in records]
    assert transcribe.main([str(trained), *files, "--ctc_greedy", "--raw_audio"]) == 0 and coded == []
    assert transcribe.main([str(trained), *files, "--ctc_greedy"]) == 0
    assert len(coded) == 3 and len(printed(capsys)[0]) == 3
