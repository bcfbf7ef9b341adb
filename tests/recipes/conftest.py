"""Fixtures of the recipe tests (the espeak-ng corpus, its shards and tokenizer come from tests/conftest.py)."""

import pytest

from recipes.finetune import train
from tests.recipes.finetune_args import train_argv


@pytest.fixture(scope="session")
def trained(speech_shards, tokenizer_file, tmp_path_factory):
    """A tiny finetune experiment after its test stage (hyperparams.yaml and averaged.ckpt)."""
    exp = tmp_path_factory.mktemp("trained")
    train.main(train_argv(speech_shards, tokenizer_file, exp, "--number_of_epochs=6", "--lr_peak=0.005"))
    return exp
