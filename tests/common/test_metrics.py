"""Tests for common/metrics.py on strings whose error rates are known by hand."""

import json

import pytest

from common.metrics import TranscriptMetrics


def test_one_substitution_in_three_words_is_33_percent_wer():
    """"a x c" against "a b c": 1 substitution / 3 words; 1 of 5 characters (a _ b _ c)."""
    metrics = TranscriptMetrics()
    metrics.append(["u1"], ["a x c"], ["a b c"])
    summary = metrics.summary()
    assert summary["wer"] == pytest.approx(100 / 3)
    assert summary["cer"] == pytest.approx(20.0)
    assert summary["num_utterances"] == 1
    assert "bleu" not in summary


def test_rates_pool_errors_over_utterances_not_average_them():
    """2 errors over 3 + 1 reference words = 50 %, not the mean of 33 % and 100 %."""
    metrics = TranscriptMetrics()
    metrics.append(["u1", "u2"], ["a x c", ""], ["a b c", "hello"])
    metrics.append(["u3"], ["same words"], ["same words"])
    assert metrics.summary()["wer"] == pytest.approx(100 * 2 / 6)
    assert metrics.summary()["num_utterances"] == 3


def test_write_puts_alignments_of_every_utterance_in_wer_split_txt(tmp_path):
    """wer_<split>.txt holds the WER line, each utterance id with its alignment, and the CER."""
    metrics = TranscriptMetrics()
    metrics.append(["utt_a", "utt_b"], ["a x c", "d e"], ["a b c", "d e"])
    path = metrics.write(str(tmp_path), "test")
    text = (tmp_path / "wer_test.txt").read_text()
    assert path == str(tmp_path / "wer_test.txt")
    assert "%WER 20.00" in text and "%CER" in text
    assert "utt_a" in text and "utt_b" in text
    assert " x " in text and " b " in text  # the substituted pair is shown aligned


def test_write_adds_sclite_trn_and_jsonl_hypothesis_files_in_utterance_order(tmp_path):
    """hyp_<split>.trn / ref_<split>.trn hold ``text (id)`` lines, hyp_<split>.jsonl key, hyp and ref,
    one per utterance in the order appended (an empty hypothesis included)."""
    metrics = TranscriptMetrics()
    metrics.append(["u2", "u1"], ["b c", ""], ["b d", "a"])
    metrics.write(str(tmp_path), "dev")
    assert (tmp_path / "hyp_dev.trn").read_text().splitlines() == ["b c (u2)", " (u1)"]
    assert (tmp_path / "ref_dev.trn").read_text().splitlines() == ["b d (u2)", "a (u1)"]
    records = [json.loads(line) for line in (tmp_path / "hyp_dev.jsonl").read_text().splitlines()]
    assert records == [{"key": "u2", "hyp": "b c", "ref": "b d"}, {"key": "u1", "hyp": "", "ref": "a"}]


def test_bleu_is_100_for_exact_translations_and_lower_otherwise():
    """sacrebleu corpus BLEU: identical output scores 100, a changed word scores less."""
    exact, changed = TranscriptMetrics(bleu=True), TranscriptMetrics(bleu=True)
    refs = ["the cat sat on the mat today", "a dog runs in the green park"]
    exact.append(["1", "2"], refs, refs)
    changed.append(["1", "2"], ["the cat sat on the rug today", refs[1]], refs)
    assert exact.summary()["bleu"] == pytest.approx(100.0)
    assert 0.0 < changed.summary()["bleu"] < 100.0


def test_mismatched_batch_sizes_are_reported():
    """One hypothesis per reference per id, or an error naming the counts."""
    with pytest.raises(ValueError, match="2 ids, 1 hypotheses and 2 references"):
        TranscriptMetrics().append(["a", "b"], ["x"], ["x", "y"])
