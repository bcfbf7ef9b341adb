"""Fixtures of the recipe tests (the espeak-ng corpus and its shards come from tests/conftest.py)."""

import pytest

from local import train_tokenizer


@pytest.fixture(scope="session")
def tokenizer_file(speech_shards, tmp_path_factory):
    """A 60-piece BPE tokenizer of the tiny corpus' transcripts."""
    out = tmp_path_factory.mktemp("tokenizer")
    texts = train_tokenizer.read_texts([str(speech_shards["train"])])
    return train_tokenizer.train_tokenizer(texts, str(out), 60, "bpe")
