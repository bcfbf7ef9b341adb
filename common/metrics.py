"""Evaluation metrics: WER and CER with per-utterance alignments, BLEU for translation.

Word and character error rates come from ``speechbrain.utils.metric_stats.ErrorRateStats``;
BLEU from sacrebleu (SpeechBrain's ``BLEUStats`` cannot be imported without flair).
A Brain keeps one ``TranscriptMetrics`` per evaluation stage::

    metrics = TranscriptMetrics(bleu=False)
    metrics.append(batch.id, hypotheses, batch.text)       # per batch, lists of str
    metrics.summary()          # {"wer": 12.5, "cer": 4.1, "num_utterances": 200}
    metrics.write(output_folder, "test")     # wer_test.txt, hyp_test.trn, ref_test.trn, hyp_test.jsonl
"""

import json
import logging
import os

import sacrebleu
from speechbrain.utils.metric_stats import ErrorRateStats

from common.atomic import atomic_write_text

logger = logging.getLogger(__name__)


class TranscriptMetrics:
    """Accumulates hypotheses and references (plain strings) over one split.

    Arguments
    ---------
    bleu : bool
        Also compute corpus BLEU (sacrebleu, default 13a tokenization): for translation.
    """

    def __init__(self, bleu=False):
        self.wer = ErrorRateStats()
        self.cer = ErrorRateStats(split_tokens=True)  # words → characters, "_" between words
        self.bleu = bleu
        self.ids, self.hyps, self.refs = [], [], []  # the hypothesis files and BLEU

    def append(self, ids, hyps, refs):
        """Adds one batch: utterance ids, hypothesis strings, reference strings."""
        if not len(ids) == len(hyps) == len(refs):
            raise ValueError(
                f"got {len(ids)} ids, {len(hyps)} hypotheses and {len(refs)} references: "
                "pass one of each per utterance"
            )
        hyp_words = [hyp.split() for hyp in hyps]
        ref_words = [ref.split() for ref in refs]
        self.wer.append(ids, hyp_words, ref_words)
        self.cer.append(ids, hyp_words, ref_words)
        self.ids.extend(ids)
        self.hyps.extend(hyps)
        self.refs.extend(refs)

    def state(self):
        """``(ids, hypotheses, references)`` appended so far: what another process needs to merge."""
        return self.ids, self.hyps, self.refs

    @classmethod
    def merged(cls, states, bleu=False):
        """One ``TranscriptMetrics`` of several ``state()`` s (e.g. one per rank), in the given order."""
        metrics = cls(bleu=bleu)
        for ids, hyps, refs in states:
            if ids:
                metrics.append(ids, hyps, refs)
        return metrics

    def summary(self):
        """``{"wer": %, "cer": %, "num_utterances": n}``, plus ``"bleu"`` when enabled."""
        if not self.wer.ids:
            raise ValueError("no utterances were appended: nothing to summarize")
        result = {
            "wer": self.wer.summarize("WER"),
            "cer": self.cer.summarize("WER"),
            "num_utterances": len(self.wer.ids),
        }
        if self.bleu:
            result["bleu"] = sacrebleu.corpus_bleu(self.hyps, [self.refs]).score
        return result

    def write(self, output_folder, split):
        """Writes ``wer_<split>.txt``: the WER summary and per-utterance word alignments, then the CER
        summary (and BLEU); and the hypotheses: ``hyp_<split>.trn`` / ``ref_<split>.trn`` (sclite's
        trn format, ``text (utterance id)``) and ``hyp_<split>.jsonl`` (key, hyp, ref). Returns the
        path of ``wer_<split>.txt``."""
        self.write_hypotheses(output_folder, split)
        path = os.path.join(output_folder, f"wer_{split}.txt")
        with open(path, "w", encoding="utf-8") as out:
            self.wer.write_stats(out)
            out.write("\nCharacter error rate (\"_\" marks a space):\n")
            self.cer.summarize()
            out.write(f"%CER {self.cer.summary['WER']:.2f}\n")
            if self.bleu:
                out.write(f"{sacrebleu.corpus_bleu(self.hyps, [self.refs])}\n")
        logger.info("%s: %s (alignments in %s)", split, self.summary(), path)
        return path

    def write_hypotheses(self, output_folder, split):
        """``hyp_<split>.trn``, ``ref_<split>.trn`` and ``hyp_<split>.jsonl`` in utterance order."""
        for name, texts in (("hyp", self.hyps), ("ref", self.refs)):
            lines = "".join(f"{text} ({key})\n" for key, text in zip(self.ids, texts))
            atomic_write_text(os.path.join(output_folder, f"{name}_{split}.trn"), lines)
        records = "".join(json.dumps({"key": key, "hyp": hyp, "ref": ref}, ensure_ascii=False) + "\n"
                          for key, hyp, ref in zip(self.ids, self.hyps, self.refs))
        atomic_write_text(os.path.join(output_folder, f"hyp_{split}.jsonl"), records)
