"""The open-vocabulary corpus of ``local/synth_corpus.py --profile open``: its voices, its plan and
the rendering of one utterance.

Sentences: King James Bible pieces of 5-22 words (``local/text_normalization.py``), dealt by the seed
without repeats. Test text is truly unseen: dev, test_seen and test_unseen are drawn from four whole
books, HELD_OUT_BOOKS (Ruth: narrative, Ecclesiastes: wisdom, James and 1 Peter: letters; 1,020
sentences, chosen as books with few parallel passages elsewhere), that neither the training transcripts
nor ``lm_text.txt`` contain. The other books give train, the untranscribed pool and the language-model
text, less every sentence that shares a word 6-gram with a dev or test sentence (or holds a whole dev
or test sentence of 5 words). ``corpus_summary`` measures what remains: OOV rate, n-gram sharing and
the nearest LM sentence in word edits of each held-out split.

Voices: 22 for training, every one an espeak-ng formant voice (20 accent and variant pairs, male and
female) or a flite clustergen voice of a man (awb, rms). Seven are truly new, heard only in
test_unseen and unlabelled_new_voices: a voice type and a gender that no labelled voice has,
- festival, the whole engine (kal and ked diphones, slt HTS) and flite's twins of its speakers (kal16:
  the same kal diphones; slt: the same recorded woman), so no recorded speaker of theirs is heard;
- the only recorded woman (slt): every labelled flite voice is a man;
- espeak-ng's Klatt synthesizer (klatt, klatt4), a different source model from its formant voices
  (its other Klatt variants, e.g. edward, are left out of training too).

Splits: train (1,500, about 2 h), dev / test_seen (training voices), test_unseen (new voices), and
unlabelled_new_voices (300): the new voices saying training-book sentences that no other split says,
for untranscribed speech of the speakers that matter; its manifest keeps the words as
``diagnostic_text`` (never ``text``, so corpus readers see untranscribed speech) and its sentences are
left out of ``lm_text.txt``. Per utterance, drawn from the seed: speed, pitch, a room on about a third,
noise (white, pink, brown, hum, babble) at 10-30 dB SNR on about half, 0.05-0.8 s of silence before and
after, a level of -35 to -15 dBFS, a sample rate of 8-48 kHz, a file format (wav, flac, mp3, ogg) and a
second channel on some.
"""

import os

import numpy as np

from local import acoustics, text_overlap
from local.text_normalization import kjv_sentences
from local.voices import synthesize, voice_type

TRAIN_VOICES = [
    "espeak:en-us+m1", "espeak:en-us+f1", "espeak:en-us+m4", "espeak:en-us+f3", "espeak:en+m3",
    "espeak:en+f4", "espeak:en-gb-x-rp+m2", "espeak:en-gb-x-rp+f5", "espeak:en-gb-scotland+m5",
    "espeak:en-gb-scotland+f1", "espeak:en-gb-x-gbclan+m7", "espeak:en-gb-x-gbcwmd+f3",
    "espeak:en-gb-x-gbcwmd+m6", "espeak:en-029+m2", "espeak:en-029+f2", "espeak:en-us-nyc+f4",
    "espeak:en-us-nyc+m8", "espeak:en+Andy", "espeak:en-us+Annie", "espeak:en-gb-x-rp+f2",
    "flite:awb", "flite:rms",
]
# Truly new (see the module's docstring): another engine, its speakers, a woman's recorded voice, Klatt.
UNSEEN_VOICES = ["festival:kal_diphone", "festival:ked_diphone", "festival:cmu_us_slt_arctic_hts",
                 "flite:kal16", "flite:slt", "espeak:en-us+klatt", "espeak:en-gb-scotland+klatt4"]
HELD_OUT_BOOKS = ("Ruth", "Ecclesiastes", "James", "1 Peter")
NGRAM = 6  # no dev/test word 6-gram is in train, the pool or the LM text
UNLABELLED = "unlabelled_new_voices"
SPLITS = ("train", "dev", "test_seen", "test_unseen", UNLABELLED)
HELD_OUT = ("dev", "test_seen", "test_unseen")  # from HELD_OUT_BOOKS only
NEW_VOICE_SPLITS = ("test_unseen", UNLABELLED)
LM_TEXT = "lm_text.txt"
SUMMARY = "summary.json"
DEFAULT_COUNTS = {"train": 1500, "dev": 150, "test_seen": 150, "test_unseen": 150, UNLABELLED: 300}
RATES = (8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000)
RATE_WEIGHTS = (0.10, 0.05, 0.30, 0.15, 0.05, 0.05, 0.20, 0.10)
EXTENSIONS = ("wav", "flac", "mp3", "ogg")
EXTENSION_WEIGHTS = (0.35, 0.25, 0.20, 0.20)
# what the manifest records of each utterance beside its text and voice: its source and conditions
CONDITION_FIELDS = ("book", "spoken", "speed", "pitch", "rt60_s", "direct_to_reverb_db", "noise", "snr_db",
                    "lead_s", "trail_s", "level_dbfs", "rate", "format", "channels")


def voices_of(split):
    """The voices a split is spoken by."""
    return UNSEEN_VOICES if split in NEW_VOICE_SPLITS else TRAIN_VOICES


def plan_utterances(counts, seed):
    """Every utterance as a dict of what to say (book, spoken text, transcript), who says it and how
    it is recorded: the held-out splits from HELD_OUT_BOOKS, the others from the training text."""
    rng = np.random.default_rng(seed)
    sentences = kjv_sentences()
    held_out_pool = [sentence for sentence in sentences if sentence[0] in HELD_OUT_BOOKS]
    chosen = deal(held_out_pool, {split: counts[split] for split in HELD_OUT}, rng, "the held-out books")
    held_out = [text for split in HELD_OUT for _, _, text in chosen[split]]
    others = {split: counts[split] for split in SPLITS if split not in HELD_OUT}
    chosen |= deal(training_text(sentences, held_out), others, rng, "the training books")
    return [{"id": f"{split}-{index:06d}", "split": split, "book": book, "text": text, "spoken": spoken,
             **draw_conditions(voices_of(split), rng)}
            for split in SPLITS for index, (book, spoken, text) in enumerate(chosen[split])]


def deal(pool, counts, rng, source):
    """``{split: [sentence, ...]}``: ``counts`` distinct sentences of ``pool`` in a seeded order."""
    if sum(counts.values()) > len(pool):
        raise SystemExit(f"error: {sum(counts.values())} utterances of {', '.join(counts)} asked for, but "
                         f"{source} have {len(pool)} sentences: lower their --num-* options")
    order, chosen, start = rng.permutation(len(pool)), {}, 0
    for split, count in counts.items():
        chosen[split] = [pool[i] for i in order[start:start + count]]
        start += count
    return chosen


def training_text(sentences, held_out):
    """The sentences (book, spoken, transcript) of the books outside HELD_OUT_BOOKS that share no word
    NGRAM-gram with a ``held_out`` transcript: what train, the pool and the LM text may use."""
    training = [sentence for sentence in sentences if sentence[0] not in HELD_OUT_BOOKS]
    shared = text_overlap.sharing_ngrams([text for _, _, text in training], held_out, NGRAM)
    return [sentence for sentence, drop in zip(training, shared) if not drop]


def lm_sentences(plan):
    """The language model's text, in book order: every sentence of the training text (the training
    transcripts included) but those the untranscribed pool says."""
    held_out = [u["text"] for u in plan if u["split"] in HELD_OUT]
    untranscribed = {u["text"] for u in plan if u["split"] == UNLABELLED}
    return [text for _, _, text in training_text(kjv_sentences(), held_out) if text not in untranscribed]


def corpus_summary(plan, lm_text, durations=None):
    """What the corpus holds and how unseen its test text is: per split utterances, voices and hours
    (with ``durations`` in seconds, one per planned utterance), the LM text's size, and per held-out
    split the figures of ``text_overlap.overlap_report`` against train + LM text."""
    splits = {}
    for split in SPLITS:
        indices = [i for i, u in enumerate(plan) if u["split"] == split]
        voices = {plan[i]["voice"] for i in indices}
        splits[split] = {"utterances": len(indices), "voices": len(voices),
                         "voice_types": sorted({voice_type(voice) for voice in voices}),
                         "books": len({plan[i]["book"] for i in indices})}
        if durations is not None:
            splits[split]["hours"] = round(sum(durations[i] for i in indices) / 3600, 3)
    held_out = {split: [u["text"] for u in plan if u["split"] == split] for split in HELD_OUT}
    train = [u["text"] for u in plan if u["split"] == "train"]
    return {"held_out_books": list(HELD_OUT_BOOKS), "splits": splits,
            "lm_text": {"sentences": len(lm_text), "words": sum(len(s.split()) for s in lm_text)},
            "held_out": text_overlap.overlap_report(held_out, train, lm_text, NGRAM)}


def draw_conditions(voices, rng):
    """One utterance's voice and recording conditions (plain values, so the plan is a manifest)."""
    reverb, noise = rng.random() < 0.3, rng.random() < 0.5
    return {
        "voice": voices[rng.integers(len(voices))],
        "speed": round(float(rng.uniform(0.8, 1.25)), 3),
        "pitch": round(float(rng.uniform(0.85, 1.2)), 3),
        "rt60_s": round(float(rng.uniform(0.15, 0.6)), 3) if reverb else None,
        "direct_to_reverb_db": round(float(rng.uniform(0.0, 10.0)), 2) if reverb else None,
        "noise": str(rng.choice(acoustics.NOISE_KINDS)) if noise else None,
        "snr_db": round(float(rng.uniform(10.0, 30.0)), 2) if noise else None,
        "lead_s": round(float(rng.uniform(0.05, 0.8)), 3),
        "trail_s": round(float(rng.uniform(0.05, 0.8)), 3),
        "level_dbfs": round(float(rng.uniform(-35.0, -15.0)), 2),
        "rate": int(rng.choice(RATES, p=RATE_WEIGHTS)),
        "format": str(rng.choice(EXTENSIONS, p=EXTENSION_WEIGHTS)),
        "channels": 2 if rng.random() < 0.15 else 1,
        "seed": int(rng.integers(2**31)),
    }


def audio_path(utterance):
    """Where an utterance's file goes, relative to the corpus folder."""
    return os.path.join("audio", utterance["split"], f"{utterance['id']}.{utterance['format']}")


def render(utterance):
    """Synthesize one utterance under its conditions: (samples [frames] or [frames, 2], rate)."""
    rng = np.random.default_rng(utterance["seed"])
    audio, rate = synthesize(utterance["voice"], utterance["spoken"], utterance["speed"], utterance["pitch"])
    audio = acoustics.trim_silence(audio, rate)
    if utterance["rt60_s"] is not None:
        audio = acoustics.add_reverb(audio, rate, utterance["rt60_s"], utterance["direct_to_reverb_db"], rng)
    audio = acoustics.pad_silence(audio, rate, utterance["lead_s"], utterance["trail_s"], rng)
    audio = acoustics.resample(audio, rate, utterance["rate"])
    if utterance["noise"] is not None:
        audio = acoustics.add_noise(audio, utterance["rate"], utterance["snr_db"], utterance["noise"], rng)
    audio = acoustics.set_level(audio, utterance["level_dbfs"])
    if utterance["channels"] == 2:
        audio = acoustics.to_stereo(audio, utterance["rate"], rng)
    return audio, utterance["rate"]
