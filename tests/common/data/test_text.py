"""common/data/text.py: mono and paired text batches with language tags and a token budget."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.data import TextLoaderConfig, make_text_loader
from common.data.synthetic import WORDS


@pytest.fixture(scope="module")
def pairs_parquet(tmp_path_factory):
    """60 sentence pairs en -> fr (the fr side is the reversed sentence)."""
    rows = [{"sample_key": f"p{i}", "text": " ".join(WORDS[i % 7 : i % 7 + 1 + i % 5]),
             "translation": " ".join(reversed(WORDS[i % 7 : i % 7 + 1 + i % 5])), "lang": "en",
             "tgt_lang": "fr"} for i in range(60)]
    path = tmp_path_factory.mktemp("text") / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_paired_batches_carry_tags_and_respect_the_token_budget(pairs_parquet, tokenizer_model):
    """src starts with <en>, tokens_bos with [1, <fr>]; size x longest (src + tgt) <= budget; all keys once."""
    loader = make_text_loader(pairs_parquet, tokenizer_model, TextLoaderConfig(120), target_column="translation",
                              lang_column="lang", target_lang_column="tgt_lang")
    en, fr = (loader.src_tokens[0][0], loader.tgt_tokens[0][0])
    keys = []
    for batch in loader:
        keys += batch.id
        assert (batch.src_tokens.data[:, 0] == en).all() and (batch.tokens_bos.data[:, 1] == fr).all()
        longest = batch.src_tokens.data.shape[1] + batch.tokens.data.shape[1]
        assert len(batch.id) * longest <= 120
    assert sorted(keys) == sorted(f"p{i}" for i in range(60))


def test_mono_text_ranks_get_equal_batches_and_disjoint_keys(pairs_parquet, tokenizer_model):
    """Two ranks: same batch count, no key on both ranks."""
    loaders = [make_text_loader(pairs_parquet, tokenizer_model, TextLoaderConfig(60), rank=r, world_size=2)
               for r in (0, 1)]
    keys = [{k for batch in loader for k in batch.id} for loader in loaders]
    assert len(loaders[0]) == len(loaders[1]) and not keys[0] & keys[1]


def test_a_noiser_noises_sources_in_the_collate_from_seed_epoch_and_position(pairs_parquet, tokenizer_model):
    """With a noiser, each mono batch's sources hold <mask> (id 4 here) where spans were masked while the
    targets stay clean; the same (seed, epoch, position) noises the same way, a resumed epoch included."""
    from common.text_noising import TextNoiser

    def loader():
        noiser = TextNoiser(mask_id=4, random_ids=range(5, 20), mask_ratio=0.4, poisson_lambda=2.0)
        return make_text_loader(pairs_parquet, tokenizer_model, TextLoaderConfig(80), seed=3, noiser=noiser)

    first = list(loader())
    assert any((batch.src_tokens.data == 4).any() for batch in first)
    assert all(not (batch.tokens.data == 4).any() for batch in first)
    again = list(loader())
    assert all(a.src_tokens.data.equal(b.src_tokens.data) for a, b in zip(first, again))
    resumed = loader()
    resumed.load_state_dict({"epoch": 0, "position": 2})
    assert [batch.src_tokens.data.tolist() for batch in resumed] == [b.src_tokens.data.tolist() for b in first[2:]]
