"""The open-vocabulary corpus of ``local/synth_corpus.py --profile open``: its voices, its plan and
the rendering of one utterance.

Sentences: King James Bible pieces of 5-22 words (``local/text_normalization.py``), shuffled by the
seed and dealt to the splits without repeats. Voices: 23 for training (espeak-ng accents and
variants, flite and festival voices) and 6 heard only in ``test_unseen``. Per utterance, drawn from
the seed: speed, pitch, a room on about a third, noise (white, pink, brown, hum, babble) at 10-30 dB
SNR on about half, 0.05-0.8 s of silence before and after, a level of -35 to -15 dBFS, a sample
rate of 8-48 kHz, a file format (wav, flac, mp3, ogg) and a second channel on some.
"""

import os

import numpy as np

from local import acoustics
from local.text_normalization import kjv_sentences
from local.voices import synthesize

TRAIN_VOICES = [
    "espeak:en-us+m1", "espeak:en-us+f1", "espeak:en-us+m4", "espeak:en-us+f3", "espeak:en+m3",
    "espeak:en+f4", "espeak:en-gb-x-rp+m2", "espeak:en-gb-x-rp+f5", "espeak:en-gb-scotland+m5",
    "espeak:en-gb-scotland+f1", "espeak:en-gb-x-gbclan+m7", "espeak:en-gb-x-gbcwmd+f3",
    "espeak:en-029+m2", "espeak:en-us-nyc+f4", "espeak:en-us+klatt", "espeak:en+Andy",
    "espeak:en-us+Annie", "espeak:en-gb-x-rp+edward",
    "flite:kal16", "flite:awb", "flite:slt",
    "festival:kal_diphone", "festival:cmu_us_slt_arctic_hts",
]
# Never heard in training: variants and a flite and a festival speaker that no training voice uses.
UNSEEN_VOICES = ["espeak:en-gb-x-gbcwmd+m6", "espeak:en-029+f2", "espeak:en-us-nyc+m8",
                 "espeak:en-gb-scotland+klatt4", "flite:rms", "festival:ked_diphone"]
SPLITS = ("train", "dev", "test_seen", "test_unseen")
HELD_OUT = ("dev", "test_seen", "test_unseen")  # their sentences never reach the language-model text
LM_TEXT = "lm_text.txt"
DEFAULT_COUNTS = {"train": 1500, "dev": 150, "test_seen": 150, "test_unseen": 150}
RATES = (8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000)
RATE_WEIGHTS = (0.10, 0.05, 0.30, 0.15, 0.05, 0.05, 0.20, 0.10)
EXTENSIONS = ("wav", "flac", "mp3", "ogg")
EXTENSION_WEIGHTS = (0.35, 0.25, 0.20, 0.20)
# what the manifest records of each utterance beside its text and voice
CONDITION_FIELDS = ("spoken", "speed", "pitch", "rt60_s", "direct_to_reverb_db", "noise", "snr_db",
                    "lead_s", "trail_s", "level_dbfs", "rate", "format", "channels")


def voices_of(split):
    """The voices a split is spoken by."""
    return UNSEEN_VOICES if split == "test_unseen" else TRAIN_VOICES


def plan_utterances(counts, seed):
    """Every utterance as a dict of what to say, who says it and how it is recorded."""
    rng = np.random.default_rng(seed)
    sentences = kjv_sentences()
    total = sum(counts.values())
    if total > len(sentences):
        raise SystemExit(f"error: {total} utterances asked for, the text has {len(sentences)} sentences")
    order = rng.permutation(len(sentences))
    plan, start = [], 0
    for split in SPLITS:
        for index in range(counts[split]):
            spoken, text = sentences[order[start + index]]
            plan.append({"id": f"{split}-{index:06d}", "split": split, "text": text, "spoken": spoken,
                         **draw_conditions(voices_of(split), rng)})
        start += counts[split]
    return plan


def lm_sentences(plan):
    """Every transcript of the source text in book order, less those of the held-out splits' utterances."""
    held_out = {u["text"] for u in plan if u["split"] in HELD_OUT}
    return [text for _, text in kjv_sentences() if text not in held_out]


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
