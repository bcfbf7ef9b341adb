"""common/data/config.py: the loader blocks of a config, checked before any loader is built."""

import os

import pytest

from common.data import LoaderConfigError, SpeechLoaderConfig, TextLoaderConfig
from common.recipe import load_checked_hparams

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "recipes", "finetune", "hparams")


def test_a_block_becomes_its_dataclass_with_defaults():
    """Keys given are kept (an int where a float is expected too), the rest take their defaults."""
    config = SpeechLoaderConfig.from_config({"max_batch_seconds": 60, "num_workers": 2,
                                             "filters": {"max_duration": 20.0}}, "train_loader")
    assert config.max_batch_seconds == 60 and config.num_workers == 2 and config.batch_buffer == 1024
    assert TextLoaderConfig.from_config({"max_batch_tokens": 800, "max_tokens": None}).max_tokens is None


@pytest.mark.parametrize("block,message", [
    ({"max_batch_seconds": 60.0, "num_worker": 2}, r'train_loader: "num_worker".*Did you mean "num_workers"'),
    ({"max_batch_seconds": "sixty"}, r"train_loader\[max_batch_seconds\]='sixty' is a str: expected float"),
    ({"max_batch_seconds": 60.0, "num_workers": 1.5}, r"num_workers\]=1.5 is a float: expected int"),
    ({"max_batch_seconds": 60.0, "cache_audio": "yes"}, r"cache_audio\]='yes' is a str: expected bool"),
    ({"num_workers": 2}, r"train_loader: max_batch_seconds must be set"),
    ({"max_batch_seconds": 60.0, "num_workers": 2, "cache_audio": True}, r"set num_workers: 0"),
])
def test_mistakes_name_the_key_and_the_fix(block, message):
    """A misspelled key, a wrong type, a missing budget, cached audio with workers: each refused."""
    with pytest.raises(LoaderConfigError, match=message):
        SpeechLoaderConfig.from_config(block, "train_loader")


def test_derived_config_and_command_line_change_one_key_of_a_block():
    """demo.yaml changes some keys of conformer.yaml's train_loader, keeps the others; a command-line
    block override changes one key more; the top-level budget reaches the block by reference."""
    placeholders = {"train_parquet": "x", "valid_parquet": "x", "test_parquets": ["x"], "tokenizer_file": "x"}
    from common.recipe import resolve_derived_config
    base, overrides = resolve_derived_config(os.path.join(CONFIGS, "demo.yaml"),
                                             {**placeholders, "max_batch_seconds": 50.0,
                                              "train_loader": {"batch_buffer": 64}})
    overrides["vocab_size"] = 60  # no tokenizer file: the model is not built here
    hparams = load_checked_hparams(base, overrides)
    config = SpeechLoaderConfig.from_config(hparams["train_loader"], "train_loader")
    assert (config.max_batch_seconds, config.batch_buffer, config.cache_audio) == (50.0, 64, True)
    assert config.speed_perturb is None and config.filters["max_duration"] == 10.0
    assert config.filters["max_tokens_per_second"] == 30.0  # from the base
