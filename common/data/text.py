"""Text loaders for pretraining and language models: mono text (denoising, LM) and paired text
(translation), streamed from text shards (``local/make_text_shards.py``, ``common/shard_format.py``).

The main process plans each epoch from token counts alone, with the speech planner
(``planning.plan_epoch``: whole shards per rank and worker, the same batcher, the same number of
batches on every rank); dataloader workers read their shards front to back, tokenize the sentences
there and yield collated batches. No sentence is held by the main process, so its memory grows with
a few bytes per sentence (the plan), not with the text.

Token counts: the first loader over a corpus with a given tokenizer tokenizes every shard once (in the
workers) and keeps each shard's counts beside it (``SHARD.tokens-<hash>.npy``); later loaders read them.

Batches: ``id``, ``text`` (target text), ``src_tokens``, ``tokens``, ``tokens_bos``, ``tokens_eos``.
Mono text: source = target = the sentence. Language tags such as ``<en>`` are prepended to source and
target tokens when a language column is given. With a ``noiser``, sources are noised in the workers.
"""

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow.parquet as pq
import torch
from speechbrain.dataio.batch import PaddedData
from torch.utils.data import DataLoader, Dataset

from common.atomic import atomic_path
from common.data.batching import check_budget
from common.data.config import TextLoaderConfig
from common.data.pipeline import TEXT_FIELDS, Tokenizer, text_batch
from common.data.planning import SlotPlan, batches_to_skip, plan_epoch
from common.data.stream import BatchStream, SlotDataset
from common.shard_format import text_shard_paths

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TextColumns:
    """Which shard columns a loader reads: source, optional target, optional language columns."""

    text: str = "text"
    target: Optional[str] = None
    lang: Optional[str] = None
    target_lang: Optional[str] = None

    def names(self):
        """The columns to read, sample key first."""
        return ["sample_key", *dict.fromkeys(c for c in (self.text, self.target, self.lang, self.target_lang) if c)]


def tag_tokens(tokenizer, texts, langs):
    """Token id lists, each prefixed with its language tag id when ``langs`` is given."""
    tokens = tokenizer.encode(list(texts))
    if langs is None:
        return tokens
    tag_ids = {lang: tokenizer.piece_id(f"<{lang}>") for lang in set(langs)}
    return [[tag_ids[lang]] + ids for lang, ids in zip(langs, tokens)]


def encode_rows(table, tokenizer, columns):
    """(keys, target texts, source ids, target ids) of a shard's rows (a pyarrow table)."""
    values = {name: table[name].to_pylist() for name in columns.names()}
    src = tag_tokens(tokenizer, values[columns.text], values.get(columns.lang))
    if columns.target is None:
        return values["sample_key"], values[columns.text], src, src
    tgt = tag_tokens(tokenizer, values[columns.target], values.get(columns.target_lang))
    return values["sample_key"], values[columns.target], src, tgt


class ShardTokenCounts(Dataset):
    """Item ``i``: source + target token count of each sentence of shard ``i`` (int32 array), read from
    its cache file or counted (and cached) in the worker that gets it."""

    def __init__(self, shard_paths, tokenizer, columns):
        self.shard_paths, self.tokenizer, self.columns = shard_paths, tokenizer, columns
        self.tag = counts_tag(tokenizer, columns)

    def __len__(self):
        return len(self.shard_paths)

    def __getitem__(self, index):
        path = self.shard_paths[index]
        cache = f"{path}.tokens-{self.tag}.npy"
        if os.path.isfile(cache) and os.path.getmtime(cache) >= os.path.getmtime(path):
            return np.load(cache)
        _, _, src, tgt = encode_rows(pq.read_table(path, columns=self.columns.names()), self.tokenizer, self.columns)
        counts = np.fromiter((len(s) + len(t) for s, t in zip(src, tgt)), dtype=np.int32, count=len(src))
        try:
            with atomic_path(cache) as temporary, open(temporary, "wb") as handle:
                np.save(handle, counts)
        except OSError as error:  # a read-only corpus folder: count again next time
            logger.warning("cannot keep the token counts of %s (%s): they are counted at each start", path, error)
        return counts


def counts_tag(tokenizer, columns):
    """8 hex digits naming what token counts depend on: the tokenizer model's bytes and the columns."""
    digest = hashlib.blake2b(digest_size=4)
    with open(tokenizer.model_path, "rb") as handle:
        digest.update(handle.read())
    digest.update(json.dumps(columns.__dict__, sort_keys=True).encode())
    return digest.hexdigest()


@dataclass
class TextCorpus:
    """What planning needs of one or more text corpora, rows in shard order (no text).

    shard_paths : list of str, absolute shard paths
    shard_starts : np.ndarray of int64, the first row of each shard (and the row count last)
    lengths : np.ndarray of int32, source + target tokens of each row
    shard_of_row : np.ndarray of int32, shard index of each row (-1: filtered out)
    """

    shard_paths: list
    shard_starts: np.ndarray
    lengths: np.ndarray
    shard_of_row: np.ndarray

    def __len__(self):
        return len(self.lengths)


def read_text_corpus(parquets, tokenizer, columns, num_workers=0):
    """The ``TextCorpus`` of one or more text metadata parquets; token counts from the shards' caches or
    counted in ``num_workers`` processes (0: here)."""
    paths = [parquets] if isinstance(parquets, (str, bytes, os.PathLike)) else list(parquets)
    if not paths:
        raise ValueError("no text parquet given: pass the OUT.parquet of local/make_text_shards.py")
    shard_paths = [shard for path in paths for shard in text_shard_paths(path)]
    counts = DataLoader(ShardTokenCounts(shard_paths, tokenizer, columns), batch_size=None,
                        num_workers=min(num_workers, len(shard_paths)))
    per_shard = list(counts)
    sizes = np.array([len(c) for c in per_shard], dtype=np.int64)
    return TextCorpus(shard_paths, np.concatenate([[0], np.cumsum(sizes)]),
                      np.concatenate(per_shard).astype(np.int32),
                      np.repeat(np.arange(len(shard_paths), dtype=np.int32), sizes))


class SentenceStream:
    """The sentences of a slot's remaining batches, read shard by shard in stream order as batches ask
    for them; each is tokenized when its shard is read and released when its batch takes it."""

    def __init__(self, dataset, slot, remaining):
        self.dataset, self.shards, self.held = dataset, iter(slot.shards), {}
        self.needed = np.sort(np.concatenate(remaining)) if remaining else np.empty(0, dtype=np.int64)

    def take(self, row):
        """(key, text, source ids, target ids) of ``row``, reading shards until it is there."""
        while row not in self.held:
            self.read(next(self.shards))
        return self.held.pop(row)

    def read(self, shard):
        """Tokenize and hold the needed rows of one shard."""
        start, end = self.dataset.corpus.shard_starts[shard], self.dataset.corpus.shard_starts[shard + 1]
        rows = self.needed[np.searchsorted(self.needed, start):np.searchsorted(self.needed, end)]
        if not len(rows):
            return
        table = pq.read_table(self.dataset.corpus.shard_paths[shard], columns=self.dataset.columns.names())
        encoded = encode_rows(table.take(rows - start), self.dataset.tokenizer, self.dataset.columns)
        self.held.update(zip(rows.tolist(), zip(*encoded)))


class TextShardDataset(SlotDataset):
    """Yields one rank's planned text batches of one epoch; inside a worker, only that worker's share.
    Set ``slots`` (the rank's ``SlotPlan`` list), ``epoch`` and ``consumed`` before iterating."""

    def __init__(self, corpus, tokenizer, columns, seed, noiser=None):
        self.corpus, self.tokenizer, self.columns, self.seed, self.noiser = corpus, tokenizer, columns, seed, noiser
        self.slots, self.epoch, self.consumed = [], 0, 0

    def slot_batches(self, worker):
        """Collated batches of one slot, from the first one not yet consumed."""
        workers, batches = len(self.slots), self.slots[worker].batches
        skip = batches_to_skip(self.consumed, worker, workers)
        stream = SentenceStream(self, self.slots[worker], batches[skip:])
        for j in range(skip, len(batches)):
            position = j * workers + worker  # the batch's index in the rank's epoch (round-robin over workers)
            rng = np.random.default_rng([self.seed, self.epoch, position, 4])
            yield as_arrays(self.collate([stream.take(int(row)) for row in batches[j]], rng))

    def collate(self, sentences, rng):
        """PaddedBatch of (key, text, source ids, target ids); with a ``noiser``, each source noised with
        ``rng`` (drawn from seed, epoch and batch position: a resumed epoch noises as the first run did)."""
        keys, texts, sources, targets = zip(*sentences)
        if self.noiser is not None:
            sources = [self.noiser(np.asarray(src, dtype=np.int64), rng) for src in sources]
        return text_batch(keys, texts, sources, targets)


def as_arrays(batch):
    """The batch with its padded token fields as numpy arrays, to leave a worker: torch hands a tensor to
    another process through a shared-memory file of its own, which costs more than copying a text batch's
    few hundred kilobytes through the pipe (``bench/scale.py --text-sentences``: 2 workers ran 3x slower
    than none). ``as_tensors`` turns them back, without a copy."""
    for field in TEXT_FIELDS:
        padded = getattr(batch, field)
        setattr(batch, field, PaddedData(padded.data.numpy(), padded.lengths.numpy()))
    return batch


def as_tensors(batch):
    """The inverse of ``as_arrays`` (tensors sharing the arrays' memory)."""
    for field in TEXT_FIELDS:
        padded = getattr(batch, field)
        setattr(batch, field, PaddedData(torch.from_numpy(padded.data), torch.from_numpy(padded.lengths)))
    return batch


class TextLoader(BatchStream):
    """Batches of mono or paired text for one rank; see ``make_text_loader``."""

    name = "text"

    def __init__(self, corpus, dataset, config, seed, rank, world_size):
        super().__init__()
        self.corpus, self.dataset, self.config = corpus, dataset, config
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self._plan = (None, None)

    def plan(self, epoch):
        """This rank's slots of ``epoch``: its own shards when there are at least as many shards as ranks,
        else every ``world_size``-th batch of the one-rank plan, cut to the same count on every rank."""
        if self._plan[0] != epoch:
            shares_shards = len(self.corpus.shard_paths) >= self.world_size
            config = self.config
            plan = plan_epoch(self.corpus.lengths, self.corpus.shard_of_row, self.seed, epoch,
                              self.world_size if shares_shards else 1, config.num_workers,
                              budget=config.max_batch_tokens, max_batch_size=config.max_batch_size,
                              buffer_size=config.batch_buffer)
            self._plan = (epoch, plan[self.rank] if shares_shards else self.dealt(plan[0]))
        return self._plan[1]

    def dealt(self, slots):
        """Every ``world_size``-th batch of each slot from ``rank`` on, the same count on every rank
        (the fewer than ``world_size`` batches left over are not used this epoch)."""
        per_rank = len(slots[0].batches) // self.world_size
        if per_rank == 0:
            raise ValueError(f"{len(slots[0].batches)} text batches per worker for world_size={self.world_size}: "
                             "lower the token budget, add text, or write more shards (make_text_shards.py "
                             "--shard-sentences) so that each rank reads its own")
        return [SlotPlan(s.shards, s.stream_rows, s.batches[self.rank::self.world_size][:per_rank]) for s in slots]

    def batches_in_epoch(self, epoch):
        return sum(len(slot.batches) for slot in self.plan(epoch))

    def planned_rows(self, epoch):
        """Corpus rows of each batch of ``epoch`` in yield order (no text read)."""
        slots = self.plan(epoch)
        return [slot.batches[j] for j in range(len(slots[0].batches)) for slot in slots]

    def epoch_batches(self, epoch, start):
        slots = self.plan(epoch)
        self.dataset.slots, self.dataset.epoch, self.dataset.consumed = slots, epoch, start
        workers = len(slots) if self.config.num_workers > 0 else 0
        for batch in DataLoader(self.dataset, batch_size=None, num_workers=workers,
                                prefetch_factor=2 if workers else None):
            yield as_tensors(batch)

    def end_epoch(self, epoch):
        tokens = sum(int(self.corpus.lengths[b].sum()) for slot in self.plan(epoch) for b in slot.batches)
        logger.info("%s loader, epoch %d rank %d: %d batches, %d tokens (source + target)", self.name, epoch,
                    self.rank, self.batches_in_epoch(epoch), tokens)


def make_text_loader(parquets, tokenizer, config, seed=0, rank=0, world_size=1, text_column="text",
                     target_column=None, lang_column=None, target_lang_column=None, noiser=None):
    """Build a mono-text (``target_column=None``) or paired-text loader of one rank.

    Arguments
    ---------
    parquets : str, Path or list
        Text metadata parquets of ``local/make_text_shards.py`` (their shards beside them).
    tokenizer : str or Tokenizer
        SentencePiece model path; it must hold the ``<lang>`` tags used.
    config : TextLoaderConfig or dict
        How it batches (``max_batch_tokens``, ``max_batch_size``, ``batch_buffer``, ``max_tokens``,
        ``num_workers``).
    seed, rank, world_size : int
        Same seed + shards + world size + workers give the same batches in the same order.
    text_column, target_column : str
        Source text column; target column for paired text (e.g. ``translation``).
    lang_column, target_lang_column : str, optional
        Language columns whose values become tags ``<lang>`` before the tokens.
    noiser : callable, optional
        ``noiser(token ids array, rng) -> noised ids`` (``common.text_noising.TextNoiser``) applied to
        each source in the workers: BART denoising inputs come ready from the loader.

    Example
    -------
    >>> loader = make_text_loader("text/pairs.parquet", "tok/unigram_500.model", {"max_batch_tokens": 4000},
    ...                           target_column="translation", target_lang_column="tgt_lang")  # doctest: +SKIP
    """
    config = TextLoaderConfig.from_config(config)
    tokenizer = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer(tokenizer)
    columns = TextColumns(text_column, target_column, lang_column, target_lang_column)
    corpus = read_text_corpus(parquets, tokenizer, columns, config.num_workers)
    if config.max_tokens is not None:
        corpus.shard_of_row[corpus.lengths > config.max_tokens] = -1
    check_budget(corpus.lengths[corpus.shard_of_row >= 0], config.max_batch_tokens, unit="tokens")
    logger.info("%d sentences (%d used), %d tokens in %d shards from %s", len(corpus),
                int((corpus.shard_of_row >= 0).sum()), int(corpus.lengths.sum()), len(corpus.shard_paths), parquets)
    dataset = TextShardDataset(corpus, tokenizer, columns, seed, noiser)
    return TextLoader(corpus, dataset, config, seed, rank, world_size)
