"""BART-style text noising for denoising pretraining (fairseq ``DenoisingDataset`` semantics).

Applied to one token id sequence (no bos / eos) in this order: sentence permutation, span masking
(text infilling), random insertion, rotation. Span masking hides ``ceil(mask_ratio * n)`` tokens in
spans whose lengths are drawn from Poisson(λ) (the last one trimmed so the total is exact); spans do
not overlap. Each span is replaced by ``replace_length`` = 1 mask (text infilling, BART's best),
0 masks (deletion) or -1 = one mask per token (BERT-like); a 0-length span inserts one mask (1 or -1).
A ``random_ratio`` share of the masks becomes a random token instead. Spans are of tokens, or, with
``word_start_ids`` (fairseq's ``mask_whole_word``), of whole words: the masked count, the Poisson
lengths and the placement are in words, and a span never splits a word.

>>> noiser = TextNoiser(mask_id=4, random_ids=range(5, 30), mask_ratio=0.3, poisson_lambda=3.0)
>>> noised = noiser(np.arange(5, 25), np.random.default_rng(0))   # doctest: +SKIP
"""

import math

import numpy as np
import torch


def poisson_span_lengths(num_to_mask, poisson_lambda, rng):
    """Span lengths ~ Poisson(λ) drawn until they cover ``num_to_mask`` tokens; the last is trimmed
    so they sum to exactly ``num_to_mask``. Zero-length spans are kept (they insert a mask)."""
    lengths = []
    total = 0
    while total < num_to_mask:
        draws = rng.poisson(poisson_lambda, size=max(4, int(2 * num_to_mask / max(poisson_lambda, 1))))
        for length in draws:
            lengths.append(int(min(length, num_to_mask - total)))
            total += lengths[-1]
            if total >= num_to_mask:
                break
    return np.asarray(lengths, dtype=np.int64)


def span_layout(num_tokens, span_lengths, rng):
    """Random non-overlapping placement: the token index where each span starts (in span order).

    The ``num_tokens - sum(lengths)`` kept tokens and the spans are arranged uniformly at random.
    """
    kept = num_tokens - int(span_lengths.sum())
    slots = np.sort(rng.choice(kept + len(span_lengths), size=len(span_lengths), replace=False))
    before = slots - np.arange(len(span_lengths))  # kept tokens before each span
    return before + np.concatenate([[0], np.cumsum(span_lengths)[:-1]]).astype(np.int64)


class TextNoiser:
    """Noise one token sequence; configured once from the yaml, called per sample.

    Arguments
    ---------
    mask_id : int
        Id of ``<mask>`` (a user symbol of the tokenizer).
    random_ids : sequence of int
        Ids a random replacement or insertion may use (ordinary pieces, no special symbols).
    mask_ratio : float
        Share of tokens hidden by span masking (BART: 0.3).
    poisson_lambda : float
        Mean span length in tokens (BART: 3.5).
    replace_length : int
        1: a span becomes one mask; 0: it is deleted; -1: each of its tokens becomes a mask.
    random_ratio : float
        Share of masks (and insertions) that are random tokens instead (BART: 0.1).
    insert_ratio : float
        Random insertion: ``ceil(insert_ratio * n)`` masks / random tokens inserted at random places.
    rotate_prob : float
        Probability to rotate the sequence to start at a random token (document rotation).
    permute_ratio : float
        Share of sentences (split after ``sentence_end_ids``) shuffled among themselves.
    sentence_end_ids : sequence of int
        Ids that end a sentence (e.g. the piece of ".").
    keep_prefix : int
        Leading tokens never noised (a language tag).
    word_start_ids : sequence of int, optional
        Ids that begin a word (SentencePiece pieces starting with ``▁``: ``word_start_piece_ids``):
        span masking counts and hides whole words (a word = a start piece and the pieces after it).
        None: spans of tokens.
    """

    def __init__(self, mask_id, random_ids, mask_ratio=0.3, poisson_lambda=3.5, replace_length=1,
                 random_ratio=0.1, insert_ratio=0.0, rotate_prob=0.0, permute_ratio=0.0,
                 sentence_end_ids=(), keep_prefix=0, word_start_ids=None):
        if replace_length not in (-1, 0, 1):
            raise ValueError(f"replace_length={replace_length}: use 1 (one mask per span), 0 (delete "
                             "spans) or -1 (one mask per token)")
        if not 0.0 <= mask_ratio < 1.0:
            raise ValueError(f"mask_ratio={mask_ratio} must lie in [0, 1)")
        self.mask_id, self.random_ids = mask_id, np.asarray(list(random_ids), dtype=np.int64)
        self.mask_ratio, self.poisson_lambda, self.replace_length = mask_ratio, poisson_lambda, replace_length
        self.random_ratio, self.insert_ratio, self.rotate_prob = random_ratio, insert_ratio, rotate_prob
        self.permute_ratio, self.sentence_end_ids = permute_ratio, set(sentence_end_ids)
        self.keep_prefix = keep_prefix
        self.word_start_ids = None if word_start_ids is None else np.asarray(sorted(word_start_ids), dtype=np.int64)

    def __call__(self, tokens, rng):
        """Noised copy of ``tokens`` (1-D ints) as an int64 array."""
        tokens = np.asarray(tokens, dtype=np.int64)
        prefix, body = tokens[: self.keep_prefix], tokens[self.keep_prefix :]
        if self.permute_ratio > 0 and self.sentence_end_ids:
            body = self.permute_sentences(body, rng)
        if self.mask_ratio > 0 and len(body):
            body = self.infill(body, rng)
        if self.insert_ratio > 0 and len(body):
            body = self.insert(body, rng)
        if self.rotate_prob > 0 and len(body) > 1 and rng.random() < self.rotate_prob:
            body = np.roll(body, -int(rng.integers(1, len(body))))
        return np.concatenate([prefix, body])

    def masks(self, count, rng):
        """``count`` mask ids, a ``random_ratio`` share of them replaced by random tokens."""
        out = np.full(count, self.mask_id, dtype=np.int64)
        random = rng.random(count) < self.random_ratio
        out[random] = rng.choice(self.random_ids, size=int(random.sum()))
        return out

    def word_bounds(self, tokens):
        """Start index of each maskable unit of ``tokens`` and the end: every token, or every word."""
        if self.word_start_ids is None:
            return np.arange(len(tokens) + 1)
        starts = np.flatnonzero(np.isin(tokens, self.word_start_ids))
        return np.unique(np.concatenate([[0], starts, [len(tokens)]]))

    def infill(self, tokens, rng):
        """Span masking: Poisson span lengths covering ``ceil(mask_ratio * n)`` of the ``n`` units
        (tokens, or words with ``word_start_ids``)."""
        bounds = self.word_bounds(tokens)
        units = len(bounds) - 1
        lengths = poisson_span_lengths(math.ceil(self.mask_ratio * units), self.poisson_lambda, rng)
        starts = span_layout(units, lengths, rng)
        pieces, position = [], 0
        for start, length in zip(starts, lengths):
            first, end = bounds[start], bounds[start + length]
            pieces.append(tokens[position:first])
            replaced = {1: 1, 0: 0, -1: max(int(end - first), 1)}[self.replace_length]
            pieces.append(self.masks(replaced, rng))
            position = end
        pieces.append(tokens[position:])
        return np.concatenate(pieces)

    def insert(self, tokens, rng):
        """Random insertion of ``ceil(insert_ratio * n)`` masks / random tokens."""
        count = math.ceil(self.insert_ratio * len(tokens))
        total = len(tokens) + count
        inserted = np.zeros(total, dtype=bool)
        inserted[rng.choice(total, size=count, replace=False)] = True
        out = np.empty(total, dtype=np.int64)
        out[inserted], out[~inserted] = self.masks(count, rng), tokens
        return out

    def permute_sentences(self, tokens, rng):
        """Shuffle ``ceil(permute_ratio * sentences)`` of the sentences among their places."""
        ends = [i + 1 for i, t in enumerate(tokens) if int(t) in self.sentence_end_ids]
        bounds = [0] + [e for e in ends if e < len(tokens)] + [len(tokens)]
        sentences = [tokens[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        chosen = rng.choice(len(sentences), size=math.ceil(self.permute_ratio * len(sentences)),
                            replace=False)
        order = np.arange(len(sentences))
        order[chosen] = rng.permutation(chosen)
        return np.concatenate([sentences[i] for i in order])


def ordinary_piece_ids(processor):
    """Ids a random replacement may use: every SentencePiece piece except the control, unknown and
    user-defined ones (``<blank>``, ``<s>``, ``</s>``, ``<unk>``, ``<mask>``, language tags)."""
    return [i for i in range(processor.get_piece_size())
            if not (processor.is_control(i) or processor.is_unknown(i) or _is_symbol(processor.id_to_piece(i)))]


def word_start_piece_ids(processor):
    """Ids of the ordinary pieces that begin a word (SentencePiece's ``▁`` prefix): whole-word masking."""
    return [i for i in ordinary_piece_ids(processor) if processor.id_to_piece(i).startswith("\u2581")]


def noise_padded(tokens, rel_lens, noiser, rng):
    """Noise each row of a padded batch [batch, length] (relative lengths) with ``noiser``; returns the
    noised batch padded with 0 (BLANK) and its relative lengths, on the input's device."""
    lengths = torch.round(rel_lens * tokens.shape[1]).long().tolist()
    rows = [torch.as_tensor(noiser(row[:n].cpu().numpy(), rng)) for row, n in zip(tokens, lengths)]
    longest = max(max(len(row) for row in rows), 1)
    noised = torch.zeros(len(rows), longest, dtype=tokens.dtype)
    for i, row in enumerate(rows):
        noised[i, :len(row)] = row
    new_lens = torch.tensor([len(row) / longest for row in rows], dtype=rel_lens.dtype)
    return noised.to(tokens.device), new_lens.to(rel_lens.device)


def _is_symbol(piece):
    return len(piece) > 2 and piece.startswith("<") and piece.endswith(">")
