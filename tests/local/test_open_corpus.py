"""local/synth_corpus.py --profile open: open-vocabulary text, many voices, every recording condition."""

import json
import re

import numpy as np
import pytest
import soundfile as sf

from local import acoustics, open_corpus, synth_corpus
from local.text_normalization import normalize_transcript, spell_number, spell_ordinal, split_sentences

SMALL = ["--profile", "open", "--num-train", "12", "--num-dev", "3", "--num-test", "3",
         "--num-test-unseen", "4"]


@pytest.fixture(scope="module")
def full_plan():
    """The plan of the default open corpus (no audio made)."""
    return synth_corpus.plan_utterances(synth_corpus.parse_args(["x", "--profile", "open"]))


def test_transcripts_are_words_with_numbers_spelled_out():
    """Digits and ordinals become words, punctuation goes, apostrophes inside words stay."""
    assert normalize_transcript("In the 2nd year, Ben-hadad's 120 men (at noon).") == \
        "in the second year ben hadad's one hundred and twenty men at noon"
    assert spell_number(1984) == "one thousand nine hundred and eighty four"
    assert spell_number(40) == "forty" and spell_ordinal(21) == "twenty first" and spell_ordinal(90) == "ninetieth"
    assert split_sentences("A b c. D e; f g, h i, j k l", max_words=4) == ["A b c.", "D e;", "f g, h i,", "j k l"]


def test_plan_is_a_function_of_the_seed_with_disjoint_sentences_and_unseen_voices(full_plan):
    """Same seed, same plan; no sentence in two splits; test_unseen's voices are heard nowhere else,
    and the training voices number at least 20 across espeak-ng, flite and festival."""
    args = synth_corpus.parse_args(["x", *SMALL[:2], "--seed", "7"])
    assert synth_corpus.plan_utterances(args) == synth_corpus.plan_utterances(args)
    assert synth_corpus.plan_utterances(args) != full_plan[:len(synth_corpus.plan_utterances(args))]
    texts = {split: {u["text"] for u in full_plan if u["split"] == split} for split in open_corpus.SPLITS}
    for first in open_corpus.SPLITS:
        for second in open_corpus.SPLITS:
            assert first == second or not texts[first] & texts[second]
    heard = {u["voice"] for u in full_plan if u["split"] != "test_unseen"}
    unseen = {u["voice"] for u in full_plan if u["split"] == "test_unseen"}
    assert not heard & unseen and len(unseen) >= 4
    assert len(heard) >= 20 and {voice.split(":")[0] for voice in heard} == {"espeak", "flite", "festival"}
    assert all(re.fullmatch(r"[a-z' ]+", u["text"]) for u in full_plan)
    assert len({word for u in full_plan if u["split"] == "train" for word in u["text"].split()}) > 2000


def test_default_corpus_draws_every_rate_format_and_condition(full_plan):
    """8-48 kHz, wav/flac/mp3/ogg, mono and stereo, each noise kind, rooms, and about half noisy."""
    assert {u["rate"] for u in full_plan} == set(open_corpus.RATES)
    assert {u["format"] for u in full_plan} == set(open_corpus.EXTENSIONS)
    assert {u["channels"] for u in full_plan} == {1, 2}
    assert {u["noise"] for u in full_plan} == {None, *acoustics.NOISE_KINDS}
    noisy = np.mean([u["noise"] is not None for u in full_plan])
    assert 0.4 < noisy < 0.6 and any(u["rt60_s"] for u in full_plan)
    train_hours = sum(len(u["text"]) for u in full_plan if u["split"] == "train") / 14.0 / 3600
    assert 1.5 < train_hours < 2.5  # ~14 characters a second: about 2 h of training speech


def test_each_format_and_rate_is_written_as_planned(full_plan, tmp_path):
    """One utterance of every format and every rate, rendered: the file has the planned rate and
    channels, sounds (not silence) and lasts what its silences and words need."""
    chosen = {u["format"]: u for u in full_plan} | {u["rate"]: u for u in full_plan}
    chosen |= {"stereo": next(u for u in full_plan if u["channels"] == 2)}
    for utterance in chosen.values():
        path = str(tmp_path / f"{utterance['id']}.{utterance['format']}")
        synth_corpus._render_open_job((utterance, path))
        audio, rate = sf.read(path, always_2d=True)
        assert rate == utterance["rate"] and audio.shape[1] == utterance["channels"], utterance
        assert np.sqrt(np.mean(audio**2)) > 10 ** (-45 / 20)
        words = len(utterance["text"].split())
        assert words / 4.5 < len(audio) / rate - utterance["lead_s"] - utterance["trail_s"] < words, utterance


def test_small_corpus_is_written_and_a_rerun_reuses_it(tmp_path):
    """main() writes the four manifests and their audio, and the LM text with every training sentence
    and no dev or test one; a rerun after a half-written file changes nothing and removes the leftover."""
    out = tmp_path / "corpus"
    synth_corpus.main([str(out), *SMALL, "--jobs", "2"])
    manifests = {s: (out / f"{s}.jsonl").read_text() for s in open_corpus.SPLITS}
    records = [json.loads(line) for text in manifests.values() for line in text.splitlines()]
    assert len(records) == 22 and all((out / r["audio"]).is_file() for r in records)
    assert all(r["speaker"] in open_corpus.UNSEEN_VOICES for r in records if r["id"].startswith("test_unseen"))
    (out / "audio" / "train" / "train-000000.wav.tmp.wav").write_bytes(b"partial")
    synth_corpus.main([str(out), *SMALL, "--jobs", "1"])
    assert {s: (out / f"{s}.jsonl").read_text() for s in open_corpus.SPLITS} == manifests
    assert not list(out.glob("audio/*/*.tmp*"))
    lm_text = set((out / open_corpus.LM_TEXT).read_text().splitlines())  # the language model's text:
    assert all((r["text"] in lm_text) == r["id"].startswith("train") for r in records)  # no dev / test line
    assert len(lm_text) > 50000
