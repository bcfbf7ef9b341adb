"""common/text_noising.py: BART noising ratios, Poisson span lengths, insertion, rotation, permutation."""

import math

import numpy as np
import pytest
from scipy.stats import poisson

from common.text_noising import TextNoiser, poisson_span_lengths

MASK = 4
RANDOM_IDS = np.arange(100, 200)
TOKENS = np.arange(1000, 1100)  # 100 distinct ordinary tokens


def noiser(**options):
    return TextNoiser(MASK, RANDOM_IDS, **{"random_ratio": 0.0, **options})


def test_span_lengths_follow_poisson_and_cover_the_masked_count():
    """Lengths sum to exactly the requested count; their histogram is Poisson(3.5) within 0.015."""
    rng = np.random.default_rng(0)
    lengths = np.concatenate([poisson_span_lengths(300, 3.5, rng)[:-1] for _ in range(300)])
    assert all(poisson_span_lengths(n, 3.5, rng).sum() == n for n in (1, 7, 300))
    observed = np.bincount(lengths, minlength=12)[:12] / len(lengths)
    assert np.abs(observed - poisson.pmf(np.arange(12), 3.5)).max() < 0.015


def test_one_mask_per_token_hides_exactly_the_mask_ratio():
    """replace_length -1: ceil(0.3 n) original tokens become masks; zero-length spans add masks."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        out = noiser(mask_ratio=0.3, poisson_lambda=3.0, replace_length=-1)(TOKENS, rng)
        kept = out[out != MASK]
        assert len(kept) == len(TOKENS) - math.ceil(0.3 * len(TOKENS))
        assert (np.diff(kept) > 0).all()  # kept tokens stay in order


def test_text_infilling_replaces_each_span_by_one_mask():
    """replace_length 1 (λ=3, 30 % masked): kept tokens = 70, and the masks number as many as the
    spans, ~30 / 3 per sequence on average (within 10 %)."""
    rng = np.random.default_rng(2)
    outs = [noiser(mask_ratio=0.3, poisson_lambda=3.0)(TOKENS, rng) for _ in range(300)]
    assert all((o != MASK).sum() == 70 for o in outs)
    masks_per_sequence = np.mean([(o == MASK).sum() for o in outs])
    assert abs(masks_per_sequence - 30 / 3) / 10 < 0.1


def test_deletion_removes_spans_and_random_ratio_swaps_masks_for_random_tokens():
    """replace_length 0 leaves 70 tokens and no mask; random_ratio 0.5 (length -1) turns ~half of the
    30 hidden tokens into random ids (within 0.05 over 200 sequences)."""
    rng = np.random.default_rng(3)
    deleted = noiser(mask_ratio=0.3, replace_length=0)(TOKENS, rng)
    assert len(deleted) == 70 and MASK not in deleted
    outs = [TextNoiser(MASK, RANDOM_IDS, mask_ratio=0.3, replace_length=-1, poisson_lambda=3.0,
                       random_ratio=0.5)(TOKENS, rng) for _ in range(200)]
    randoms = np.mean([np.isin(o, RANDOM_IDS).sum() / (np.isin(o, RANDOM_IDS).sum() + (o == MASK).sum())
                       for o in outs])
    assert abs(randoms - 0.5) < 0.05


def test_insertion_adds_the_ratio_and_keeps_the_original_order():
    """insert_ratio 0.1: 10 masks inserted into 100 tokens, originals in order."""
    out = noiser(mask_ratio=0.0, insert_ratio=0.1)(TOKENS, np.random.default_rng(4))
    assert len(out) == 110 and (out == MASK).sum() == 10
    assert np.array_equal(out[out != MASK], TOKENS)


def test_rotation_is_a_cyclic_shift_and_the_prefix_stays_first():
    """rotate_prob 1 with a kept language tag: the tag stays, the rest is a non-trivial rotation."""
    tokens = np.concatenate([[7], TOKENS])
    out = noiser(mask_ratio=0.0, rotate_prob=1.0, keep_prefix=1)(tokens, np.random.default_rng(5))
    shift = int(np.flatnonzero(out[1:] == TOKENS[0])[0])
    assert out[0] == 7 and shift > 0 and np.array_equal(np.roll(out[1:], -shift), TOKENS)


def test_sentence_permutation_keeps_every_sentence_whole():
    """Four sentences ending in id 9, all permuted: the same sentences, each intact."""
    sentences = [[20, 21, 9], [30, 9], [40, 41, 42, 9], [50, 9]]
    out = noiser(mask_ratio=0.0, permute_ratio=1.0, sentence_end_ids=[9])(
        np.concatenate(sentences), np.random.default_rng(6))
    pieces = np.split(out, np.flatnonzero(out == 9) + 1)[:-1]
    assert sorted(map(list, pieces)) == sorted(sentences)


@pytest.mark.parametrize("bad", [{"replace_length": 2}, {"mask_ratio": 1.0}])
def test_invalid_options_name_the_fix(bad):
    with pytest.raises(ValueError, match=list(bad)[0]):
        noiser(**bad)


def test_random_replacements_never_use_special_symbols(tmp_path):
    """ordinary_piece_ids leaves out <blank>, <s>, </s>, <unk> and user symbols such as <mask>, <en>."""
    import sentencepiece

    from common.data.synthetic import train_tiny_tokenizer
    from common.text_noising import ordinary_piece_ids
    processor = sentencepiece.SentencePieceProcessor(model_file=str(train_tiny_tokenizer(tmp_path)))
    ids = ordinary_piece_ids(processor)
    assert not {0, 1, 2, 3, processor.piece_to_id("<en>"), processor.piece_to_id("<fr>")} & set(ids)
    assert len(ids) == processor.get_piece_size() - 6


def test_whole_word_masking_hides_whole_words_and_counts_them():
    """word_start_ids: every word (a start piece and its continuation pieces) is kept whole or hidden
    whole, never split; ceil(0.3 x words) words are hidden (replace_length -1: one mask per piece)."""
    rng = np.random.default_rng(7)
    starts = np.arange(1000, 1040)  # 40 words of 1-4 pieces, each piece id distinct
    words = [np.concatenate([[start], 2000 + 10 * i + np.arange(rng.integers(0, 4))]) for i, start in
             enumerate(starts)]
    tokens = np.concatenate(words)
    whole = noiser(mask_ratio=0.3, poisson_lambda=3.0, word_start_ids=starts)
    for replace_length in (1, -1, 0):
        whole.replace_length = replace_length
        for _ in range(50):
            kept = set(whole(tokens, rng).tolist())
            kept_words = [w for w in words if set(w.tolist()) <= kept]
            split = [w for w in words if set(w.tolist()) & kept and not set(w.tolist()) <= kept]
            assert not split and len(kept_words) == len(words) - math.ceil(0.3 * len(words))
    whole.replace_length = -1
    out = whole(tokens, rng)
    assert (out == MASK).sum() == len(tokens) - np.isin(out, tokens).sum()


def test_token_spans_are_unchanged_without_word_starts():
    """Without word_start_ids the noiser draws exactly what it drew before whole-word masking existed:
    a word of one token each gives the same output from the same seed."""
    plain = noiser(mask_ratio=0.3, poisson_lambda=3.0)(TOKENS, np.random.default_rng(5))
    per_token_words = noiser(mask_ratio=0.3, poisson_lambda=3.0, word_start_ids=TOKENS)(TOKENS,
                                                                                       np.random.default_rng(5))
    assert np.array_equal(plain, per_token_words)


def test_noise_padded_noises_each_row_within_its_length():
    """noise_padded: each row's noised tokens come from its own valid tokens only (never the padding),
    lengths are relative to the new padded width, and padding is 0."""
    import torch

    from common.text_noising import noise_padded

    batch = torch.tensor([[1000 + i for i in range(10)], [1100, 1101, 1102, 1103, 0, 0, 0, 0, 0, 0]])
    noised, lens = noise_padded(batch, torch.tensor([1.0, 0.4]), noiser(mask_ratio=0.5, replace_length=0),
                                np.random.default_rng(0))
    assert noised.shape[1] == 5 and lens.tolist() == pytest.approx([1.0, 0.4])
    assert set(noised[1, :2].tolist()) <= {1100, 1101, 1102, 1103} and noised[1, 2:].eq(0).all()
