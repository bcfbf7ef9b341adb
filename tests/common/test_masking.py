"""common/masking.py: span masks hit the masked share in expectation, spans of the set length."""

import numpy as np
import pytest
import torch

from common.masking import mask_spans


def runs(row):
    """Lengths of the runs of True in a boolean vector."""
    padded = np.concatenate([[0], row.astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(padded))
    return edges[1::2] - edges[::2]


@pytest.mark.parametrize("mask_prob, span_length", [(0.65, 10), (0.3, 3), (0.08, 5)])
def test_masked_share_matches_mask_prob_and_runs_are_whole_spans(mask_prob, span_length):
    """Over 2000 utterances of 37-300 frames the masked share is within 0.01 of mask_prob; every run
    of masked frames is a whole number of spans; nothing past an utterance's length is masked."""
    rng = np.random.default_rng(0)
    lengths = torch.from_numpy(rng.integers(37, 301, size=2000))
    mask = mask_spans(lengths, 300, mask_prob, span_length, rng).numpy()
    valid = np.arange(300)[None, :] < lengths.numpy()[:, None]
    assert not mask[~valid].any()
    assert abs(mask.sum() / valid.sum() - mask_prob) < 0.01
    all_runs = np.concatenate([runs(row) for row in mask])
    assert (all_runs % span_length == 0).all()


def test_sparse_spans_rarely_touch_so_runs_are_mostly_one_span():
    """At 8 % masking with 5-frame spans, at least 85 % of runs are a single span."""
    rng = np.random.default_rng(1)
    mask = mask_spans([400] * 500, 400, 0.08, 5, rng).numpy()
    all_runs = np.concatenate([runs(row) for row in mask])
    assert (all_runs == 5).mean() > 0.85


def test_same_seed_same_mask_and_short_utterances_still_get_one_span():
    """Seeded masks repeat exactly; a 12-frame utterance at 5 % still gets its minimum span of 10."""
    first = mask_spans([50, 12], 50, 0.05, 10, np.random.default_rng(3))
    again = mask_spans([50, 12], 50, 0.05, 10, np.random.default_rng(3))
    assert torch.equal(first, again) and int(first[1].sum()) == 10
