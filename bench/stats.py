"""The statistics every bench reports: error rates with bootstrap 95 % intervals over utterances, the
interval of a difference between two systems decoded on the same utterances, and medians over seeds.

An error rate is a ratio of sums (edits over reference words), so the bootstrap resamples utterances
with replacement and recomputes the ratio (the "utterance bootstrap" of Bisani & Ney, 2004). Two
systems on one test set are compared paired: each resample draws the same utterances for both, so the
interval of their difference reflects only where they differ, not how hard the drawn utterances are.

    from bench import stats
    a = stats.read_scored("exp/a/hyp_test_seen.jsonl")           # per-utterance edits and lengths
    b = stats.read_scored("exp/b/hyp_test_seen.jsonl")
    stats.error_rate(a)                     # Estimate(value=18.4, low=16.1, high=20.9), in %
    stats.relative_gain(a, b)               # 1 - WER_a / WER_b with its interval (0.10 = 10 % lower)
    stats.verdict(stats.difference(a, b))   # 'lower', 'higher' or 'no difference (interval spans 0)'

Defaults: 2000 resamples, seed 0, a 95 % percentile interval. With 150 utterances of ~13 words, a WER
near 20 % has an interval about ±3 points wide.
"""

import json
import statistics
from typing import NamedTuple

import numpy as np
from speechbrain.utils.edit_distance import wer_details_by_utterance

RESAMPLES, LEVEL, SEED = 2000, 0.95, 0


class Estimate(NamedTuple):
    """A figure and its interval (same unit: % for error rates, a fraction for relative gains)."""
    value: float
    low: float
    high: float

    def spans_zero(self):
        """True when the interval holds 0: no claim of a difference can be made."""
        return self.low <= 0.0 <= self.high

    def format(self, digits=2):
        """'18.40 [16.12, 20.93]'."""
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def as_list(self):
        """``[low, high]``: the interval as the benches' JSON lines carry it."""
        return [round(self.low, 4), round(self.high, 4)]


class Scored(NamedTuple):
    """One system's decoding of one split: per-utterance edit counts and reference lengths, in key order."""
    keys: tuple
    edits: np.ndarray
    lengths: np.ndarray


def score(refs, hyps, unit="word"):
    """Per-utterance edits against references: ``refs`` and ``hyps`` map utterance keys to strings.

    ``unit="char"`` scores characters with "_" between words, as ``common.metrics`` scores CER.
    A key missing from ``hyps`` is an error: a bench that lost utterances must not look better.
    """
    missing = sorted(set(refs) - set(hyps))
    if missing:
        raise KeyError(f"{len(missing)} utterance(s) have no hypothesis (first: {missing[0]!r}): "
                       "decode the whole split before scoring it")
    keys = tuple(sorted(refs))
    tokens = _words if unit == "word" else _chars
    details = wer_details_by_utterance({k: tokens(refs[k]) for k in keys}, {k: tokens(hyps[k]) for k in keys})
    edits = np.array([d["num_edits"] for d in details], dtype=np.int64)
    lengths = np.array([d["num_ref_tokens"] for d in details], dtype=np.int64)
    return Scored(keys, edits, lengths)


def _words(text):
    return text.split()


def _chars(text):
    return list("_".join(text.split()))


def read_scored(path, unit="word"):
    """Score a ``hyp_<split>.jsonl`` (lines ``{"key", "hyp", "ref"}``, as every recipe writes)."""
    refs, hyps = {}, {}
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                refs[record["key"]], hyps[record["key"]] = record["ref"], record["hyp"]
            except (json.JSONDecodeError, KeyError) as error:
                raise ValueError(f"{path}:{number}: not a {{key, hyp, ref}} JSON line ({error})") from None
    return score(refs, hyps, unit)


def _resamples(count, resamples, seed):
    """``resamples`` × ``count`` utterance indices drawn with replacement (the same for a paired test)."""
    return np.random.default_rng(seed).integers(count, size=(resamples, count))


def _interval(value, samples, level):
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(samples, [tail, 100.0 - tail])
    return Estimate(float(value), float(low), float(high))


def error_rate(scored, resamples=RESAMPLES, level=LEVEL, seed=SEED):
    """The error rate in % (edits / reference tokens) with its bootstrap interval over utterances."""
    if scored.lengths.sum() == 0:
        raise ValueError("the references hold no tokens: nothing to score")
    index = _resamples(len(scored.keys), resamples, seed)
    samples = 100.0 * scored.edits[index].sum(1) / np.maximum(scored.lengths[index].sum(1), 1)
    return _interval(100.0 * scored.edits.sum() / scored.lengths.sum(), samples, level)


def _paired(a, b):
    if a.keys != b.keys:
        only = sorted(set(a.keys) ^ set(b.keys))
        raise ValueError(f"the two systems were decoded on different utterances ({len(only)} differ, first "
                         f"{only[0]!r}): compare decodings of the same split")
    return a.lengths


def difference(a, b, resamples=RESAMPLES, level=LEVEL, seed=SEED):
    """``WER_a - WER_b`` in points with its paired bootstrap interval (negative: ``a`` is better)."""
    lengths = _paired(a, b)
    index = _resamples(len(a.keys), resamples, seed)
    words = np.maximum(lengths[index].sum(1), 1)
    samples = 100.0 * (a.edits[index].sum(1) - b.edits[index].sum(1)) / words
    return _interval(100.0 * (a.edits.sum() - b.edits.sum()) / lengths.sum(), samples, level)


def relative_gain(a, b, resamples=RESAMPLES, level=LEVEL, seed=SEED):
    """``1 - WER_a / WER_b`` (0.10: ``a`` makes 10 % fewer errors than ``b``) with its paired interval."""
    _paired(a, b)
    if b.edits.sum() == 0:
        raise ValueError("the baseline made no error: a relative gain against it is undefined")
    index = _resamples(len(a.keys), resamples, seed)
    samples = 1.0 - a.edits[index].sum(1) / np.maximum(b.edits[index].sum(1), 1)
    return _interval(1.0 - a.edits.sum() / b.edits.sum(), samples, level)


def verdict(estimate, lower="lower", higher="higher"):
    """What a difference's interval lets one say: ``lower``/``higher`` only when it excludes 0."""
    if estimate.spans_zero():
        return "no difference (interval spans 0)"
    return lower if estimate.high < 0 else higher


def median_over_seeds(values):
    """``(median, spread)`` of one figure over seeds; spread = max - min, how much it moves between seeds."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no seed finished: nothing to take the median of")
    return statistics.median(values), max(values) - min(values)


def median_seed(items, key):
    """The item whose ``key(item)`` is the median over seeds (the lower middle one for an even count): the
    seed whose own interval is printed beside a median figure."""
    if not items:
        raise ValueError("no seed finished: nothing to take the median of")
    return sorted(items, key=key)[(len(items) - 1) // 2]
