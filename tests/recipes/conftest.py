"""Fixtures of the recipe tests (the espeak-ng corpus and its shards come from tests/conftest.py)."""

import pytest

from local import train_tokenizer
from recipes.finetune import train
from tests.recipes.finetune_args import train_argv


@pytest.fixture(scope="session")
def tokenizer_file(speech_shards, tmp_path_factory):
    """A 60-piece BPE tokenizer of the tiny corpus' transcripts."""
    out = tmp_path_factory.mktemp("tokenizer")
    texts = train_tokenizer.read_texts([str(speech_shards["train"])])
    return train_tokenizer.train_tokenizer(texts, str(out), 60, "bpe")


@pytest.fixture(scope="session")
def trained(speech_shards, tokenizer_file, tmp_path_factory):
    """A tiny finetune experiment after its test stage (hyperparams.yaml and averaged.ckpt)."""
    exp = tmp_path_factory.mktemp("trained")
    train.main(train_argv(speech_shards, tokenizer_file, exp, "--number_of_epochs=6", "--lr_peak=0.005"))
    return exp
