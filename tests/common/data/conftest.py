"""Fast session-wide fixtures: tiny real shards written with the project's shard writer, a tokenizer
(common/data/synthetic.py).

``make_shard_dir`` (tests/conftest.py) runs the real local/make_shards.py and is used where the whole
path matters; these shards follow the same contract and are made once per session for speed.
"""

import pytest

from common.data.synthetic import train_tiny_tokenizer, write_shards


@pytest.fixture(scope="session")
def tone_shards(tmp_path_factory):
    """Six uneven shards (42 utterances of 0.3-2 s); returns the parquet path."""
    return write_shards(tmp_path_factory.mktemp("tone_shards"), [3, 12, 5, 9, 6, 7])


@pytest.fixture(scope="session")
def tokenizer_model(tmp_path_factory):
    """A SentencePiece model with the tokenizer contract's ids (0 pad/blank, 1 bos, 2 eos, 3 unk)."""
    return train_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))
