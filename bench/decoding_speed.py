#!/usr/bin/env python3
"""Joint CTC/attention beam search: the incremental decoder step against SpeechBrain's, in one run.

    python bench/decoding_speed.py exp/finetune_small data/open/shards/valid/metadata_pool.parquet \\
        [--utterances 24] [--beam 8] [--lm_dir exp/lm --lm_weight 1.0 --ctc_weight 0.6] [--json]

SpeechBrain's ``S2STransformerBeamSearcher`` runs the decoder over the whole prefix at every step and
projects the encoder states to each layer's cross-attention keys and values again at every step;
``common.decoding.JointCTCAttentionSearcher`` (``cached``) projects them once per batch and runs only the
new position. Both decode the same first ``--utterances`` of the parquet, batched as the bench and
pseudo-labelling decode (``common.pseudo_labels.decode_scored``), with the model's (or the given)
settings, the SpeechBrain step first. Prints seconds per utterance of each, the speed-up, and how many
hypotheses are identical and the largest score difference (the two must agree up to float rounding).
"""

import argparse
import itertools
import json
import sys
import time

from common.inference import load_trained
from common.pseudo_labels import decode_scored, parquet_audio


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("exp", help="a finetune experiment folder (with averaged.ckpt)")
    parser.add_argument("parquet", help="a metadata parquet of shards to decode")
    parser.add_argument("--utterances", type=int, default=24)
    parser.add_argument("--beam", type=int, help="beam size (default: the experiment's)")
    parser.add_argument("--lm_dir", help="an LM experiment (recipes/lm) fused in the search")
    parser.add_argument("--lm_weight", type=float, default=0.0)
    parser.add_argument("--ctc_weight", type=float, help="CTC weight (default: the experiment's)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    settings = {"lm_weight": args.lm_weight, **({"lm_dir": args.lm_dir} if args.lm_dir else {}),
                **({"ctc_weight": args.ctc_weight} if args.ctc_weight is not None else {})}
    trained = load_trained(args.exp, **settings)
    items = list(itertools.islice(parquet_audio([args.parquet]), args.utterances))
    rows = {}
    for name, cached in (("speechbrain_step", False), ("incremental_step", True)):
        trained.beam_searcher(args.beam).cached = cached
        began = time.perf_counter()
        scored = decode_scored(trained, items, args.beam)
        rows[name] = {"seconds_per_utterance": (time.perf_counter() - began) / len(items),
                      "hyps": {s.key: s.text for s in scored}, "scores": {s.key: s.score for s in scored}}
    old, new = rows["speechbrain_step"], rows["incremental_step"]
    same = sum(old["hyps"][key] == new["hyps"][key] for key in old["hyps"])
    largest = max(abs(old["scores"][key] - new["scores"][key]) for key in old["scores"])
    speedup = old["seconds_per_utterance"] / new["seconds_per_utterance"]
    print(f"{len(items)} utterances, beam {trained.beam_searcher(args.beam).beam_size}, "
          f"LM weight {args.lm_weight}")
    for name, row in rows.items():
        print(f"{name:<18}{row['seconds_per_utterance']:8.2f} s per utterance")
    print(f"speed-up {speedup:.2f}x; identical hypotheses {same}/{len(items)}; largest score difference "
          f"{largest:.2e}")
    if args.json:
        print(json.dumps({"utterances": len(items), "speedup": round(speedup, 3), "identical": same,
                          "largest_score_difference": largest,
                          **{name: round(row["seconds_per_utterance"], 3) for name, row in rows.items()}}))
    return 0 if same == len(items) else 1


if __name__ == "__main__":
    sys.exit(main())
