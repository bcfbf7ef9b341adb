"""Text loaders for pretraining: mono text (denoising) and paired text (translation), from parquets.

A text parquet has one row per sentence: ``sample_key`` and a text column (``text`` by default); paired
text adds a target column (e.g. ``translation``) and optional language columns. Text needs no audio
stream, so batches are planned and collated in the main process; the budget is padded tokens
(batch size x longest source + target), planned by the same batcher as speech.

Batches: ``id``, ``text`` (target text), ``src_tokens``, ``tokens``, ``tokens_bos``, ``tokens_eos``.
Mono text: source = target = the sentence (noising belongs to the objective). Language tags such as
``<en>`` are prepended to source and target tokens when a language column is given.
"""

import logging

import numpy as np
import pyarrow.parquet as pq
import torch
from speechbrain.dataio.batch import PaddedBatch

from common.data.batching import buffered_batches, check_budget
from common.data.config import TextLoaderConfig
from common.data.pipeline import Tokenizer, token_fields
from common.data.stream import BatchStream
from common.tokens import BLANK

logger = logging.getLogger(__name__)


def read_text_columns(parquets, columns):
    """Read ``columns`` of one or more parquets as lists (missing optional columns -> None)."""
    paths = [parquets] if isinstance(parquets, (str, bytes)) or hasattr(parquets, "open") else parquets
    merged = {c: [] for c in columns if c}
    for path in paths:
        table = pq.read_table(path, columns=list(merged))
        for column in merged:
            merged[column].extend(table[column].to_pylist())
    return merged


def tag_tokens(tokenizer, texts, langs):
    """Token id lists, each prefixed with its language tag id when ``langs`` is given."""
    tokens = tokenizer.encode(list(texts))
    if langs is None:
        return tokens
    tag_ids = {lang: tokenizer.piece_id(f"<{lang}>") for lang in set(langs)}
    return [[tag_ids[lang]] + ids for lang, ids in zip(langs, tokens)]


class TextLoader(BatchStream):
    """Batches of mono or paired text for one rank; see ``make_text_loader``."""

    def __init__(self, keys, texts, src_tokens, tgt_tokens, config, seed, rank, world_size, noiser=None):
        super().__init__()
        self.noiser = noiser
        self.keys, self.texts, self.src_tokens, self.tgt_tokens = keys, texts, src_tokens, tgt_tokens
        self.lengths = np.array([len(s) + len(t) for s, t in zip(src_tokens, tgt_tokens)], dtype=np.float64)
        self.config, self.seed, self.rank, self.world_size = config, seed, rank, world_size
        self._plan = (None, None)

    def plan(self, epoch):
        """This rank's batches (row index arrays) of ``epoch``: shuffled rows, equal count per rank."""
        if self._plan[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch, 2])
            rows = rng.permutation(len(self.keys))
            config = self.config
            batches = [rows[b] for b in buffered_batches(self.lengths[rows], budget=config.max_batch_tokens, rng=rng,
                                                         max_batch_size=config.max_batch_size,
                                                         buffer_size=config.batch_buffer)]
            per_rank = len(batches) // self.world_size  # drop the < world_size leftover batches
            if per_rank == 0:
                raise ValueError(f"{len(batches)} text batches for world_size={self.world_size}: lower the "
                                 f"token budget or add text")
            self._plan = (epoch, batches[self.rank * per_rank : (self.rank + 1) * per_rank])
        return self._plan[1]

    def batches_in_epoch(self, epoch):
        return len(self.plan(epoch))

    def epoch_batches(self, epoch, start):
        for position, rows in enumerate(self.plan(epoch)[start:], start):
            yield self.collate(rows, np.random.default_rng([self.seed, epoch, position, 4]))

    def collate(self, rows, rng=None):
        """PaddedBatch of the given rows; with a ``noiser``, each source noised with ``rng`` (drawn from
        seed, epoch and batch position: a resumed epoch noises its batches as the first run did)."""
        def source(row):
            tokens = np.asarray(self.src_tokens[row], dtype=np.int64)
            return tokens if self.noiser is None else self.noiser(tokens, rng)

        samples = [
            {"id": self.keys[r], "text": self.texts[r], "src_tokens": torch.as_tensor(source(r), dtype=torch.long),
             **token_fields(self.tgt_tokens[r])}
            for r in rows
        ]
        return PaddedBatch(samples, padding_kwargs={"value": BLANK})


def make_text_loader(parquets, tokenizer, config, seed=0, rank=0, world_size=1, text_column="text",
                     target_column=None, lang_column=None, target_lang_column=None, noiser=None):
    """Build a mono-text (``target_column=None``) or paired-text loader of one rank.

    Arguments
    ---------
    parquets : str, Path or list
        Text parquets with ``sample_key`` and the named columns.
    tokenizer : str or Tokenizer
        SentencePiece model path; it must hold the ``<lang>`` tags used.
    config : TextLoaderConfig or dict
        How it batches (``max_batch_tokens``, ``max_batch_size``, ``batch_buffer``, ``max_tokens``).
    text_column, target_column : str
        Source text column; target column for paired text (e.g. ``translation``).
    lang_column, target_lang_column : str, optional
        Language columns whose values become tags ``<lang>`` before the tokens.
    noiser : callable, optional
        ``noiser(token ids array, rng) -> noised ids`` (``common.text_noising.TextNoiser``) applied to
        each source in the collate: BART denoising inputs come ready from the loader.

    Example
    -------
    >>> loader = make_text_loader("text/pairs.parquet", "tok/unigram_500.model", {"max_batch_tokens": 4000},
    ...                           target_column="translation", target_lang_column="tgt_lang")  # doctest: +SKIP
    """
    config = TextLoaderConfig.from_config(config)
    tokenizer = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer(tokenizer)
    columns = read_text_columns(parquets, ["sample_key", text_column, target_column, lang_column,
                                           target_lang_column])
    src = tag_tokens(tokenizer, columns[text_column], columns.get(lang_column))
    target_texts = columns[target_column] if target_column else columns[text_column]
    tgt_langs = columns.get(target_lang_column) if target_column else columns.get(lang_column)
    tgt = tag_tokens(tokenizer, target_texts, tgt_langs) if target_column else src
    keep = [i for i in range(len(src)) if config.max_tokens is None or len(src[i]) + len(tgt[i]) <= config.max_tokens]
    pick = lambda values: [values[i] for i in keep]  # noqa: E731
    lengths = np.array([len(src[i]) + len(tgt[i]) for i in keep], dtype=np.float64)
    check_budget(lengths, config.max_batch_tokens, unit="tokens")
    return TextLoader(pick(columns["sample_key"]), pick(target_texts), pick(src), pick(tgt), config, seed, rank,
                      world_size, noiser)
