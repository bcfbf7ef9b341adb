"""local/synth_corpus.py --profile open: open-vocabulary text, many voices, every recording condition."""

import json
import re

import numpy as np
import pytest
import soundfile as sf

from local import acoustics, open_corpus, synth_corpus
from local.text_normalization import kjv_sentences, normalize_transcript, spell_number, spell_ordinal, split_sentences
from local.voices import RECORDED_SPEAKERS, voice_type

SMALL = ["--profile", "open", "--num-train", "12", "--num-dev", "3", "--num-test", "3",
         "--num-test-unseen", "4", "--num-unlabelled-new-voices", "3"]
LABELLED = ("train", "dev", "test_seen")


@pytest.fixture(scope="module")
def full_plan():
    """The plan of the default open corpus (no audio made)."""
    return synth_corpus.plan_utterances(synth_corpus.parse_args(["x", "--profile", "open"]))


@pytest.fixture(scope="module")
def full_lm_text(full_plan):
    """The default open corpus' language-model text."""
    return open_corpus.lm_sentences(full_plan)


def six_grams(sentence):
    """Word 6-grams, or the whole sentence when shorter (written here apart from local/text_overlap.py)."""
    words = sentence.split()
    return {" ".join(words[i:i + 6]) for i in range(max(1, len(words) - 5))}


def test_transcripts_are_words_with_numbers_spelled_out():
    """Digits and ordinals become words, punctuation goes, apostrophes inside words stay."""
    assert normalize_transcript("In the 2nd year, Ben-hadad's 120 men (at noon).") == \
        "in the second year ben hadad's one hundred and twenty men at noon"
    assert spell_number(1984) == "one thousand nine hundred and eighty four"
    assert spell_number(40) == "forty" and spell_ordinal(21) == "twenty first" and spell_ordinal(90) == "ninetieth"
    assert split_sentences("A b c. D e; f g, h i, j k l", max_words=4) == ["A b c.", "D e;", "f g, h i,", "j k l"]


def test_plan_is_a_function_of_the_seed_with_disjoint_sentences_and_unseen_voices(full_plan):
    """Same seed, same plan; no sentence in two splits; test_unseen's voices speak the untranscribed
    pool and nothing labelled, and the training voices number at least 20 of espeak-ng and flite."""
    args = synth_corpus.parse_args(["x", *SMALL[:2], "--seed", "7"])
    assert synth_corpus.plan_utterances(args) == synth_corpus.plan_utterances(args)
    assert synth_corpus.plan_utterances(args) != full_plan[:len(synth_corpus.plan_utterances(args))]
    texts = {split: {u["text"] for u in full_plan if u["split"] == split} for split in open_corpus.SPLITS}
    for first in open_corpus.SPLITS:
        for second in open_corpus.SPLITS:
            assert first == second or not texts[first] & texts[second]
    heard = {u["voice"] for u in full_plan if u["split"] in LABELLED}
    unseen = {u["voice"] for u in full_plan if u["split"] == "test_unseen"}
    assert not heard & unseen and len(unseen) >= 5
    assert {u["voice"] for u in full_plan if u["split"] == open_corpus.UNLABELLED} == unseen
    assert len(heard) >= 20 and {voice.split(":")[0] for voice in heard} == {"espeak", "flite"}
    assert all(re.fullmatch(r"[a-z' ]+", u["text"]) for u in full_plan)
    assert len({word for u in full_plan if u["split"] == "train" for word in u["text"].split()}) > 2000


def test_new_voices_are_new_types_and_a_new_gender(full_plan):
    """Every test_unseen voice is of a type no labelled voice has (another engine, another speaker,
    espeak-ng's Klatt synthesizer), festival is heard in no labelled split, and the labelled recorded
    voices are all men while the new ones include a woman."""
    heard = {u["voice"] for u in full_plan if u["split"] in LABELLED}
    unseen = {u["voice"] for u in full_plan if u["split"] == "test_unseen"}
    assert not {voice_type(v) for v in heard} & {voice_type(v) for v in unseen}
    assert "festival" in {v.split(":")[0] for v in unseen} - {v.split(":")[0] for v in heard}
    assert {"espeak-klatt", "festival:slt"} <= {voice_type(v) for v in unseen}
    assert {RECORDED_SPEAKERS[v][1] for v in heard if v in RECORDED_SPEAKERS} == {"male"}
    assert "female" in {RECORDED_SPEAKERS[v][1] for v in unseen if v in RECORDED_SPEAKERS}
    assert sum(voice_type(v) == "espeak-formant" for v in heard) >= 18  # still a varied labelled set


def test_dev_and_test_come_from_whole_books_nothing_else_uses(full_plan, full_lm_text):
    """dev / test_seen / test_unseen sentences come only from the held-out books, and no training
    transcript, pool sentence or LM sentence does; train is in the LM text, the untranscribed pool
    is not; another seed deals other sentences from the same books."""
    book_of = {text: book for book, _, text in kjv_sentences()}
    held_out_books = set(open_corpus.HELD_OUT_BOOKS)
    for utterance in full_plan:
        assert (utterance["book"] in held_out_books) == (utterance["split"] in open_corpus.HELD_OUT), utterance
        assert book_of[utterance["text"]] == utterance["book"]
    assert {u["book"] for u in full_plan if u["split"] in open_corpus.HELD_OUT} == held_out_books
    assert not {book_of[text] for text in full_lm_text} & held_out_books
    lm_text = set(full_lm_text)
    assert all(u["text"] in lm_text for u in full_plan if u["split"] == "train")
    assert not any(u["text"] in lm_text for u in full_plan if u["split"] == open_corpus.UNLABELLED)
    other_seed = open_corpus.plan_utterances(open_corpus.DEFAULT_COUNTS, seed=7)
    assert {u["book"] for u in other_seed if u["split"] == "dev"} <= held_out_books
    dev_texts = [{u["text"] for u in plan if u["split"] == "dev"} for plan in (other_seed, full_plan)]
    assert dev_texts[0] != dev_texts[1]


def test_no_dev_or_test_six_gram_is_in_train_the_pool_or_the_lm_text(full_plan, full_lm_text):
    """No dev or test sentence shares a word 6-gram (a sentence of 5 words: itself) with a training
    transcript, the untranscribed pool or the LM text; the books before filtering did share some, so
    the check is not vacuous."""
    held_out = [u["text"] for u in full_plan if u["split"] in open_corpus.HELD_OUT]
    held_grams = set().union(*map(six_grams, held_out))
    used = full_lm_text + [u["text"] for u in full_plan if u["split"] not in open_corpus.HELD_OUT]
    used_grams = set().union(*map(six_grams, used))
    short = [s for s in held_out if len(s.split()) < 6]
    assert short and not held_grams & used_grams
    joined = "\n".join(f" {s} " for s in used)
    assert not [s for s in short if f" {s} " in joined]  # a 5-word test sentence said inside a longer one
    training_books = [text for book, _, text in kjv_sentences() if book not in open_corpus.HELD_OUT_BOOKS]
    assert sum(bool(six_grams(text) & held_grams) for text in training_books) > 20


def test_corpus_summary_reports_a_clean_held_out_text(full_plan, full_lm_text):
    """The summary counts every split and the LM text, finds no dev/test 6-gram in train or LM text,
    no test sentence inside an LM sentence, and some new words (whole unseen books bring names)."""
    summary = open_corpus.corpus_summary(full_plan, full_lm_text, durations=[3.0] * len(full_plan))
    assert summary["splits"]["train"] == {"utterances": 1500, "voices": 22, "hours": 1.25, "books": 59,
                                          "voice_types": ["espeak-formant", "flite:awb", "flite:rms"]}
    assert summary["lm_text"]["sentences"] == len(full_lm_text) > 50000
    assert set(summary["held_out"]) == {*open_corpus.HELD_OUT, "all"}
    figures = summary["held_out"]["all"]
    assert figures["sentences"] == 450 and figures["sharing_6gram_with_train_or_lm"] == 0
    assert figures["inside_an_lm_sentence"] == 0 and 0 < figures["oov_rate"] < 0.05
    assert figures["nearest_lm_word_edits"]["min"] >= 1 and figures["share_within_20pct_word_edits"] < 0.02


def test_counts_beyond_the_held_out_books_are_refused():
    """Asking for more dev/test sentences than the held-out books hold stops with the options to lower."""
    with pytest.raises(SystemExit, match="held-out books have .* lower their --num-"):
        open_corpus.plan_utterances({**open_corpus.DEFAULT_COUNTS, "dev": 5000}, seed=1)


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
    """main() writes the five manifests and their audio, the LM text with every training sentence and
    no dev, test or pool one, and the summary; the pool's words are no transcript; a rerun after a
    half-written file changes nothing and removes the leftover."""
    out = tmp_path / "corpus"
    synth_corpus.main([str(out), *SMALL, "--jobs", "2"])
    manifests = {s: (out / f"{s}.jsonl").read_text() for s in open_corpus.SPLITS}
    records = [json.loads(line) for text in manifests.values() for line in text.splitlines()]
    assert len(records) == 25 and all((out / r["audio"]).is_file() for r in records)
    assert all(r["speaker"] in open_corpus.UNSEEN_VOICES for r in records if r["id"].startswith("test_unseen"))
    pool = [r for r in records if r["id"].startswith(open_corpus.UNLABELLED)]
    assert len(pool) == 3 and all(r["speaker"] in open_corpus.UNSEEN_VOICES for r in pool)
    assert all("text" not in r and "translation" not in r and r["diagnostic_text"] for r in pool)
    (out / "audio" / "train" / "train-000000.wav.tmp.wav").write_bytes(b"partial")
    synth_corpus.main([str(out), *SMALL, "--jobs", "1"])
    assert {s: (out / f"{s}.jsonl").read_text() for s in open_corpus.SPLITS} == manifests
    assert not list(out.glob("audio/*/*.tmp*"))
    lm_text = set((out / open_corpus.LM_TEXT).read_text().splitlines())  # the language model's text:
    assert all((r.get("text") in lm_text) == r["id"].startswith("train") for r in records)  # no dev / test line
    assert len(lm_text) > 50000 and not {r["diagnostic_text"] for r in pool} & lm_text
    summary = json.loads((out / open_corpus.SUMMARY).read_text())
    assert summary["splits"][open_corpus.UNLABELLED]["utterances"] == 3
    assert all(0 < summary["splits"][s]["hours"] < 0.05 for s in open_corpus.SPLITS)  # under 3 minutes
