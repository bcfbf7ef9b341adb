#!/usr/bin/env python3
"""Synthesize Tandem's built-in corpora: audio files + JSONL manifests, in two profiles.

``--profile demo`` (default): sentences of a small English grammar (about 150 words, so a tiny model
can learn the words in minutes on a CPU) or of a text file given with --sentences, spoken by seven
espeak-ng voices at a random speed and pitch with a little white noise, as 16 kHz wav. The test split
is spoken by a voice never heard in training.

    python local/synth_corpus.py data/demo/corpus --num-train 1000 --num-dev 100 --num-test 100

``--profile open``: an open-vocabulary corpus (``local/open_corpus.py``): King James Bible sentences
(12,000 distinct words) spoken by 22 training voices of espeak-ng and flite, with noise, rooms,
silences, levels, sample rates of 8-48 kHz, wav / flac / mp3 / ogg and some stereo files; splits train
(about 2 h), dev, test_seen (training voices), test_unseen (7 voices of types and a gender no training
voice has) and unlabelled_new_voices (those new voices, untranscribed: the words only as
``diagnostic_text``); dev and test sentences come from four whole books that nothing else uses.
``lm_text.txt``: the 57,700 sentences of the other books for a language model, less the pool's and any
sharing a word 6-gram with dev or test; ``summary.json``: hours per split, OOV rates and how near each
test sentence comes to the LM text (also logged).

    python local/synth_corpus.py data/open/corpus --profile open

Each writes OUT/{split}.jsonl with lines {"id": ..., "audio": "wav/train/....wav", "text": ...,
"speaker": ..., "duration": ..., "lang": "en", "translation": ...} (audio paths are relative to the
manifest's folder; the open profile adds each utterance's recording conditions). The translation is
the text in Pig Latin, a deterministic word-by-word "language" that gives the speech-translation
recipe a target it can learn and BLEU can score. Deterministic from --seed; files are written under a
temporary name and renamed when complete, so a rerun (after a kill too) reuses the finished ones.
"""

import argparse
import io
import json
import logging
import os
import subprocess

import numpy as np
import soundfile as sf

from common.atomic import atomic_write_text
from common.audio_io import SAMPLE_RATE, to_mono_rate
from common.parallel import process_pool
from common.process_lock import acquire_process_lock
from common.user_errors import run_command
from local import acoustics, open_corpus
from local.voices import check_engines

logger = logging.getLogger("synth_corpus")

TRAIN_VOICES = ["en-us+m1", "en-us+f1", "en+m3", "en-gb-x-rp+f3", "en-us+m4", "en+f4", "en-us+m7"]
HELD_OUT_VOICE = "en+f2"  # only the test split uses it: a speaker the model never heard
DEMO_COUNTS = {"train": 1000, "dev": 100, "test": 100}
# the --num-* option of each split of open_corpus.SPLITS (the demo's three come first)
OPEN_OPTIONS = ("num_train", "num_dev", "num_test", "num_test_unseen", "num_unlabelled_new_voices")

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
    parser.add_argument("out_dir", help="folder for the manifests and the audio (created)")
    parser.add_argument("--profile", choices=("demo", "open"), default="demo",
                        help="demo: the 150-word grammar; open: open-vocabulary, many voices and "
                        "recording conditions (--num-* default to 1500 / 150 / 150 / 150 / 300 there)")
    parser.add_argument("--num-train", type=int, help="training utterances (demo: 1000)")
    parser.add_argument("--num-dev", type=int, help="development utterances (demo: 100)")
    parser.add_argument("--num-test", type=int, help="test utterances: the demo's held-out voice, "
                        "the open profile's training voices (demo: 100)")
    parser.add_argument("--num-test-unseen", type=int,
                        help="open profile: test utterances of voices never heard in training")
    parser.add_argument("--num-unlabelled-new-voices", type=int,
                        help="open profile: untranscribed utterances of the test_unseen voices, other sentences")
    parser.add_argument("--sentences", help="a UTF-8 text file, one sentence a line, instead of the "
                        "built-in grammar (needs at least as many distinct lines as utterances)")
    parser.add_argument("--seed", type=int, default=1234, help="random seed: same seed, same corpus")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="parallel espeak-ng processes")
    parser.add_argument("--noise-snr-db", type=float, nargs=2, default=[25.0, 45.0],
                        metavar=("LOW", "HIGH"), help="demo: range of the white-noise signal-to-noise ratio")
    args = parser.parse_args(argv)
    defaults = open_corpus.DEFAULT_COUNTS if args.profile == "open" else DEMO_COUNTS
    if args.profile == "demo" and (args.num_test_unseen, args.num_unlabelled_new_voices) != (None, None):
        parser.error("--num-test-unseen and --num-unlabelled-new-voices are for --profile open (the demo "
                     "has one test split and no untranscribed speech)")
    for split, option in zip(defaults, OPEN_OPTIONS):
        if getattr(args, option) is None:
            setattr(args, option, defaults[split])
    if args.profile == "open" and args.sentences:
        parser.error("--sentences is for --profile demo (the open profile reads the King James Bible)")
    return args


def split_counts(args):
    """{split: utterances} of the chosen profile."""
    if args.profile == "open":
        return {split: getattr(args, option) for split, option in zip(open_corpus.SPLITS, OPEN_OPTIONS)}
    return {"train": args.num_train, "dev": args.num_dev, "test": args.num_test}


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
    counts = split_counts(args)
    if args.profile == "open":
        return open_corpus.plan_utterances(counts, args.seed)
    rng = np.random.default_rng(args.seed)
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


def _render_open_job(job):
    """Render one open-profile utterance to its file (skipped when an earlier run wrote it)."""
    utterance, path = job
    if not os.path.isfile(path):
        audio, rate = open_corpus.render(utterance)
        temporary = f"{path}.tmp.{utterance['format']}"
        acoustics.write_audio(temporary, audio, rate, utterance["format"])
        os.replace(temporary, path)
    return sf.info(path).duration


def manifest_record(utterance, audio, duration):
    """One manifest line: the demo's fields, and the open profile's recording conditions. The
    untranscribed pool's words go in ``diagnostic_text`` instead of ``text`` and ``translation``, so
    every reader sees untranscribed speech; they are there to score pseudo-labels, not to train on."""
    record = {"id": utterance["id"], "audio": audio, "text": utterance["text"],
              "speaker": utterance["voice"], "duration": round(duration, 4), "lang": "en",
              "translation": pig_latin(utterance["text"])}
    if utterance["split"] == open_corpus.UNLABELLED:
        record["diagnostic_text"] = record.pop("text")
        del record["translation"]
    if "spoken" in utterance:
        record.update({key: utterance[key] for key in open_corpus.CONDITION_FIELDS})
    return record


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    acquire_process_lock(args.out_dir)  # a second run at once would delete this one's temporaries
    plan = plan_utterances(args)
    check_engines({f"espeak:{u['voice']}" if args.profile == "demo" else u["voice"] for u in plan})
    if args.profile == "open":
        audio = [open_corpus.audio_path(u) for u in plan]
        job = _render_open_job
    else:
        audio = [f"wav/{u['split']}/{u['id']}.wav" for u in plan]
        job = _synthesize_job
    for folder in {os.path.dirname(path) for path in audio}:
        os.makedirs(os.path.join(args.out_dir, folder), exist_ok=True)
    remove_temporaries(args.out_dir, {os.path.dirname(path) for path in audio})
    jobs = [(u, os.path.join(args.out_dir, path)) for u, path in zip(plan, audio)]
    with process_pool(args.jobs) as pool:
        durations = pool.map(job, jobs, chunksize=4 if args.profile == "open" else 16)
    for split in split_counts(args):
        records = [manifest_record(u, path, d) for u, path, d in zip(plan, audio, durations)
                   if u["split"] == split]
        manifest = os.path.join(args.out_dir, f"{split}.jsonl")
        atomic_write_text(manifest, "".join(json.dumps(r) + "\n" for r in records))
        logger.info("%s: %d utterances, %.2f h -> %s", split, len(records),
                    sum(r["duration"] for r in records) / 3600, manifest)
    if args.profile == "open":
        lm_text = write_lm_text(plan, os.path.join(args.out_dir, open_corpus.LM_TEXT))
        write_summary(open_corpus.corpus_summary(plan, lm_text, durations),
                      os.path.join(args.out_dir, open_corpus.SUMMARY))


def write_lm_text(plan, path):
    """The open corpus' text for a language model, one sentence a line (``open_corpus.lm_sentences``:
    the training books, none of the pool's sentences, nothing sharing a word 6-gram with dev or test);
    returns the sentences."""
    sentences = open_corpus.lm_sentences(plan)
    atomic_write_text(path, "".join(sentence + "\n" for sentence in sentences))
    logger.info("language-model text: %d sentences of the training books, no dev/test 6-gram -> %s",
                len(sentences), path)
    return sentences


def write_summary(summary, path):
    """``summary.json`` beside the manifests, and one log line per held-out split."""
    atomic_write_text(path, json.dumps(summary, indent=1) + "\n")
    for split, figures in summary["held_out"].items():
        nearest = figures["nearest_lm_relative_edits"]
        logger.info("%s: OOV %.2f %% of %d words; nearest LM sentence %d word edits at least, median %.0f %% "
                    "of the sentence; %.1f %% within 20 %%; %d share a 6-gram with train or LM", split,
                    100 * figures["oov_rate"], figures["words"], figures["nearest_lm_word_edits"]["min"],
                    100 * nearest["median"], 100 * figures["share_within_20pct_word_edits"],
                    figures["sharing_6gram_with_train_or_lm"])
    logger.info("held-out books %s; summary -> %s", ", ".join(summary["held_out_books"]), path)


def remove_temporaries(out_dir, folders):
    """Files a killed run left half-written (``*.tmp*``), so they cannot pile up."""
    for folder in folders:
        for name in os.listdir(os.path.join(out_dir, folder)):
            if ".tmp" in name:
                os.remove(os.path.join(out_dir, folder, name))


if __name__ == "__main__":
    run_command(main)
