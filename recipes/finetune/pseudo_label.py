#!/usr/bin/env python3
"""Self-training: pseudo-label untranscribed speech with a finetuned model and keep what it is sure of.

    python recipes/finetune/pseudo_label.py exp/finetune_small --unlabelled data/shards/pool \\
        --valid data/shards/valid --held_out data/shards/valid data/shards/test \\
        --lm_dir exp/finetune_small_lm --lm_weight 1.0 --beam 16 --ctc_weight 0.6 --output exp/st1/pseudo_labels
    python recipes/finetune/train.py hparams/small.yaml --output_folder=exp/st1 \\
        --train_parquet="[data/shards/train/metadata_pool.parquet, exp/st1/pseudo_labels/metadata_pool.parquet]" \\
        --pretrained=exp/st1/pseudo_labels/model ...            # finetuning goes on from the labeller

(``recipes/finetune/run.sh --unlabelled DIR`` runs both, round after round.) The experiment's averaged
model, with the language model given (or its config's), decodes the dev split and the ``--unlabelled``
shard folders (or parquets) with its joint CTC / attention beam search; the confidence threshold is
chosen on dev by ``common.pseudo_labels.choose_threshold`` (the largest top-scored share of dev whose
WER is at most ``--wer_ratio`` x the dev WER, or ``--target_wer``); pool hypotheses at or above it
become transcripts, or with ``--keep share`` each ``--unlabelled`` source's own top-scored share of
the size dev kept (a pool of voices unlike dev's scores lower throughout: dev's score keeps few of
them). Every utterance of ``--valid`` and ``--held_out`` is refused from the pool by key and by audio
content.

Writes to ``--output``: ``metadata_pool.parquet`` (the pseudo-labelled rows, pointing at the pool's
shards), ``pool.jsonl`` (every pool hypothesis, its score and whether it was kept), ``threshold.json``
(the rule, the dev figures behind it, the counts) and ``model/`` (the labeller as a checkpoint folder to
continue from). Rerunning with the same ``--output`` reuses a finished result.
"""

import argparse
import json
import logging
import os
import sys
import time

from common.atomic import atomic_write_text
from common.inference import load_trained
from common.pseudo_labels import (
    DEFAULT_MIN_SHARE,
    DEFAULT_WER_RATIO,
    HeldOut,
    choose_threshold,
    decode_scored,
    export_as_checkpoint,
    keep_confident,
    keep_top_share,
    parquet_audio,
    parquet_texts,
    write_pseudo_parquet,
    write_scored,
)
from common.shard_format import POOL_PARQUET
from common.user_errors import run_command

logger = logging.getLogger("pseudo_label")
SUMMARY = "threshold.json"
KEEP_RULES = ("score", "share")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exp_dir", help="a finetune experiment after its test stage (averaged.ckpt)")
    parser.add_argument("--unlabelled", nargs="+", required=True,
                        help="shard folders (or their parquets) of the speech to pseudo-label; their texts, if any, "
                             "are never read")
    parser.add_argument("--valid", required=True, help="the dev shard folder (or parquet): chooses the threshold")
    parser.add_argument("--held_out", nargs="*", default=[],
                        help="test shard folders (or parquets): never pseudo-labelled (dev never is either)")
    parser.add_argument("--output", required=True, help="folder for the pseudo-labelled parquet and its record")
    parser.add_argument("--tokenizer", help="the tokenizer, when not at the config's tokenizer_file")
    parser.add_argument("--lm_dir", help="a recipes/lm experiment fused in the search (default: the config's)")
    parser.add_argument("--lm_weight", type=float, help="its weight (default: the config's)")
    parser.add_argument("--ctc_weight", type=float, help="the CTC share of the joint score (default: the config's)")
    parser.add_argument("--beam", "--beam_size", type=int, help="beam size (default: the config's beam_size)")
    parser.add_argument("--wer_ratio", type=float, default=DEFAULT_WER_RATIO,
                        help="the kept dev share's WER at most this times the WER of all of dev")
    parser.add_argument("--target_wer", type=float, help="or at most this WER (%%), instead of --wer_ratio")
    parser.add_argument("--min_share", type=float, default=DEFAULT_MIN_SHARE,
                        help="the threshold rests on at least this share of dev")
    parser.add_argument("--keep", choices=KEEP_RULES, default="score",
                        help="score: every pool hypothesis scoring at least the dev threshold; share: of each "
                             "--unlabelled source, its own top-scored share as large as the share of dev the "
                             "threshold keeps (for pools of voices the labeller is less sure of than of dev's)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    return parser.parse_args(argv)


def label(args):
    """Decode dev and the pool, choose the threshold, write the outputs; returns the summary."""
    began = time.perf_counter()
    settings = {key: value for key, value in (("lm_dir", args.lm_dir), ("lm_weight", args.lm_weight),
                                              ("ctc_weight", args.ctc_weight)) if value is not None}
    trained = load_trained(args.exp_dir, args.device, args.tokenizer, **settings)
    longest = trained.settings["max_duration"]
    dev = decode_scored(trained, parquet_audio([args.valid]), args.beam)
    threshold = choose_threshold(dev, parquet_texts([args.valid]), args.target_wer, args.wer_ratio, args.min_share)
    logger.info("threshold %.4f: the top %.0f %% of dev by score has WER %s %% (target %.2f %%, all of dev %.2f %%)",
                threshold.score, 100 * threshold.kept_dev_share, _percent(threshold.kept_dev_wer),
                threshold.target_wer, threshold.dev_wer)
    guard = HeldOut.of([args.valid, *args.held_out])
    pool, kept, per_source = [], {}, {}
    for source in args.unlabelled:  # one source at a time: --keep share ranks each against itself
        scored = decode_scored(trained, parquet_audio([source], longest), args.beam, guard=guard)
        chosen = (keep_confident(scored, threshold.score) if args.keep == "score"
                  else keep_top_share(scored, threshold.kept_dev_share))
        pool += scored
        kept |= chosen
        per_source[source] = {"decoded": len(scored), "kept": len(chosen)}
        logger.info("%s: kept %d of %d hypotheses (--keep %s)", source, len(chosen), len(scored), args.keep)
    os.makedirs(args.output, exist_ok=True)
    write_scored(pool, kept, os.path.join(args.output, "pool.jsonl"))
    rows = write_pseudo_parquet(args.unlabelled, kept, os.path.join(args.output, POOL_PARQUET))
    export_as_checkpoint(args.exp_dir, os.path.join(args.output, "model"))
    target = f"{args.target_wer:g} %" if args.target_wer is not None else f"{args.wer_ratio:g} x dev WER"
    summary = {"labeller": args.exp_dir, "lm_dir": trained.settings["lm_dir"],
               "lm_weight": trained.settings["lm_weight"],
               "rule": f"largest top-scored share (>= {args.min_share:g}) of dev with WER <= {target}",
               "keep": args.keep, **threshold.as_dict(), "pool_decoded": len(pool), "kept": len(rows),
               "per_source": per_source,
               "kept_seconds": round(sum(r["duration"] for r in rows), 2),
               "minutes": round((time.perf_counter() - began) / 60.0, 3)}
    atomic_write_text(os.path.join(args.output, SUMMARY), json.dumps(summary, indent=2) + "\n")
    logger.info("kept %d of %d pool hypotheses (%.1f min of speech) -> %s", len(rows), len(pool),
                summary["kept_seconds"] / 60.0, args.output)
    return summary


def _percent(value):
    return "-" if value != value else f"{value:.2f}"  # nan: nothing kept


def main(argv):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    finished = os.path.join(args.output, SUMMARY)
    if os.path.isfile(finished):
        logger.info("%s exists: the pool is labelled already (remove the folder to label it again)", finished)
        return 0
    label(args)
    return 0


if __name__ == "__main__":
    run_command(main, sys.argv[1:])
