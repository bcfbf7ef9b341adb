"""local/synth_corpus.py: real espeak-ng speech, deterministic, disjoint splits, held-out test voice."""

import json
import subprocess

import pytest
import soundfile as sf

from local.synth_corpus import HELD_OUT_VOICE, main, parse_args, plan_utterances


def read_split(folder, split):
    with open(folder / f"{split}.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_splits_are_disjoint_and_the_test_voice_is_held_out(speech_corpus):
    """No sentence is in two splits; only the test split uses the held-out voice."""
    splits = {s: read_split(speech_corpus, s) for s in ("train", "dev", "test")}
    texts = {s: {u["text"] for u in utts} for s, utts in splits.items()}
    assert not (texts["train"] & texts["dev"]) and not (texts["train"] & texts["test"])
    assert not (texts["dev"] & texts["test"])
    assert {u["speaker"] for u in splits["test"]} == {HELD_OUT_VOICE}
    assert HELD_OUT_VOICE not in {u["speaker"] for u in splits["train"] + splits["dev"]}


def test_audio_is_16k_mono_speech_with_the_manifest_duration(speech_corpus):
    """Each wav is 16 kHz mono, of the manifest's duration, and not silent."""
    for utterance in read_split(speech_corpus, "dev"):
        audio, rate = sf.read(speech_corpus / utterance["audio"])
        assert rate == 16000 and audio.ndim == 1
        assert abs(len(audio) / rate - utterance["duration"]) < 1e-3
        assert 0.5 < utterance["duration"] < 10 and abs(audio).max() > 0.05


def test_same_seed_same_plan_and_a_rerun_is_identical(speech_corpus, tmp_path):
    """The plan is a function of the seed, and rerunning over finished output changes nothing."""
    args = ["x", "--num-train", "40", "--num-dev", "8", "--num-test", "8"]
    assert plan_utterances(parse_args(args)) == plan_utterances(parse_args(args))
    assert plan_utterances(parse_args(args)) != plan_utterances(parse_args(args + ["--seed", "7"]))
    before = (speech_corpus / "train.jsonl").read_text()
    main([str(speech_corpus), *args[1:], "--jobs", "1"])
    assert (speech_corpus / "train.jsonl").read_text() == before


def test_a_second_run_into_a_folder_in_use_is_refused_before_it_touches_it(tmp_path):
    """While another process writes a corpus folder (its run.lock), a run into it stops with the holder's
    pid and leaves that run's half-written temporaries alone."""
    temporary = tmp_path / "wav" / "train" / "train-000000.wav.tmp"
    temporary.parent.mkdir(parents=True)
    temporary.write_bytes(b"half written")
    holder = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "run.lock").write_text(str(holder.pid))
        with pytest.raises(RuntimeError, match=f"in use by process {holder.pid}"):
            main([str(tmp_path), "--num-train", "4", "--num-dev", "2", "--num-test", "2", "--jobs", "1"])
    finally:
        holder.kill()
        holder.wait()
    assert temporary.read_bytes() == b"half written"


def test_translation_is_pig_latin_of_the_text(speech_corpus):
    """Every utterance carries a deterministic word-by-word translation for the ST recipe."""
    from local.synth_corpus import pig_latin
    assert pig_latin("the old cat eats") == "ethay oldway atcay eatsway"
    for utterance in read_split(speech_corpus, "train"):
        assert utterance["translation"] == pig_latin(utterance["text"]) and utterance["lang"] == "en"
