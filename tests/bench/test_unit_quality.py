"""bench/unit_quality.py: purity and PNMI as HuBERT reports them, and frame labels from a CTC alignment."""

import numpy as np
import pytest
import torch

from bench.unit_quality import aligned_labels, code_quality, hold_labels


def test_a_perfect_code_scores_one_and_a_random_code_scores_chance():
    """Codes that rename the labels: purities and PNMI 1. Codes split finer than the labels: label purity
    and PNMI still 1, code purity below. Codes drawn independently of the labels: label purity = the
    majority label's share (chance) within 0.01 and PNMI under 0.01."""
    rng = np.random.default_rng(0)
    labels = rng.choice(8, size=50000, p=[0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05])
    perfect = code_quality(labels, (labels * 7 + 3) % 8)
    assert perfect["label_purity"] == pytest.approx(1.0) and perfect["code_purity"] == pytest.approx(1.0)
    assert perfect["pnmi"] == pytest.approx(1.0)
    finer = code_quality(labels, labels * 2 + rng.integers(0, 2, size=len(labels)))
    assert finer["label_purity"] == pytest.approx(1.0) and finer["pnmi"] == pytest.approx(1.0)
    assert finer["code_purity"] < 0.6
    random = code_quality(labels, rng.integers(0, 50, size=len(labels)))
    assert random["label_purity"] == pytest.approx(np.bincount(labels).max() / len(labels), abs=0.01)
    assert random["pnmi"] < 0.01 and random["frames"] == len(labels)


def test_frames_hold_the_last_token_of_the_forced_alignment():
    """Log-probabilities that favour the path  _ a a _ b _ _ c  give that alignment; each frame then
    holds the token last emitted (blank before the first); too few frames for the tokens give None."""
    path = [0, 4, 4, 0, 5, 0, 0, 6]
    log_probs = torch.log_softmax(torch.nn.functional.one_hot(torch.tensor(path), 8).float() * 5.0, -1)
    assert aligned_labels(log_probs, [4, 5, 6]).tolist() == [0, 4, 4, 4, 5, 5, 5, 6]
    assert hold_labels(torch.tensor([0, 0, 3, 0, 3])).tolist() == [0, 0, 3, 3, 3]
    assert aligned_labels(log_probs[:3], [4, 4, 6]) is None  # a repeat needs a blank between: 4 frames
