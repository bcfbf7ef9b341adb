"""common/data/text.py: text batches streamed from text shards: language tags, a token budget, every
sentence once per epoch, equal steps per rank, exact resume, tokenization in the workers."""

import glob
import itertools
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

from common.data import TextLoaderConfig, make_text_loader, text
from common.data.synthetic import write_text_shards
from common.data.text import pieces_to_reach

UNEVEN = [30, 12, 17, 9, 21]  # sentences per shard


@pytest.fixture(scope="module")
def pairs_parquet(tmp_path_factory):
    """89 sentence pairs en -> fr in five uneven shards (the fr side is the reversed sentence)."""
    return write_text_shards(tmp_path_factory.mktemp("pairs") / "pairs.parquet", UNEVEN, paired=True)


@pytest.fixture(scope="module")
def mono_parquet(tmp_path_factory):
    """89 sentences in five uneven shards."""
    return write_text_shards(tmp_path_factory.mktemp("mono") / "mono.parquet", UNEVEN, seed=1)


def all_keys(parquet):
    return pq.read_table(parquet, columns=["sample_key"])["sample_key"].to_pylist()


def epoch_keys(loader):
    """The keys of each batch of one epoch, in order."""
    return [list(batch.id) for batch in loader]


def test_paired_batches_carry_tags_and_respect_the_token_budget(pairs_parquet, tokenizer_model):
    """src starts with <en>, tokens_bos with [1, <fr>]; size x longest (src + tgt) <= budget; all keys once."""
    loader = make_text_loader(pairs_parquet, tokenizer_model, TextLoaderConfig(250), target_column="translation",
                              lang_column="lang", target_lang_column="tgt_lang")
    en, fr = loader.dataset.tokenizer.piece_id("<en>"), loader.dataset.tokenizer.piece_id("<fr>")
    keys = []
    for batch in loader:
        keys += batch.id
        assert (batch.src_tokens.data[:, 0] == en).all() and (batch.tokens_bos.data[:, 1] == fr).all()
        longest = batch.src_tokens.data.shape[1] + batch.tokens.data.shape[1]
        assert len(batch.id) * longest <= 250
    assert sorted(keys) == sorted(all_keys(pairs_parquet))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_sentence_once_per_epoch_and_equal_steps_per_rank_over_uneven_shards(mono_parquet, tokenizer_model,
                                                                                   num_workers):
    """Two ranks over five shards of 9 to 30 sentences, in worker processes or not: both ranks take the
    same number of batches in each of two epochs, and together they yield every sentence exactly once."""
    config = TextLoaderConfig(200, num_workers=num_workers)
    loaders = [make_text_loader(mono_parquet, tokenizer_model, config, seed=5, rank=r, world_size=2) for r in (0, 1)]
    for _ in range(2):
        announced = len(loaders[0])
        per_rank = [epoch_keys(loader) for loader in loaders]
        assert len(per_rank[0]) == len(per_rank[1]) == announced > 0
        assert sorted(k for batches in per_rank for batch in batches for k in batch) == sorted(all_keys(mono_parquet))
    assert loaders[0].epoch == 2


def test_one_shard_still_feeds_two_ranks_in_equal_steps(tmp_path, tokenizer_model):
    """A corpus of one shard (the small-corpus case) under two ranks: each rank takes every other batch
    of the one-rank plan, the same count on both, no sentence on both ranks."""
    parquet = write_text_shards(tmp_path / "one.parquet", [40])
    loaders = [make_text_loader(parquet, tokenizer_model, TextLoaderConfig(200), rank=r, world_size=2) for r in (0, 1)]
    keys = [epoch_keys(loader) for loader in loaders]
    assert len(keys[0]) == len(keys[1]) > 0
    assert not {k for b in keys[0] for k in b} & {k for b in keys[1] for k in b}


@pytest.mark.parametrize("shards,counting,reading", [([40], 0, 1), (UNEVEN, 2, 2)])
def test_counting_forks_workers_only_where_two_or_more_run(tmp_path, tokenizer_model, monkeypatch, shards,
                                                           counting, reading):
    """With num_workers=2, a start counts shards (token counts, batch sizes) in worker processes only
    where two or more run: one shard is counted in the main process, which would otherwise wait for a
    lone worker's fork; its epoch is still read in a worker (which overlaps training). Every sentence
    comes once; one shard gives the batches of the loader without workers."""
    parquet = write_text_shards(tmp_path / "text.parquet", shards, seed=2)
    alone = epoch_keys(make_text_loader(parquet, tokenizer_model, TextLoaderConfig(200), seed=4))
    started = []

    class RecordingLoader(DataLoader):
        def __init__(self, dataset, **kwargs):
            started.append((type(dataset).__name__, kwargs["num_workers"]))
            super().__init__(dataset, **kwargs)

    monkeypatch.setattr(text, "DataLoader", RecordingLoader)
    loader = make_text_loader(parquet, tokenizer_model, TextLoaderConfig(200, num_workers=2), seed=4)
    keys = epoch_keys(loader)
    assert sorted(k for batch in keys for k in batch) == sorted(all_keys(parquet))
    assert keys == alone or len(shards) > 1
    assert started == [("ShardSummaries", counting), ("ShardBatchSizes", counting), ("TextShardDataset", reading)]


@pytest.mark.parametrize("stop_after", [1, 4])
def test_resume_mid_epoch_equals_the_uninterrupted_epoch(mono_parquet, tokenizer_model, stop_after):
    """Stopped after ``stop_after`` batches (2 worker processes) and restored from its state, a new
    loader yields exactly the remaining batches of the uninterrupted epoch, then the same next epoch."""
    from common.text_noising import TextNoiser

    def loader():
        noiser = TextNoiser(mask_id=4, random_ids=range(5, 20), mask_ratio=0.4, poisson_lambda=2.0)
        return make_text_loader(mono_parquet, tokenizer_model, TextLoaderConfig(200, num_workers=2), seed=3,
                                noiser=noiser)

    reference = loader()
    uninterrupted = [[b.src_tokens.data.tolist() for b in reference] for _ in range(2)]
    first = loader()
    for position, _ in enumerate(first, start=1):
        if position == stop_after:
            break
    state = first.state_dict()
    assert state == {"epoch": 0, "position": stop_after}
    resumed = loader()
    resumed.load_state_dict(state)
    assert [b.src_tokens.data.tolist() for b in resumed] == uninterrupted[0][stop_after:]
    assert [b.src_tokens.data.tolist() for b in resumed] == uninterrupted[1]


def test_a_noiser_noises_sources_in_the_collate_from_seed_epoch_and_position(mono_parquet, tokenizer_model):
    """With a noiser, mono sources hold <mask> (id 4 here) where spans were masked while the targets stay
    clean; the same (seed, epoch, position) noises the same way."""
    from common.text_noising import TextNoiser

    def loader():
        noiser = TextNoiser(mask_id=4, random_ids=range(5, 20), mask_ratio=0.4, poisson_lambda=2.0)
        return make_text_loader(mono_parquet, tokenizer_model, TextLoaderConfig(200), seed=3, noiser=noiser)

    first = list(loader())
    assert any((batch.src_tokens.data == 4).any() for batch in first)
    assert all(not (batch.tokens.data == 4).any() for batch in first)
    assert all(a.src_tokens.data.equal(b.src_tokens.data) for a, b in zip(first, loader()))


def test_token_ids_are_kept_beside_the_shards_and_max_tokens_filters(tmp_path, tokenizer_model):
    """The first loader keeps each shard's token ids (one .npz per shard); a second loader reads them
    and plans the same epoch; max_tokens leaves out the longer sentences (source + target tokens)."""
    parquet = write_text_shards(tmp_path / "mono.parquet", [12, 8])
    first = make_text_loader(parquet, tokenizer_model, TextLoaderConfig(200))
    assert len(glob.glob(str(tmp_path / "mono-*.parquet.ids-*.npz"))) == 2
    second = make_text_loader(parquet, tokenizer_model, TextLoaderConfig(200))
    assert [b.tolist() for b in first.planned_rows(0)] == [b.tolist() for b in second.planned_rows(0)]
    limited = make_text_loader(parquet, tokenizer_model, TextLoaderConfig(200, max_tokens=12))
    kept = {k for batch in limited for k in batch.id}
    counts = [first.corpus.counts[shard] for shard in range(len(first.corpus.shard_paths))]
    lengths = dict(zip(all_keys(parquet), [int(n) for shard in counts for n in shard]))
    assert kept == {k for k, n in lengths.items() if n <= 12} and len(kept) < len(lengths)


@pytest.mark.parametrize("paired", [False, True])
def test_epochs_read_the_kept_token_ids_and_yield_what_tokenizing_yields(tmp_path, tokenizer_model, monkeypatch,
                                                                          paired):
    """Once a shard's ids are kept, an epoch does not tokenize (encode_rows made to fail) and yields the
    batches a loader tokenizing every row yields (ids cache removed and made unwritable: the fallback),
    language tags included; each source row is the tokenizer's ids of its sentence."""
    import common.data.text as text

    parquet = write_text_shards(tmp_path / "corpus.parquet", [12, 8], paired=paired)
    options = dict(target_column="translation", lang_column="lang", target_lang_column="tgt_lang") if paired else {}

    def epoch():
        loader = make_text_loader(parquet, tokenizer_model, TextLoaderConfig(200), seed=2, **options)
        return [(list(b.id), list(b.text), b.src_tokens.data.tolist(), b.tokens_eos.data.tolist()) for b in loader]

    make_text_loader(parquet, tokenizer_model, TextLoaderConfig(200), **options)  # keeps the ids
    with monkeypatch.context() as patch:
        patch.setattr(text, "encode_rows", lambda *args: pytest.fail("an epoch tokenized rows it has ids for"))
        from_ids = epoch()
    for cache in glob.glob(str(tmp_path / "corpus-*.parquet.ids-*.npz")):
        os.remove(cache)
    monkeypatch.setattr(text.ShardIds, "save", lambda self, path: (_ for _ in ()).throw(OSError("read-only")))
    assert epoch() == from_ids and not glob.glob(str(tmp_path / "corpus-*.parquet.ids-*.npz"))
    tokenizer = text.Tokenizer(tokenizer_model)
    table = pa.concat_tables(pq.read_table(path) for path in text.text_shard_paths(parquet))
    sentences = dict(zip(table["sample_key"].to_pylist(), table["text"].to_pylist()))
    tag = [tokenizer.piece_id("<en>")] if paired else []
    for keys, _, src, _ in from_ids:
        for key, row in zip(keys, src):
            ids = tag + tokenizer.encode(sentences[key])
            assert row[:len(ids)] == ids and not any(row[len(ids):])


def test_a_parquet_that_is_not_text_shards_metadata_is_refused_with_the_fix(tmp_path, tokenizer_model):
    """A single text parquet of the earlier format names make_text_shards.py."""
    pq.write_table(pa.Table.from_pylist([{"sample_key": "a", "text": "the cat"}]), tmp_path / "old.parquet")
    with pytest.raises(ValueError, match="make_text_shards.py"):
        make_text_loader(tmp_path / "old.parquet", tokenizer_model, TextLoaderConfig(200))


def test_the_main_process_holds_numbers_per_shard_not_per_sentence(mono_parquet, tokenizer_model):
    """What the loader keeps between epochs (corpus and plan) has one entry per shard or per batch: no
    array as long as the corpus's sentences, so its memory does not grow with the text."""
    loader = make_text_loader(mono_parquet, tokenizer_model, TextLoaderConfig(200, num_workers=2), world_size=1)
    corpus, slots = loader.corpus, loader.plan(0)
    shards = len(corpus.shard_paths)
    assert len(corpus) == sum(UNEVEN) and shards == len(UNEVEN)
    assert all(len(getattr(corpus, name)) <= shards + 1 for name in ("shard_starts", "shard_tokens", "shard_used"))
    batches = loader.batches_in_epoch(0)
    assert sum(len(pieces) for slot in slots for pieces in slot.pieces) <= batches < sum(UNEVEN)
    rows = np.concatenate(loader.planned_rows(0))
    assert sorted(rows.tolist()) == list(range(sum(UNEVEN)))


@pytest.mark.parametrize("sizes,target", [([5, 3, 1], 5), ([2, 2], 4), ([9], 4), ([1, 7, 7], 3)])
def test_pieces_reach_the_target_cutting_the_largest_batches(sizes, target):
    """Batches of ``sizes`` cut into ``target`` pieces in all: no batch into more pieces than sentences,
    and no other cut would leave a smaller largest piece."""
    pieces = pieces_to_reach(np.array(sizes), target)
    assert pieces.sum() == target and (pieces <= np.array(sizes)).all()
    largest = max(-(-s // p) for s, p in zip(sizes, pieces))
    assert largest == min(max(-(-s // p) for s, p in zip(sizes, other))
                          for other in itertools.product(*[range(1, s + 1) for s in sizes]) if sum(other) == target)


def test_single_sentence_batches_cannot_be_cut_and_the_error_names_the_fix():
    with pytest.raises(ValueError, match="--shard-sentences"):
        pieces_to_reach(np.array([1, 1]), 3)
