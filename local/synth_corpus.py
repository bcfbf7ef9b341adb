#!/usr/bin/env python3
"""Synthesize Tandem's built-in demo corpus with espeak-ng: 16 kHz wav files + JSONL manifests.

Sentences come from a small English grammar (about 150 words, so a tiny model can learn the words in
minutes on a CPU) or from a text file given with --sentences. Each utterance is spoken by one of several
espeak-ng voices at a random speed and pitch, with a little background noise. The splits hold disjoint
sentences; the test split is spoken by a voice never heard in training.

    python local/synth_corpus.py data/demo/corpus --num-train 1000 --num-dev 100 --num-test 100

writes data/demo/corpus/{train,dev,test}.jsonl with lines
{"id": ..., "audio": "wav/train/....wav", "text": ..., "speaker": ..., "duration": ..., "lang": "en",
"translation": ...} (audio paths are relative to the manifest's folder). The translation is the text in
Pig Latin, a deterministic word-by-word "language" that gives the speech-translation recipe a target
it can learn and BLEU can score. Deterministic from --seed; rerunning reuses the
wav files already written.
"""

import argparse
import io
import json
import logging
import os
import subprocess
import sys

import numpy as np
import soundfile as sf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common.audio import SAMPLE_RATE, to_mono_rate  # noqa: E402
from common.atomic import atomic_write_text  # noqa: E402
from common.parallel import process_pool  # noqa: E402

logger = logging.getLogger("synth_corpus")

TRAIN_VOICES = ["en-us+m1", "en-us+f1", "en+m3", "en-gb-x-rp+f3", "en-us+m4", "en+f4", "en-us+m7"]
HELD_OUT_VOICE = "en+f2"  # only the test split uses it: a speaker the model never heard

WORDS = {
    "det": "the a this that every one my your".split(),
    "number": "two three four five six seven eight nine ten".split(),
    "adj": ("red blue green yellow black white small big old new happy quiet loud fast slow "
            "warm cold bright dark soft").split(),
    "noun": ("cat dog bird fish horse cow king queen girl boy doctor farmer teacher child friend "
             "river garden window table chair house road tree apple letter song book boat car").split(),
    "verb": ("sees finds likes wants takes brings opens follows paints moves holds needs watches "
             "helps calls").split(),
    "verb_past": "saw found liked wanted took brought opened followed painted moved held needed".split(),
    "prep": "near under behind beside over across into from".split(),
    "place": ["the park", "the city", "the market", "the school", "the kitchen", "the forest"],
    "time": "today tonight yesterday tomorrow again now later".split(),
    "adverb": "slowly quickly quietly happily carefully".split(),
}
TEMPLATES = [
    "{det} {adj} {noun} {verb} {det} {noun}",
    "{det} {noun} {verb} {det} {adj} {noun} {prep} {place}",
    "{number} {adj} {noun}s {verb_past} {det} {noun} {time}",
    "{det} {noun} {adverb} {verb_past} {number} {noun}s",
    "{time} {det} {adj} {noun} {verb} {det} {noun} {prep} {det} {noun}",
    "{det} {noun} {prep} {place} {verb} {det} {adj} {adj} {noun}",
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("out_dir", help="folder for the manifests and wav/ (created)")
    parser.add_argument("--num-train", type=int, default=1000, help="training utterances")
    parser.add_argument("--num-dev", type=int, default=100, help="development utterances")
    parser.add_argument("--num-test", type=int, default=100, help="test utterances (held-out voice)")
    parser.add_argument("--sentences", help="a UTF-8 text file, one sentence a line, instead of the "
                        "built-in grammar (needs at least as many distinct lines as utterances)")
    parser.add_argument("--seed", type=int, default=1234, help="random seed: same seed, same corpus")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="parallel espeak-ng processes")
    parser.add_argument("--noise-snr-db", type=float, nargs=2, default=[25.0, 45.0],
                        metavar=("LOW", "HIGH"), help="range of the white-noise signal-to-noise ratio")
    return parser.parse_args(argv)


def generate_sentences(count, rng):
    """``count`` distinct sentences from the built-in grammar, in a seeded random order."""
    sentences, seen = [], set()
    while len(sentences) < count:
        template = TEMPLATES[rng.integers(len(TEMPLATES))]
        slots = {name: words[rng.integers(len(words))] for name, words in WORDS.items()}
        sentence = template.format(**slots)
        if sentence not in seen:
            seen.add(sentence)
            sentences.append(sentence)
        if len(seen) > 50 * count + 1000:
            raise RuntimeError(f"the grammar cannot produce {count} distinct sentences")
    return sentences


def read_sentences(path, count, rng):
    """``count`` distinct non-empty lines of ``path`` in a seeded random order."""
    with open(path, encoding="utf-8") as handle:
        lines = list(dict.fromkeys(line.strip() for line in handle if line.strip()))
    if len(lines) < count:
        raise SystemExit(f"error: {path} has {len(lines)} distinct sentences but {count} utterances "
                         "were asked for: lower --num-train/--num-dev/--num-test or add sentences")
    order = rng.permutation(len(lines))[:count]
    return [lines[i] for i in order]


def pig_latin(text):
    """'the red cat' -> 'ethay edray atcay': leading consonants move to the end, then 'ay'."""
    def word(w):
        first_vowel = next((i for i, c in enumerate(w) if c in "aeiou"), len(w))
        return w + "way" if first_vowel == 0 else w[first_vowel:] + w[:first_vowel] + "ay"
    return " ".join(word(w) for w in text.split())


def plan_utterances(args):
    """Every utterance to synthesize as a dict: id, split, text, voice, speed (wpm), pitch, snr_db, seed."""
    rng = np.random.default_rng(args.seed)
    counts = {"train": args.num_train, "dev": args.num_dev, "test": args.num_test}
    total = sum(counts.values())
    sentences = (read_sentences(args.sentences, total, rng) if args.sentences
                 else generate_sentences(total, rng))
    plan, start = [], 0
    for split, count in counts.items():
        for index, text in enumerate(sentences[start:start + count]):
            voice = HELD_OUT_VOICE if split == "test" else TRAIN_VOICES[rng.integers(len(TRAIN_VOICES))]
            plan.append({"id": f"{split}-{index:06d}", "split": split, "text": text, "voice": voice,
                         "speed": int(rng.integers(130, 200)), "pitch": int(rng.integers(25, 75)),
                         "snr_db": float(rng.uniform(*args.noise_snr_db)),
                         "seed": int(rng.integers(2**31))})
        start += count
    return plan


def synthesize(utterance, wav_path):
    """Speak one utterance with espeak-ng and write it as 16 kHz mono wav (atomically)."""
    spoken = subprocess.run(
        ["espeak-ng", "-v", utterance["voice"], "-s", str(utterance["speed"]),
         "-p", str(utterance["pitch"]), "--stdout", utterance["text"]],
        check=True, capture_output=True).stdout
    samples, rate = sf.read(io.BytesIO(spoken), dtype="float32", always_2d=True)
    audio = to_mono_rate(samples, rate, SAMPLE_RATE)
    audio = _trim_silence(audio)
    audio = _add_noise(audio, utterance["snr_db"], np.random.default_rng(utterance["seed"]))
    temporary = wav_path + ".tmp"
    sf.write(temporary, audio, SAMPLE_RATE, format="WAV", subtype="PCM_16")
    os.replace(temporary, wav_path)
    return len(audio) / SAMPLE_RATE


def _trim_silence(audio, threshold=1e-3, margin_s=0.15):
    """Cut espeak-ng's leading and trailing silence down to ``margin_s`` seconds."""
    loud = np.flatnonzero(np.abs(audio) > threshold)
    if len(loud) == 0:
        return audio
    margin = int(margin_s * SAMPLE_RATE)
    return audio[max(0, loud[0] - margin):loud[-1] + margin]


def _add_noise(audio, snr_db, rng):
    power = float(np.mean(audio**2)) or 1e-8
    noise = rng.standard_normal(len(audio)).astype(np.float32) * np.sqrt(power / 10 ** (snr_db / 10))
    return np.clip(audio + noise, -1.0, 1.0).astype(np.float32)


def _synthesize_job(job):
    utterance, wav_path = job
    if os.path.isfile(wav_path):  # written atomically by an earlier run
        return sf.info(wav_path).frames / SAMPLE_RATE
    return synthesize(utterance, wav_path)


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    plan = plan_utterances(args)
    for split in ("train", "dev", "test"):
        os.makedirs(os.path.join(args.out_dir, "wav", split), exist_ok=True)
    jobs = [(u, os.path.join(args.out_dir, "wav", u["split"], u["id"] + ".wav")) for u in plan]
    with process_pool(args.jobs) as pool:
        durations = pool.map(_synthesize_job, jobs, chunksize=16)
    for split in ("train", "dev", "test"):
        lines = [json.dumps({"id": u["id"], "audio": f"wav/{split}/{u['id']}.wav", "text": u["text"],
                             "speaker": u["voice"], "duration": round(d, 4), "lang": "en",
                             "translation": pig_latin(u["text"])})
                 for u, d in zip(plan, durations) if u["split"] == split]
        atomic_write_text(os.path.join(args.out_dir, f"{split}.jsonl"), "".join(l + "\n" for l in lines))
        hours = sum(d for u, d in zip(plan, durations) if u["split"] == split) / 3600
        logger.info("%s: %d utterances, %.2f h -> %s", split, len(lines), hours,
                    os.path.join(args.out_dir, f"{split}.jsonl"))


if __name__ == "__main__":
    main()
