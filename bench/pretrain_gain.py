#!/usr/bin/env python3
"""Does pretraining pay? Finetune on a share of the labels from the pretrained checkpoint vs from scratch.

    python bench/pretrain_gain.py --corpus open [--labelled-share 0.15] [--pretrain-minutes 15]
        [--finetune-minutes 12] [--speech-only] [--exp DIR] [--seed N] [--pretrained-exp DIR] [--json]
    python bench/pretrain_gain.py [--corpus demo] [--finetune-epochs 100] [--pretrain-epochs 30] ...

``--corpus open`` (the default config's corpus, ``make open-corpus``; its shards are made by the
finetune recipe's stages 0-1 when missing): the pretrain recipe with ``hparams/small.yaml`` (BEST-RQ
targets; mono text trains the decoder as a language model) sees all 1500 training utterances without
transcripts and, unless ``--speech-only``, the corpus's ``lm_text.txt`` (Bible sentences, none of dev or
test) as mono text; its tokenizer (characters
and ``<mask>``) is built from the transcripts and that text. Then recipes/finetune/train.py (small.yaml)
trains twice on the same seeded ``--labelled-share`` of the labelled utterances (225 of 1500 at 15 %: the
unlabelled pool is 6.7x the labelled set), with that tokenizer and the same wall-clock budget: once from
the pretrained checkpoint, once from scratch; both are tested on test_seen and test_unseen.
``--pretrained-exp DIR`` skips pretraining and finetunes from DIR (another ``--seed``'s labelled subset).

``--corpus demo``: the demo corpus and configs (k-means units; transcripts as text, Pig Latin pairs),
budgets in epochs, its test split (a held-out voice).

Goal: the pretrained WER at least 15 % lower (relative) than from scratch. Prints a table (WER, CER,
relative WER gain vs scratch, per test split) and the commands run; with --json the last line is
{"scratch": {...}, "pretrained": {...}, "relative_wer_gain": x}. On 2 quiet CPU cores: about 51 min
with the open defaults (pretraining 15 min and the epoch it ends in, each finetune 12 min plus its decoding:
17 min; 45 with ``--speech-only``, 34 with ``--pretrained-exp``), 35 min on the demo.
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
CORPORA = {  # what each --corpus uses
    "demo": {"data": "data/demo", "pretrain_config": "hparams/demo.yaml",
             "finetune_config": "recipes/finetune/hparams/demo.yaml", "tests": ["test"]},
    "open": {"data": "data/open", "pretrain_config": "hparams/small.yaml",
             "finetune_config": "recipes/finetune/hparams/small.yaml", "tests": ["test_seen", "test_unseen"]},
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--corpus", default="demo", choices=sorted(CORPORA), help="which built-in corpus")
    parser.add_argument("--labelled-share", type=float, default=0.15, help="share of labelled utterances")
    parser.add_argument("--finetune-epochs", type=int, default=100,
                        help="demo: epochs of each finetune (a 15 %% subset needs more than the demo's)")
    parser.add_argument("--pretrain-epochs", type=int, default=30, help="demo: pretraining epochs")
    parser.add_argument("--finetune-minutes", type=float, default=12.0, help="open: each finetune's budget")
    parser.add_argument("--pretrain-minutes", type=float, default=15.0, help="open: pretraining's budget")
    parser.add_argument("--speech-only", action="store_true",
                        help="pretrain on speech alone (no text tasks); its runs are named *_speech")
    parser.add_argument("--exp", help="folder of the experiments (default exp/bench_pretrain_gain[_open])")
    parser.add_argument("--seed", type=int, default=1234, help="picks the labelled subset")
    parser.add_argument("--pretrain-overrides", default="", help="extra pretrain train.py overrides")
    parser.add_argument("--finetune-overrides", default="",
                        help="extra finetune train.py overrides for the pretrained model (e.g. --lr_peak=0.001)")
    parser.add_argument("--shared-finetune-overrides", default="",
                        help="finetune train.py overrides for both runs, scratch and pretrained "
                             "(e.g. --train_loader={\"speed_perturb\":null})")
    parser.add_argument("--pretrained-exp",
                        help="finetune from this finished pretraining experiment (its tokenizer) instead of "
                             "pretraining again: another --seed's labelled subset on the same pretrained model")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args(argv)
    args.exp = args.exp or "exp/bench_pretrain_gain" + ("_open" if args.corpus == "open" else "")
    args.data = CORPORA[args.corpus]["data"]
    return args


def run(command):
    """Run a command from the repository root, echoing it; stop the benchmark if it fails."""
    print("+ " + " ".join(command), flush=True)
    began = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True)
    return time.perf_counter() - began


def ensure_open_shards(data):
    """The open corpus and its shards (finetune recipe stages 0-1), made when missing."""
    if os.path.isfile(os.path.join(data, "shards", "test_unseen", "metadata_pool.parquet")):
        return
    corpus = os.path.join(data, "corpus")
    if not os.path.isfile(os.path.join(corpus, "train.jsonl")):
        run([sys.executable, "local/synth_corpus.py", corpus, "--profile", "open"])
    run(["bash", "recipes/finetune/run.sh", "--data", data, "--stop_stage", "1", "--train", f"{corpus}/train.jsonl",
         "--valid", f"{corpus}/dev.jsonl", "--test", f"{corpus}/test_seen.jsonl {corpus}/test_unseen.jsonl"])


def prepare_and_pretrain(args, pretrain_exp):
    """Data, tokenizer (and units) by the pretrain recipe, then pretraining; returns seconds of each."""
    if args.corpus == "demo":
        recipe = ["bash", "recipes/pretrain/run.sh", "--data", args.data]
        budget = [f"--number_of_epochs={args.pretrain_epochs}"]
    else:
        ensure_open_shards(args.data)
        recipe = ["bash", "recipes/pretrain/run.sh", "--data", args.data, "--train", f"{args.data}/shards/train",
                  "--valid", f"{args.data}/shards/valid", "--text", f"{args.data}/corpus/lm_text.txt",
                  "--token_type", "char", "--user_symbols", "<mask>", "--speech_targets", "bestrq",
                  "--config", CORPORA["open"]["pretrain_config"]]
        budget = [f"--train_minutes={args.pretrain_minutes}"]
    speech_only = ["--text_parquets=[]", "--paired_parquets=[]"] if args.speech_only else []
    seconds = {"prepare": run(recipe + ["--stop_stage", "2"])}
    seconds["pretrain"] = run(recipe + ["--stage", "3", "--exp", pretrain_exp, "--", *budget, "--noprogressbar",
                                        *speech_only, *args.pretrain_overrides.split()])
    return seconds


def labelled_subset(shard_dir, share, seed):
    """Write metadata_labelled_<share>_seed<seed>.parquet beside the shards: a seeded share of the rows."""
    table = pq.read_table(os.path.join(shard_dir, "metadata_pool.parquet"))
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(table.num_rows, size=max(1, round(share * table.num_rows)), replace=False))
    path = os.path.join(shard_dir, f"metadata_labelled_{round(100 * share)}_seed{seed}.parquet")
    pq.write_table(table.take(rows), path)
    return path, len(rows), table.num_rows


def finetune(args, name, parquet, tokenizer, pretrained=None):
    """One finetune + test run; returns ({test split: figures}, seconds)."""
    corpus, shards = CORPORA[args.corpus], os.path.join(args.data, "shards")
    output = os.path.join(args.exp, name)
    tests = ", ".join(f"{shards}/{split}/metadata_pool.parquet" for split in corpus["tests"])
    budget = ([f"--number_of_epochs={args.finetune_epochs}"] if args.corpus == "demo"
              else ["--number_of_epochs=1000", f"--train_minutes={args.finetune_minutes}"])
    command = [sys.executable, "recipes/finetune/train.py", corpus["finetune_config"],
               f"--output_folder={output}", f"--tokenizer_file={tokenizer}", f"--train_parquet={parquet}",
               f"--valid_parquet={shards}/valid/metadata_pool.parquet", f"--test_parquets=[{tests}]",
               *budget, "--noprogressbar", *args.shared_finetune_overrides.split()]
    if pretrained:
        command += [f"--pretrained={pretrained}", *args.finetune_overrides.split()]
    seconds = run(command)
    results = read_results(os.path.join(output, "results.json"))
    return {split: results[split] for split in corpus["tests"]}, seconds


def relative_gain(scratch, pretrained):
    """How much lower the pretrained WER is, relative to scratch (negative: worse)."""
    return (scratch["wer"] - pretrained["wer"]) / max(scratch["wer"], 1e-9)


def table(results, seconds):
    """The results table: WER / CER of each run per test split, and the WER change against scratch."""
    lines = [f"{'init':<20}{'split':<13}{'WER %':>8}{'CER %':>8}{'WER vs scratch':>16}{'minutes':>9}"]
    for name, splits in results.items():
        for split, figures in splits.items():
            change = "—" if name == "scratch" else f"{-relative_gain(results['scratch'][split], figures):+.1%}"
            lines.append(f"{name:<20}{split:<13}{figures['wer']:>8.2f}{figures['cer']:>8.2f}{change:>16} "
                         f"{seconds[name] / 60:>8.1f}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    name = "pretrained" + ("_speech" if args.speech_only else "")
    pretrain_exp = args.pretrained_exp or os.path.join(args.exp, "pretrain" + ("_speech" if args.speech_only else ""))
    seconds = {"pretrain": 0.0} if args.pretrained_exp else prepare_and_pretrain(args, pretrain_exp)
    parquet, labelled, total = labelled_subset(os.path.join(args.data, "shards", "train"),
                                               args.labelled_share, args.seed)
    tokenizer = os.path.join(pretrain_exp, "tokenizer.model")
    results = {}
    results["scratch"], seconds["scratch"] = finetune(args, "scratch", parquet, tokenizer)
    results[name], seconds[name] = finetune(args, name, parquet, tokenizer, pretrained=pretrain_exp)
    first = CORPORA[args.corpus]["tests"][0]
    gain = relative_gain(results["scratch"][first], results[name][first])
    budget = (f"{args.finetune_epochs} epochs each; pretraining {args.pretrain_epochs} epochs" if args.corpus == "demo"
              else f"{args.finetune_minutes:g} min each; pretraining {args.pretrain_minutes:g} min")
    pretraining = (f"reused: {args.pretrained_exp}" if args.pretrained_exp
                   else f"{seconds['pretrain'] / 60:.1f} min wall")
    print(f"\nfinetune on {labelled} of {total} labelled utterances ({args.labelled_share:.0%}), {budget} "
          f"({pretraining})")
    print(table(results, seconds))
    print(f"relative WER gain of pretraining on {first}: {gain:.1%} (goal >= 15 %): "
          f"{'met' if gain >= 0.15 else 'NOT met'}")
    if args.json:
        print(json.dumps({"scratch": results["scratch"], "pretrained": results[name],
                          "relative_wer_gain": gain, "labelled": labelled, "seconds": seconds}))


if __name__ == "__main__":
    main()
