"""bench/stats.py: the intervals every bench prints."""

import json

import numpy as np
import pytest

from bench import stats
from common.metrics import TranscriptMetrics


def scored(edits, lengths):
    keys = tuple(f"u{i:03d}" for i in range(len(edits)))
    return stats.Scored(keys, np.asarray(edits), np.asarray(lengths))


def test_scores_match_the_recipes_wer_and_cer(tmp_path):
    """read_scored of a recipe's hyp_<split>.jsonl gives the WER and CER the recipe reported."""
    refs = ["the cat sat on the mat", "a dog ran", "hello world", "one two three four"]
    hyps = ["the cat sat on mat", "a dog ran fast", "yellow world", "one two three four"]
    metrics = TranscriptMetrics()
    metrics.append([f"k{i}" for i in range(4)], hyps, refs)
    metrics.write_hypotheses(str(tmp_path), "test")
    summary = metrics.summary()
    path = str(tmp_path / "hyp_test.jsonl")
    assert stats.error_rate(stats.read_scored(path)).value == pytest.approx(summary["wer"])
    assert stats.error_rate(stats.read_scored(path, unit="char")).value == pytest.approx(summary["cer"])


def test_interval_holds_the_figure_and_narrows_with_more_utterances():
    """The interval brackets the point estimate, and 16x the utterances make it about 4x narrower."""
    rng = np.random.default_rng(1)
    small = scored(rng.binomial(12, 0.2, 100), np.full(100, 12))
    large = scored(rng.binomial(12, 0.2, 1600), np.full(1600, 12))
    a, b = stats.error_rate(small), stats.error_rate(large)
    assert a.low < a.value < a.high and b.low < b.value < b.high
    ratio = (a.high - a.low) / (b.high - b.low)
    assert 3.0 < ratio < 5.5


def test_interval_covers_the_true_rate_about_95_percent_of_the_time():
    """Coverage: over 200 simulated test sets of a system with a true WER of 20 %, the 95 % interval
    holds 20 % in 88-99 % of them (a broken bootstrap, e.g. one resampling words or never
    resampling, misses this band)."""
    rng = np.random.default_rng(7)
    hits = 0
    for trial in range(200):
        lengths = rng.integers(5, 20, 150)
        errors = rng.binomial(lengths, 0.2)
        interval = stats.error_rate(scored(errors, lengths), resamples=500, seed=trial)
        hits += interval.low <= 20.0 <= interval.high
    assert 0.88 <= hits / 200 <= 0.99


def test_paired_difference_sees_a_small_consistent_gain_that_unpaired_intervals_hide():
    """System a fixes one error in every tenth utterance of b: the utterances' difficulty varies a lot,
    so each WER interval is wide and they overlap, but the paired difference excludes 0."""
    rng = np.random.default_rng(3)
    lengths = np.full(300, 12)
    b_edits = rng.integers(0, 8, 300)
    a_edits = b_edits.copy()
    a_edits[(np.arange(300) % 10 == 0) & (b_edits > 0)] -= 1
    a, b = scored(a_edits, lengths), scored(b_edits, lengths)
    wer_a, wer_b = stats.error_rate(a), stats.error_rate(b)
    assert wer_a.high > wer_b.low  # the two intervals overlap
    diff = stats.difference(a, b)
    assert diff.high < 0 and stats.verdict(diff) == "lower"
    gain = stats.relative_gain(a, b)
    assert gain.low > 0 and gain.value == pytest.approx(1 - a_edits.sum() / b_edits.sum())


def test_no_claim_inside_the_interval():
    """Two systems that differ by noise alone: the difference's interval spans 0 and verdict says so."""
    rng = np.random.default_rng(5)
    lengths = np.full(150, 12)
    a, b = scored(rng.binomial(12, 0.2, 150), lengths), scored(rng.binomial(12, 0.2, 150), lengths)
    diff = stats.difference(a, b)
    assert diff.spans_zero() and stats.verdict(diff).startswith("no difference")


def test_comparing_different_utterances_or_missing_hypotheses_is_refused(tmp_path):
    """A bench that lost utterances, or compares two splits, gets an error, not a figure."""
    a = scored([1, 2], [5, 5])
    b = stats.Scored(("x", "y"), np.array([1, 2]), np.array([5, 5]))
    with pytest.raises(ValueError, match="different utterances"):
        stats.difference(a, b)
    with pytest.raises(KeyError, match="no hypothesis"):
        stats.score({"a": "one two", "b": "three"}, {"a": "one two"})
    path = tmp_path / "hyp.jsonl"
    path.write_text(json.dumps({"key": "a", "hyp": "x"}) + "\n")
    with pytest.raises(ValueError, match="hyp.jsonl:1"):
        stats.read_scored(str(path))


def test_median_over_seeds_and_its_spread():
    assert stats.median_over_seeds([20.0, 18.0, 23.0]) == (20.0, 5.0)
    with pytest.raises(ValueError):
        stats.median_over_seeds([])


def test_median_seed_is_the_seed_whose_figure_is_the_median():
    """The seed printed beside a median: the middle one, the lower middle for an even count."""
    seeds = [{"seed": 1, "wer": 40.0}, {"seed": 2, "wer": 120.0}, {"seed": 3, "wer": 30.0}]
    assert stats.median_seed(seeds, lambda r: r["wer"])["seed"] == 1
    assert stats.median_seed(seeds[1:], lambda r: r["wer"])["seed"] == 3
    with pytest.raises(ValueError):
        stats.median_seed([], lambda r: r["wer"])
