#!/usr/bin/env python3
"""Does pretraining pay? Finetune on a share of the labels from the pretrained checkpoint vs from scratch.

    python bench/pretrain_gain.py [--data data/demo] [--labelled-share 0.15] [--finetune-epochs 100]
        [--pretrain-epochs 30] [--speech-only] [--exp exp/bench_pretrain_gain] [--json]

On the demo corpus (made by the recipes' stage 0 when missing): the pretrain recipe (stages 0-3) sees
all training speech without transcripts, the transcripts as unpaired text and the Pig Latin -> English
pairs; then recipes/finetune/train.py (demo config) trains twice on the same seeded
``--labelled-share`` of the labelled utterances, with the same tokenizer (the pretraining one) and the
same budget (epochs, batch size, schedule): once from the pretrained checkpoint, once from scratch.
Both are scored on the test split (held-out voice) with the config's beam search. Goal: the pretrained
WER at least 15 % lower (relative) than from scratch.

Prints a table (WER, CER, relative WER gain vs scratch) and the commands run; with --json the last
line is {"scratch": {...}, "pretrained": {...}, "relative_wer_gain": x}. About 35 min on 2 quiet CPU
cores with the defaults (units ~2 min, pretraining ~11 min, each finetune ~9 min; add ~5 min when
the demo corpus must first be synthesized); much longer on cores shared with other jobs.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq

from common.evaluation import read_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--data", default="data/demo", help="the recipes' demo data folder")
    parser.add_argument("--labelled-share", type=float, default=0.15, help="share of labelled utterances")
    parser.add_argument("--finetune-epochs", type=int, default=100,
                        help="epochs of each finetune (a 15 %% subset needs more epochs than the demo's 30)")
    parser.add_argument("--pretrain-epochs", type=int, default=30, help="pretraining epochs")
    parser.add_argument("--speech-only", action="store_true",
                        help="pretrain on speech alone (no text tasks); its runs are named *_speech")
    parser.add_argument("--exp", default="exp/bench_pretrain_gain", help="folder of the three experiments")
    parser.add_argument("--seed", type=int, default=1234, help="picks the labelled subset")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    return parser.parse_args(argv)


def run(command):
    """Run a command from the repository root, echoing it; stop the benchmark if it fails."""
    print("+ " + " ".join(command), flush=True)
    began = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True)
    return time.perf_counter() - began


def labelled_subset(shard_dir, share, seed):
    """Write metadata_labelled_<share>.parquet beside the shards: a seeded share of the rows."""
    table = pq.read_table(os.path.join(shard_dir, "metadata_pool.parquet"))
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(table.num_rows, size=max(1, round(share * table.num_rows)), replace=False))
    path = os.path.join(shard_dir, f"metadata_labelled_{round(100 * share)}.parquet")
    pq.write_table(table.take(rows), path)
    return path, len(rows), table.num_rows


def finetune(args, name, parquet, tokenizer, pretrained=None):
    """One finetune + test run of the demo config; returns (its test figures, seconds)."""
    shards = os.path.join(args.data, "shards")
    output = os.path.join(args.exp, name)
    command = [sys.executable, "recipes/finetune/train.py", "recipes/finetune/hparams/demo.yaml",
               f"--output_folder={output}", f"--tokenizer_file={tokenizer}", f"--train_parquet={parquet}",
               f"--valid_parquet={shards}/valid/metadata_pool.parquet",
               f"--test_parquets=[{shards}/test/metadata_pool.parquet]",
               f"--number_of_epochs={args.finetune_epochs}", "--noprogressbar"]
    if pretrained:
        command.append(f"--pretrained={pretrained}")
    seconds = run(command)
    return read_results(os.path.join(output, "results.json"))["test"], seconds


def table(results, seconds):
    """The results table: WER / CER of each run and the relative WER gain against scratch."""
    scratch = results["scratch"]["wer"]
    lines = [f"{'init':<12}{'WER %':>8}{'CER %':>8}{'WER vs scratch':>16}{'minutes':>9}"]
    for name, figures in results.items():
        gain = (scratch - figures["wer"]) / scratch if scratch else 0.0
        lines.append(f"{name:<12}{figures['wer']:>8.2f}{figures['cer']:>8.2f}{-gain:>+15.1%} "
                     f"{seconds[name] / 60:>8.1f}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    suffix = "_speech" if args.speech_only else ""
    pretrain_exp = os.path.join(args.exp, "pretrain" + suffix)
    speech_only = ["--text_parquets=[]", "--paired_parquets=[]"] if args.speech_only else []
    seconds = {"prepare": run(["bash", "recipes/pretrain/run.sh", "--data", args.data, "--stop_stage", "2"])}
    seconds["pretrain"] = run(["bash", "recipes/pretrain/run.sh", "--data", args.data, "--stage", "3",
                               "--exp", pretrain_exp, "--", f"--number_of_epochs={args.pretrain_epochs}",
                               "--noprogressbar", *speech_only])
    parquet, labelled, total = labelled_subset(os.path.join(args.data, "shards", "train"),
                                               args.labelled_share, args.seed)
    tokenizer = os.path.join(pretrain_exp, "tokenizer.model")
    results = {}
    results["scratch"], seconds["scratch"] = finetune(args, "scratch", parquet, tokenizer)
    results["pretrained"], seconds["pretrained"] = finetune(args, "pretrained" + suffix, parquet, tokenizer,
                                                            pretrained=pretrain_exp)
    gain = (results["scratch"]["wer"] - results["pretrained"]["wer"]) / max(results["scratch"]["wer"], 1e-9)
    print(f"\nfinetune on {labelled} of {total} labelled utterances ({args.labelled_share:.0%}), "
          f"{args.finetune_epochs} epochs each; test split; pretraining {args.pretrain_epochs} epochs "
          f"({seconds['pretrain'] / 60:.1f} min)")
    print(table(results, seconds))
    print(f"relative WER gain of pretraining: {gain:.1%} (goal >= 15 %): {'met' if gain >= 0.15 else 'NOT met'}")
    if args.json:
        print(json.dumps({"scratch": results["scratch"], "pretrained": results["pretrained"],
                          "relative_wer_gain": gain, "labelled": labelled, "seconds": seconds}))


if __name__ == "__main__":
    main()
