"""Shared fixtures: real audio made in the test, turned into real shards by local/make_shards.py."""

import json
import os

import numpy as np
import pytest
import soundfile as sf

from local import make_shards, synth_corpus, train_tokenizer

TONE_RATE = 16000


def write_tone(path, seconds, frequency=440.0, rate=TONE_RATE, channels=1, seed=0, **write_args):
    """Write a tone with a little noise (so Opus has something to code) to ``path``; returns it."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    mono = 0.3 * np.sin(2 * np.pi * frequency * t) + 0.01 * rng.standard_normal(len(t))
    sf.write(path, np.repeat(mono[:, None], channels, axis=1).astype(np.float32), rate, **write_args)
    return path


def write_manifest(path, records):
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)
    return path


def tone_corpus(folder, num_samples, min_s=0.5, max_s=3.0, seed=0):
    """A JSONL manifest of ``num_samples`` tones of random lengths in ``folder``; returns its path."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    records = []
    for index in range(num_samples):
        seconds = float(rng.uniform(min_s, max_s))
        name = f"utt{index:05d}.wav"
        write_tone(os.path.join(folder, name), seconds, frequency=200 + 10 * index, seed=index)
        records.append({"id": f"utt{index:05d}", "audio": name, "text": f"tone number {index}",
                        "speaker": f"spk{index % 3}"})
    return write_manifest(os.path.join(folder, "manifest.jsonl"), records)


@pytest.fixture
def make_shard_dir(tmp_path):
    """Build a shard folder from generated tones with the real make_shards.py.

    >>> shard_dir = make_shard_dir(num_samples=20, shard_size_mb=0.05)   # doctest: +SKIP
    """
    def make(num_samples=12, min_s=0.5, max_s=3.0, shard_size_mb=0.05, seed=0, prefix="shard"):
        corpus = tmp_path / f"corpus-{prefix}-{seed}"
        out = tmp_path / f"shards-{prefix}-{seed}"
        manifest = tone_corpus(corpus, num_samples, min_s, max_s, seed)
        make_shards.main([manifest, str(out), "--jobs", "1", "--shard-size", str(shard_size_mb),
                          "--prefix", prefix])
        return out
    return make


@pytest.fixture(scope="session")
def speech_corpus(tmp_path_factory):
    """A small espeak-ng corpus (train 40 / dev 8 / test 8 utterances) made by synth_corpus.py."""
    out = tmp_path_factory.mktemp("speech_corpus")
    synth_corpus.main([str(out), "--num-train", "40", "--num-dev", "8", "--num-test", "8",
                       "--jobs", "2"])
    return out


@pytest.fixture(scope="session")
def speech_shards(speech_corpus, tmp_path_factory):
    """{split: shard folder} for the speech_corpus, made by make_shards.py."""
    out = tmp_path_factory.mktemp("speech_shards")
    folders = {}
    for split in ("train", "dev", "test"):
        folders[split] = out / split
        make_shards.main([str(speech_corpus / f"{split}.jsonl"), str(folders[split]), "--jobs", "2",
                          "--shard-size", "0.1", "--prefix", split])
    return folders


@pytest.fixture(scope="session")
def tokenizer_file(speech_shards, tmp_path_factory):
    """A 60-piece BPE tokenizer of the tiny corpus' transcripts."""
    out = tmp_path_factory.mktemp("tokenizer")
    texts = train_tokenizer.read_texts([str(speech_shards["train"])])
    return train_tokenizer.train_tokenizer(texts, str(out), 60, "bpe")
