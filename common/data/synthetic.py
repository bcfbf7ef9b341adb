"""Tiny synthetic corpora (speech and text) in the exact shard format and tokenizer contract, written with the
project's own shard writer: the fixtures of the tests and the inputs of the loader benchmark.
"""

import json

import numpy as np
import pyarrow.parquet as pq
import sentencepiece

from common.atomic import atomic_path
from common.audio_io import encode_opus
from common.shard_format import (
    POOL_PARQUET,
    TEXT_METADATA_SCHEMA,
    ShardWriter,
    metadata_row,
    sample_json,
    text_metadata_table,
    text_shard_name,
    write_metadata,
    write_text_shard,
)
from common.tokens import SENTENCEPIECE_IDS

WORDS = "the a cat dog sat ran on under mat tree house river blue green small big".split()


def tone(seconds, rng):
    """A 16 kHz tone with a little noise, ``seconds`` long (float32)."""
    t = np.arange(int(seconds * 16000)) / 16000
    wave = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 1000) * t) + 0.05 * rng.standard_normal(len(t))
    return wave.astype(np.float32)


def write_shards(out_dir, shard_sizes, seed=0, prefix="shard", min_seconds=0.3, max_seconds=2.0,
                 carried=lambda text: {}):
    """Write one tar per entry of ``shard_sizes`` (utterances) and ``metadata_pool.parquet``;
    ``carried(text)`` gives each sample's carried fields (e.g. a translation)."""
    rng = np.random.default_rng(seed)
    rows = []
    for index, size in enumerate(shard_sizes):
        shard_name = f"{prefix}-{index:06d}.tar"
        writer = ShardWriter(out_dir / shard_name)
        for item in range(size):
            key = f"{prefix}_{index}_{item}"
            seconds = float(rng.uniform(min_seconds, max_seconds))
            text = " ".join(rng.choice(WORDS, rng.integers(1, 8)))
            sample = sample_json(text, seconds, "tones", carried(text))
            offsets = writer.add(key, encode_opus(tone(seconds, rng)), json.dumps(sample).encode())
            rows.append(metadata_row(key, sample, shard_name, offsets))
        writer.close()
    write_metadata(rows, out_dir / POOL_PARQUET)
    return out_dir / POOL_PARQUET


def write_text_shards(metadata_path, shard_sizes, seed=0, paired=False, langs=("en", "fr")):
    """Text shards of ``shard_sizes`` sentences (pairs: the target is the reversed source) of 1-12 WORDS,
    and their metadata parquet ``metadata_path``, in the format of ``local/make_text_shards.py``.
    The sentences are made one shard at a time: any size fits in memory."""
    rng, folder = np.random.default_rng(seed), metadata_path.parent
    words = np.array(WORDS)
    with atomic_path(metadata_path) as temporary, pq.ParquetWriter(temporary, TEXT_METADATA_SCHEMA) as metadata:
        for index, size in enumerate(shard_sizes):
            counts = rng.integers(1, 13, size)
            picks = words[rng.integers(0, len(words), int(counts.sum()))].tolist()
            ends = np.cumsum(counts).tolist()
            texts = [" ".join(picks[end - count:end]) for end, count in zip(ends, counts.tolist())]
            columns = {"sample_key": [f"s{index}_{i}" for i in range(size)], "text": texts,
                       "translation": [" ".join(t.split()[::-1]) for t in texts] if paired else [None] * size,
                       "lang": [langs[0]] * size, "tgt_lang": [langs[1] if paired else None] * size}
            name = text_shard_name(metadata_path, index)
            write_text_shard(folder / name, columns)
            metadata.write_table(text_metadata_table(columns, name))
    return metadata_path


def train_tiny_tokenizer(out_dir):
    """Train a 30-piece unigram model on WORDS with language tags <en>, <fr>; return its path."""
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS, 6)) for _ in range(300)]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(out_dir / "unigram_30"), vocab_size=30,
        user_defined_symbols=["<en>", "<fr>"], minloglevel=2, **SENTENCEPIECE_IDS,
    )
    return out_dir / "unigram_30.model"
