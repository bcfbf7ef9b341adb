"""Text loaders for pretraining and language models: mono text (denoising, LM) and paired text
(translation), streamed from text shards (``local/make_text_shards.py``, ``common/shard_format.py``).

Planning is shard by shard, so that nothing in the main process grows with the sentences: whole shards
go to each (rank, worker) slot, balanced on tokens (``planning.assign_shards``, as for speech); each
shard is batched on its own by the speech batcher (``buffered_batches`` over its token counts, seeded by
seed, epoch and shard), and slots with fewer batches cut their largest batches until every slot of every
rank yields the same number. At each epoch start the loader's workers count the batches of every shard
(a few bytes per batch come back); dataloader workers then replan their own shards' batches, read each
shard once (the rows they need and their cached token ids) and yield collated batches. Main-process
memory is a few numbers per shard and per batch, not per sentence (``bench/scale.py --text-sentences``).

Token ids: the first loader over a corpus with a given tokenizer tokenizes every shard once (in the
workers, counting its tokens for the plan) and keeps the ids beside it (``SHARD.ids-<hash>.npz``, uint16
where the vocabulary fits): later plans read its offsets alone, and epochs read the ids instead of
tokenizing again (``bench/scale.py --text-sentences``).

Batches: ``id``, ``text`` (target text), ``src_tokens``, ``tokens``, ``tokens_bos``, ``tokens_eos``.
Mono text: source = target = the sentence. Language tags such as ``<en>`` are prepended to source and
target tokens when a language column is given. With a ``noiser``, sources are noised in the workers.
"""

import dataclasses
import hashlib
import heapq
import itertools
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
from common.data.batching import buffered_batches, check_budget
from common.data.config import TextLoaderConfig
from common.data.pipeline import TEXT_FIELDS, Tokenizer, text_batch
from common.data.planning import assign_shards, batches_to_skip, resolve_workers
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


def row_token_counts(src_offsets, tgt_offsets=None):
    """Source + target tokens of each row (int32) from id offsets; no target offsets: mono text, whose
    target is its source."""
    src = np.diff(src_offsets)
    return (src + (src if tgt_offsets is None else np.diff(tgt_offsets))).astype(np.int32)


@dataclass
class ShardIds:
    """The token ids of one shard's rows: ``src_ids[src_offsets[i]:src_offsets[i + 1]]`` is row ``i``'s
    source; paired text has target arrays too (mono text: the target is the source)."""

    src_offsets: np.ndarray
    src_ids: np.ndarray
    tgt_offsets: Optional[np.ndarray] = None
    tgt_ids: Optional[np.ndarray] = None

    @classmethod
    def of(cls, src, tgt, vocab_size):
        """From id lists (``tgt is src`` for mono text); ids as uint16 where the vocabulary fits."""
        dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32

        def flat(lists):
            offsets = np.zeros(len(lists) + 1, dtype=np.int64)
            np.cumsum(np.fromiter(map(len, lists), dtype=np.int64, count=len(lists)), out=offsets[1:])
            return offsets, np.fromiter(itertools.chain.from_iterable(lists), dtype=dtype, count=int(offsets[-1]))

        return cls(*flat(src), *(flat(tgt) if tgt is not src else (None, None)))

    def counts(self):
        """Source + target tokens of each row (int32)."""
        return row_token_counts(self.src_offsets, self.tgt_offsets)

    def rows(self, rows):
        """(source ids, target ids) of ``rows``, each an array per row."""
        src = [self.src_ids[self.src_offsets[r]:self.src_offsets[r + 1]] for r in rows]
        if self.tgt_offsets is None:
            return src, src
        return src, [self.tgt_ids[self.tgt_offsets[r]:self.tgt_offsets[r + 1]] for r in rows]

    def save(self, path):
        """Write as an uncompressed ``.npz`` (a reader of the counts loads only the offsets)."""
        arrays = {name: value for name, value in self.__dict__.items() if value is not None}
        with atomic_path(path) as temporary, open(temporary, "wb") as handle:
            np.savez(handle, **arrays)


class ShardTokens(Dataset):
    """Item ``i``: the token counts (source + target, int32 array) of each row of shard ``i``.

    A shard is tokenized once for a tokenizer and columns, in the dataloader worker that first gets it,
    and its ids are kept beside it (``SHARD.ids-<tag>.npz``): later counts read the offsets alone and
    epochs read the ids instead of tokenizing (``ids``). Where the shard's folder cannot be written, the
    counts are made at each start and epochs tokenize the rows they read."""

    def __init__(self, shard_paths, tokenizer, columns):
        self.shard_paths, self.tokenizer, self.columns = shard_paths, tokenizer, columns
        self.tag = counts_tag(tokenizer, columns)

    def __len__(self):
        return len(self.shard_paths)

    def cache(self, index):
        """The ids cache of shard ``index`` (may not exist yet)."""
        return f"{self.shard_paths[index]}.ids-{self.tag}.npz"

    def cached(self, index):
        """Whether shard ``index`` has an ids cache no older than the shard."""
        cache = self.cache(index)
        return os.path.isfile(cache) and os.path.getmtime(cache) >= os.path.getmtime(self.shard_paths[index])

    def __getitem__(self, index):
        if self.cached(index):
            with np.load(self.cache(index)) as cached:  # the offsets alone: ids are not read
                return row_token_counts(cached["src_offsets"],
                                        cached["tgt_offsets"] if "tgt_offsets" in cached.files else None)
        path = self.shard_paths[index]
        _, _, src, tgt = encode_rows(pq.read_table(path, columns=self.columns.names()), self.tokenizer, self.columns)
        ids = ShardIds.of(src, tgt, self.tokenizer.processor.get_piece_size())
        try:
            ids.save(self.cache(index))
        except OSError as error:  # a read-only corpus folder: tokenize again next time
            logger.warning("cannot keep the token ids of %s (%s): they are made at each start", path, error)
        return ids.counts()

    def ids(self, index):
        """The ``ShardIds`` of shard ``index`` from its cache, or None where it has none."""
        if not self.cached(index):
            return None
        with np.load(self.cache(index)) as cached:
            return ShardIds(**{name: cached[name] for name in cached.files})


def counts_tag(tokenizer, columns):
    """8 hex digits naming what token counts depend on: the tokenizer model's bytes and the columns."""
    digest = hashlib.blake2b(digest_size=4)
    with open(tokenizer.model_path, "rb") as handle:
        digest.update(handle.read())
    digest.update(json.dumps(columns.__dict__, sort_keys=True).encode())
    return digest.hexdigest()


@dataclass
class TextCorpus:
    """What planning needs of one or more text corpora, shard by shard: no array of the main process
    grows with the sentences (each shard's token counts are read from its cache when needed).

    shard_paths : list of str, absolute shard paths
    shard_starts : np.ndarray of int64, the first row of each shard (and the row count last)
    shard_tokens : np.ndarray of int64, source + target tokens of each shard's used rows
    shard_used : np.ndarray of int64, used rows of each shard (``max_tokens`` leaves out longer ones)
    counts : ShardTokens, each shard's token count per row (and its cached ids)
    max_tokens : int, optional
    """

    shard_paths: list
    shard_starts: np.ndarray
    shard_tokens: np.ndarray
    shard_used: np.ndarray
    counts: ShardTokens
    max_tokens: Optional[int] = None

    def __len__(self):
        return int(self.shard_starts[-1])

    def used_rows(self, shard):
        """(rows of ``shard`` that are used, local to the shard; their token counts)."""
        lengths = self.counts[shard]
        rows = np.arange(len(lengths)) if self.max_tokens is None else np.flatnonzero(lengths <= self.max_tokens)
        return rows, lengths[rows]


class ShardSummaries(Dataset):
    """Item ``i``: (rows, used rows, tokens of the used rows, longest used row) of shard ``i``."""

    def __init__(self, counts, max_tokens):
        self.counts, self.max_tokens = counts, max_tokens

    def __len__(self):
        return len(self.counts)

    def __getitem__(self, index):
        lengths = self.counts[index]
        used = lengths if self.max_tokens is None else lengths[lengths <= self.max_tokens]
        return len(lengths), len(used), int(used.sum()), int(used.max()) if len(used) else 0


def counting_workers(num_workers, num_shards):
    """Processes that count shards (token counts, batch sizes) at a start: one per shard up to
    ``num_workers``, and none (the main process) where only one would run: the main process waits for
    a lone counting worker, so it would add a fork to each start and gain nothing (a one-shard corpus
    spent three forks on each sub-second epoch)."""
    workers = min(num_workers, num_shards)
    return workers if workers > 1 else 0


def read_text_corpus(parquets, tokenizer, columns, num_workers=0, max_tokens=None):
    """The ``TextCorpus`` of one or more text metadata parquets; token counts from the shards' caches or
    counted in ``num_workers`` processes (0: here), summed there: only four numbers per shard come back."""
    paths = [parquets] if isinstance(parquets, (str, bytes, os.PathLike)) else list(parquets)
    if not paths:
        raise ValueError("no text parquet given: pass the OUT.parquet of local/make_text_shards.py")
    shard_paths = [shard for path in paths for shard in text_shard_paths(path)]
    counts = ShardTokens(shard_paths, tokenizer, columns)
    summaries = DataLoader(ShardSummaries(counts, max_tokens), batch_size=None,
                           num_workers=counting_workers(num_workers, len(shard_paths)))
    rows, used, tokens, longest = np.array(list(summaries), dtype=np.int64).reshape(-1, 4).T
    corpus = TextCorpus(shard_paths, np.concatenate([[0], np.cumsum(rows)]), tokens, used, counts, max_tokens)
    return corpus, int(longest.max()) if len(longest) else 0


def shard_batches(corpus, shard, seed, epoch, batching):
    """Batches of one shard in ``epoch`` (rows local to the shard, in yield order), from its token counts
    alone: the same in the main process (which counts them) and in the worker (which reads them)."""
    rows, lengths = corpus.used_rows(shard)
    rng = np.random.default_rng([seed, epoch, shard, 5])
    return [rows[batch] for batch in buffered_batches(lengths, rng=rng, **batching)]


class ShardBatchSizes(Dataset):
    """Item ``i``: the size of each batch of shard ``i`` in one epoch (int32 array)."""

    def __init__(self, corpus, seed, epoch, batching):
        self.corpus, self.seed, self.epoch, self.batching = corpus, seed, epoch, batching

    def __len__(self):
        return len(self.corpus.shard_paths)

    def __getitem__(self, shard):
        batches = shard_batches(self.corpus, shard, self.seed, self.epoch, self.batching)
        return np.array([len(batch) for batch in batches], dtype=np.int32)


@dataclass
class TextSlot:
    """What one dataloader worker of one rank reads and yields in one epoch.

    shards : shard indices in read order; each shard's batches come in ``shard_batches`` order.
    pieces : per shard, the number of consecutive pieces each of its batches is cut into (equal batch
        counts on every slot without dummy batches, as ``planning.split_largest_batches``).
    stride, offset, count : of the slot's pieces in order, yield those at ``offset``, ``offset + stride``,
        ... (``count`` of them): one rank's share when ranks outnumber shards, else every piece.
    """

    shards: list
    pieces: list
    stride: int = 1
    offset: int = 0
    count: int = 0


def pieces_to_reach(sizes, target):
    """Pieces per batch so that ``sizes`` (batch sizes) become ``target`` batches: the batch whose
    largest piece is largest is cut once more, until there are ``target``."""
    pieces = np.ones(len(sizes), dtype=np.int64)
    heap = [(-int(size), j) for j, size in enumerate(sizes) if size > 1]
    heapq.heapify(heap)
    for _ in range(target - len(sizes)):
        if not heap:
            raise ValueError(f"cannot reach {target} batches per worker with {len(sizes)} batches of single "
                             "sentences: shards are too uneven; write shards of similar size "
                             "(make_text_shards.py --shard-sentences) or use fewer workers")
        _, j = heapq.heappop(heap)
        pieces[j] += 1
        if sizes[j] > pieces[j]:
            heapq.heappush(heap, (-int(-(-sizes[j] // pieces[j])), j))
    return pieces


def plan_text_epoch(corpus, seed, epoch, world_size, num_workers, batching, sizes):
    """``plan[rank][worker]`` of ``TextSlot``: whole shards per slot, balanced on tokens
    (``planning.assign_shards``), each slot's shards in a shuffled order, the same number of batches on
    every slot. ``sizes``: ``ShardBatchSizes`` of every shard."""
    rng = np.random.default_rng([seed, epoch])
    workers = resolve_workers(len(corpus.shard_paths), world_size, num_workers)
    plan = []
    for rank_shards in assign_shards(corpus.shard_tokens.astype(np.float64), world_size, workers, rng):
        plan.append([TextSlot([shards[i] for i in rng.permutation(len(shards))], []) for shards in rank_shards])
    slots = [slot for rank in plan for slot in rank]
    target = max(sum(len(sizes[s]) for s in slot.shards) for slot in slots)
    for slot in slots:
        pieces = pieces_to_reach(np.concatenate([sizes[s] for s in slot.shards]), target)
        slot.pieces = np.split(pieces, np.cumsum([len(sizes[s]) for s in slot.shards])[:-1])
        slot.count = target
    return plan


class TextShardDataset(SlotDataset):
    """Yields one rank's planned text batches of one epoch; inside a worker, only that worker's share.
    Set ``slots`` (the rank's ``TextSlot`` list), ``epoch`` and ``consumed`` before iterating."""

    def __init__(self, corpus, tokenizer, columns, seed, batching, noiser=None):
        self.corpus, self.tokenizer, self.columns, self.seed = corpus, tokenizer, columns, seed
        self.batching, self.noiser = batching, noiser
        self.slots, self.epoch, self.consumed = [], 0, 0

    def slot_rows(self, slot):
        """(shard, rows local to it) of each batch ``slot`` yields, in order, shard by shard: a list of
        the shard's batches at a time, from token counts alone (no text is read)."""
        position = 0  # index among the slot's pieces
        for shard, pieces in zip(slot.shards, slot.pieces):
            batches = shard_batches(self.corpus, shard, self.seed, self.epoch, self.batching)
            taken = []
            for batch, count in zip(batches, pieces):
                for piece in np.array_split(batch, count):
                    if position % slot.stride == slot.offset and position // slot.stride < slot.count:
                        taken.append(piece)
                    position += 1
            yield shard, taken

    def slot_batches(self, worker):
        """Collated batches of one slot, from the first one not yet consumed; each shard's text is read
        and tokenized once, for the rows its remaining batches hold."""
        workers, slot = len(self.slots), self.slots[worker]
        skip, j = batches_to_skip(self.consumed, worker, workers), 0
        for shard, batches in self.slot_rows(slot):
            remaining = batches[max(0, skip - j):]
            first = j + len(batches) - len(remaining)
            j += len(batches)
            if not remaining:
                continue
            rows = np.unique(np.concatenate(remaining))
            sentences = dict(zip(rows.tolist(), zip(*self.read_rows(shard, rows))))
            for k, batch in enumerate(remaining, start=first):
                position = k * workers + worker  # the batch's index in the rank's epoch (round-robin)
                rng = np.random.default_rng([self.seed, self.epoch, position, 4])
                yield as_arrays(self.collate([sentences.pop(row) for row in batch.tolist()], rng))

    def read_rows(self, shard, rows):
        """(keys, target texts, source ids, target ids) of ``rows`` of ``shard``: ids from the shard's ids
        cache (no text of the source column is read for paired text), else tokenized here."""
        path, columns = self.corpus.shard_paths[shard], self.columns
        ids = self.corpus.counts.ids(shard)
        if ids is None:
            return encode_rows(pq.read_table(path, columns=columns.names()).take(rows), self.tokenizer, columns)
        text = columns.target or columns.text
        table = pq.read_table(path, columns=["sample_key", text]).take(rows)
        return (table["sample_key"].to_pylist(), table[text].to_pylist(), *ids.rows(rows))

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
        else every ``world_size``-th batch of the one-rank plan, the same count on every rank. The batch
        sizes of every shard are counted in the loader's workers (each rank counts all: every rank needs
        the longest slot's count)."""
        if self._plan[0] != epoch:
            shares_shards = len(self.corpus.shard_paths) >= self.world_size
            workers = counting_workers(self.config.num_workers, len(self.corpus.shard_paths))
            sizes = list(DataLoader(ShardBatchSizes(self.corpus, self.seed, epoch, self.dataset.batching),
                                    batch_size=None, num_workers=workers))
            plan = plan_text_epoch(self.corpus, self.seed, epoch, self.world_size if shares_shards else 1,
                                   self.config.num_workers, self.dataset.batching, sizes)
            self._plan = (epoch, plan[self.rank] if shares_shards else self.dealt(plan[0]))
        return self._plan[1]

    def dealt(self, slots):
        """Every ``world_size``-th batch of each slot from ``rank`` on, the same count on every rank
        (the fewer than ``world_size`` batches left over are not used this epoch)."""
        per_rank = slots[0].count // self.world_size
        if per_rank == 0:
            raise ValueError(f"{slots[0].count} text batches per worker for world_size={self.world_size}: "
                             "lower the token budget, add text, or write more shards (make_text_shards.py "
                             "--shard-sentences) so that each rank reads its own")
        return [dataclasses.replace(slot, stride=self.world_size, offset=self.rank, count=per_rank) for slot in slots]

    def batches_in_epoch(self, epoch):
        return sum(slot.count for slot in self.plan(epoch))

    def planned_rows(self, epoch):
        """Corpus rows of each batch of ``epoch`` in yield order (no text read; for inspection)."""
        slots, dataset = self.plan(epoch), self.dataset
        dataset.epoch = epoch
        per_slot = [[self.corpus.shard_starts[shard] + rows for shard, batches in dataset.slot_rows(slot)
                     for rows in batches] for slot in slots]
        return [batches[j] for j in range(len(per_slot[0])) for batches in per_slot]

    def epoch_batches(self, epoch, start):
        slots = self.plan(epoch)
        self.dataset.slots, self.dataset.epoch, self.dataset.consumed = slots, epoch, start
        workers = len(slots) if self.config.num_workers > 0 else 0
        for batch in DataLoader(self.dataset, batch_size=None, num_workers=workers,
                                prefetch_factor=2 if workers else None):
            yield as_tensors(batch)

    def end_epoch(self, epoch):
        shards = [shard for slot in self.plan(epoch) for shard in slot.shards]
        logger.info("%s loader, epoch %d rank %d: %d batches from %d shards (%d tokens, source + target, in "
                    "them)", self.name, epoch, self.rank, self.batches_in_epoch(epoch), len(shards),
                    int(self.corpus.shard_tokens[shards].sum()))


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
    corpus, longest = read_text_corpus(parquets, tokenizer, columns, config.num_workers, config.max_tokens)
    check_budget(np.array([longest]), config.max_batch_tokens, unit="tokens")
    logger.info("%d sentences (%d used), %d tokens used, in %d shards from %s", len(corpus),
                int(corpus.shard_used.sum()), int(corpus.shard_tokens.sum()), len(corpus.shard_paths), parquets)
    batching = {"budget": config.max_batch_tokens, "max_batch_size": config.max_batch_size,
                "buffer_size": config.batch_buffer}
    dataset = TextShardDataset(corpus, tokenizer, columns, seed, batching, noiser)
    return TextLoader(corpus, dataset, config, seed, rank, world_size)
