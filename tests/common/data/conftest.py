"""Tiny real shards (Ogg Opus tones and noise of varied lengths) following the shard contract."""

import io
import json
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sentencepiece
import soundfile

WORDS = "the a cat dog sat ran on under mat tree house river blue green small big".split()


def opus_bytes(seconds, rng):
    """A 16 kHz Ogg Opus clip: a tone plus noise, ``seconds`` long."""
    t = np.arange(int(seconds * 16000)) / 16000
    wave = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 1000) * t) + 0.05 * rng.standard_normal(len(t))
    buffer = io.BytesIO()
    soundfile.write(buffer, wave.astype(np.float32), 16000, format="OGG", subtype="OPUS")
    return buffer.getvalue()


def add_member(tar, name, data):
    """Append one member; return the byte offset of its data inside the tar."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return tar.offset - ((len(data) + 511) // 512) * 512


def write_shards(out_dir, shard_sizes, seed=0, prefix="shard", min_seconds=0.3, max_seconds=2.0):
    """Write ``len(shard_sizes)`` tars of tones and ``metadata_pool.parquet``; return the rows written."""
    rng = np.random.default_rng(seed)
    rows = []
    for index, size in enumerate(shard_sizes):
        shard_name = f"{prefix}-{index:06d}.tar"
        with tarfile.open(out_dir / shard_name, "w", format=tarfile.USTAR_FORMAT) as tar:
            for item in range(size):
                key = f"{prefix}_{index}_{item}"
                seconds = float(np.round(rng.uniform(min_seconds, max_seconds), 3))
                text = " ".join(rng.choice(WORDS, rng.integers(1, 8)))
                audio = opus_bytes(seconds, rng)
                meta = json.dumps({"text": text, "duration": seconds, "source": "tones"}).encode()
                opus_offset = add_member(tar, f"{key}.opus", audio)
                json_offset = add_member(tar, f"{key}.json", meta)
                rows.append(dict(sample_key=key, text=text, duration=seconds, shard_name=shard_name,
                                 speaker=None, lang="en", source="tones", opus_offset=opus_offset,
                                 opus_size=len(audio), json_offset=json_offset, json_size=len(meta), extra="{}"))
    pq.write_table(pa.Table.from_pylist(rows), out_dir / "metadata_pool.parquet")
    return rows


@pytest.fixture(scope="session")
def tone_shards(tmp_path_factory):
    """Six uneven shards (42 utterances of 0.3-2 s); returns the parquet path."""
    out_dir = tmp_path_factory.mktemp("tone_shards")
    write_shards(out_dir, [3, 12, 5, 9, 6, 7])
    return out_dir / "metadata_pool.parquet"


@pytest.fixture(scope="session")
def tokenizer_model(tmp_path_factory):
    """A SentencePiece model with the tokenizer contract's ids (0 pad/blank, 1 bos, 2 eos, 3 unk)."""
    out_dir = tmp_path_factory.mktemp("tokenizer")
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS, 6)) for _ in range(300)]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(out_dir / "unigram_30"), vocab_size=30,
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, user_defined_symbols=["<en>", "<fr>"],
        minloglevel=2,
    )
    return out_dir / "unigram_30.model"
