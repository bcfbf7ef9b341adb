#!/usr/bin/env python3
"""Unit quality: how well k-means units or BEST-RQ codes follow the characters spoken (HuBERT, Table 1).

    python bench/unit_quality.py --aligner exp/finetune_small --parquet data/open/shards/dev/metadata_pool.parquet \\
        [--units units/dev] [--bestrq exp/pretrain_small] [--max-utterances 200] [--json]

Frame labels come from CTC forced alignment (``torchaudio.functional.forced_align``) of each transcript
with a trained finetune experiment (``--aligner``: its averaged model's CTC head, at its encoder frame
rate); a frame takes the token last emitted at or before it (the blank before the first token is its
own label, silence). With a character tokenizer (the open corpus's), the labels are characters. The
codes are brought to the aligner's frames (the code under each frame's centre) and compared as HuBERT
does, from their joint distribution over frames:

- label purity: E_code[max_label p(label | code)], how well the most frequent label of each code
  predicts the label (HuBERT's phone purity);
- code purity: E_label[max_code p(code | label)] (cluster purity);
- PNMI: I(label; code) / H(label), the share of the label's uncertainty a code removes (1: the code
  tells the label; 0: independent).

Codes that score near chance cannot teach the encoder the characters: masked prediction of them trains
features the transcript does not need.
"""

import argparse
import json
import logging
import os
import sys

import numpy as np
import torch
import torchaudio
from hyperpyyaml import load_hyperpyyaml

from bench.probe import labelled_loader
from common.data import vocab_size
from common.data.units import read_units, units_at_frames
from common.inference import load_trained
from common.models.experiment import graph_yaml, read_config_tree
from common.models.pretraining import BestRqTargets
from common.models.transfer import TOKENIZER_COPY, resolve_checkpoint
from common.tokens import BLANK
from common.user_errors import UserValueError

logger = logging.getLogger(__name__)


def joint_counts(labels, codes):
    """Counts [distinct labels, distinct codes] of (label, code) over frames (two equal-length int arrays)."""
    labels, codes = np.asarray(labels), np.asarray(codes)
    if labels.shape != codes.shape or labels.ndim != 1 or not len(labels):
        raise ValueError(f"labels {labels.shape} and codes {codes.shape} must be equal, non-empty 1-D arrays")
    _, label_index = np.unique(labels, return_inverse=True)
    _, code_index = np.unique(codes, return_inverse=True)
    counts = np.zeros((label_index.max() + 1, code_index.max() + 1))
    np.add.at(counts, (label_index, code_index), 1)
    return counts


def code_quality(labels, codes):
    """``{"label_purity", "code_purity", "pnmi", "frames"}`` of per-frame ``codes`` against ``labels``.

    >>> code_quality([1, 1, 2, 2], [7, 7, 3, 3])["pnmi"]
    1.0
    """
    joint = joint_counts(labels, codes)
    joint /= joint.sum()
    p_label, p_code = joint.sum(1), joint.sum(0)
    nonzero = joint > 0
    mutual = float((joint[nonzero] * np.log(joint[nonzero] / np.outer(p_label, p_code)[nonzero])).sum())
    entropy = float(-(p_label[p_label > 0] * np.log(p_label[p_label > 0])).sum())
    return {"label_purity": float(joint.max(0).sum()), "code_purity": float(joint.max(1).sum()),
            "pnmi": mutual / entropy if entropy > 0 else 1.0, "frames": int(len(labels))}


def hold_labels(alignment, blank=BLANK):
    """Per-frame labels of a CTC alignment (token or blank per frame): each frame takes the token last
    emitted at or before it; frames before the first token keep ``blank``.

    >>> hold_labels(torch.tensor([0, 5, 0, 0, 6, 6, 0])).tolist()
    [0, 5, 5, 5, 6, 6, 6]
    """
    labels = alignment.clone()
    for t in range(1, len(labels)):
        if labels[t] == blank:
            labels[t] = labels[t - 1]
    return labels


def aligned_labels(ctc_log_probs, tokens):
    """Frame labels [frames] of one utterance from its CTC log-probabilities [frames, vocab] and token ids;
    None when the utterance has too few frames for its tokens."""
    tokens = torch.as_tensor(tokens, dtype=torch.int32)
    repeats = int((tokens[1:] == tokens[:-1]).sum()) if len(tokens) > 1 else 0
    if len(tokens) == 0 or len(tokens) + repeats > len(ctc_log_probs):
        return None
    alignment, _ = torchaudio.functional.forced_align(ctc_log_probs[None].float(), tokens[None], blank=BLANK)
    return hold_labels(alignment[0].long())


class BestRqCodes:
    """The BEST-RQ codes of a pretraining experiment (its config's Fbank, its saved projection and codebook),
    at its encoder frame rate: ``__call__(wavs, wav_lens) -> [batch, frames]``; ``frame_rate_hz``."""

    def __init__(self, exp_dir):
        tree = read_config_tree(exp_dir)
        graph = load_hyperpyyaml(graph_yaml(tree, vocab_size(os.path.join(exp_dir, TOKENIZER_COPY))))
        self.fbank = graph["compute_features"]
        heads = torch.load(os.path.join(resolve_checkpoint(exp_dir), "heads.ckpt"), map_location="cpu")
        state = {k[len("bestrq."):]: v for k, v in heads.items() if k.startswith("bestrq.")}
        if not state:
            raise UserValueError(f"{exp_dir} was not pretrained with speech_targets: bestrq (no BEST-RQ codebook)")
        n_mels = int(tree["n_mels"])
        projection, codebook = state["quantiser.P"], state["quantiser.CB"]
        self.stack = projection.shape[0] // n_mels
        self.targets = BestRqTargets(n_mels, self.stack, codebook.shape[0], codebook.shape[1])
        self.targets.load_state_dict(state)
        self.frame_rate_hz = 100.0 / self.stack

    @torch.no_grad()
    def __call__(self, wavs, wav_lens):
        feats = self.fbank(wavs)
        return self.targets(feats, wav_lens, -(-feats.shape[1] // self.stack))


def collect_frames(aligner, loader, bestrq=None, unit_rate_hz=None):
    """Per-frame labels and codes of every utterance: ``{"kmeans": (labels, codes), "bestrq": ...}``."""
    frames = {}
    rate = aligner.model.frames_per_second()
    for batch in loader:
        wavs, wav_lens = batch.sig
        with torch.no_grad():
            log_probs = aligner.model.ctc_log_probs(aligner.model.encode(wavs, wav_lens))
        lengths = torch.round(wav_lens * log_probs.shape[1]).long()
        sources = {}
        if unit_rate_hz is not None:
            units, rel = batch.units
            sources["kmeans"] = units_at_frames(units, torch.round(rel * units.shape[1]).long(), log_probs.shape[1],
                                                rate, unit_rate_hz)
        if bestrq is not None:
            codes = bestrq(wavs, wav_lens)
            sources["bestrq"] = units_at_frames(codes, torch.round(wav_lens * codes.shape[1]).long(),
                                                log_probs.shape[1], rate, bestrq.frame_rate_hz)
        tokens, token_rel = batch.tokens
        for i, n in enumerate(lengths.tolist()):
            labels = aligned_labels(log_probs[i, :n], tokens[i, :int(round(float(token_rel[i]) * tokens.shape[1]))])
            if labels is None:
                continue
            for name, codes in sources.items():
                kept = codes[i, :n] >= 0
                pair = frames.setdefault(name, ([], []))
                pair[0].append(labels[kept].numpy())
                pair[1].append(codes[i, :n][kept].numpy())
    return {name: (np.concatenate(labels), np.concatenate(codes)) for name, (labels, codes) in frames.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aligner", required=True, help="finetune experiment whose CTC head aligns the text")
    parser.add_argument("--parquet", required=True, help="labelled metadata parquet (e.g. the dev split)")
    parser.add_argument("--units", help="local/extract_units.py folder covering those utterances (k-means)")
    parser.add_argument("--bestrq", help="pretraining experiment with speech_targets: bestrq")
    parser.add_argument("--max-utterances", type=int, default=0, help="utterances used (0: all)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args(argv)
    if not (args.units or args.bestrq):
        parser.error("give --units and/or --bestrq: the codes to score")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    aligner = load_trained(args.aligner)
    units = read_units(args.units) if args.units else None
    loader = labelled_loader(args.parquet, aligner.tokenizer, args.max_utterances, units)
    frames = collect_frames(aligner, loader, BestRqCodes(args.bestrq) if args.bestrq else None,
                            units.frame_rate_hz if units else None)
    rows = {name: code_quality(labels, codes) for name, (labels, codes) in frames.items()}
    print("| codes | frames | label purity | code purity | PNMI |\n|---|---|---|---|---|")
    for name, row in rows.items():
        figures = " | ".join(f"{row[key]:.3f}" for key in ("label_purity", "code_purity", "pnmi"))
        print(f"| {name} | {row['frames']} | {figures} |")
    if args.json:
        print(json.dumps({"aligner": args.aligner, "parquet": args.parquet, "codes": rows}))


if __name__ == "__main__":
    sys.exit(main())
