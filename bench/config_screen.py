#!/usr/bin/env python3
"""A finetune config's choices measured on dev: one change per arm against the config as shipped.

    python bench/config_screen.py --minutes 15 --json                 # the default arms below
    python bench/config_screen.py --minutes 30 --arm "nosp='--train_loader={\"speed_perturb\":null}'" \
        --arm lr=--lr_peak=0.001

Every arm trains ``--config`` (default ``recipes/finetune/hparams/small.yaml``) on every training label
of the open corpus (``bench/open_corpus.py``'s shards and character tokenizer, made once) for the same
``--minutes``, with its overrides and nothing else changed, one arm after the other on this machine.
The figures are the finetune's own greedy CTC pass over dev (no LM): CER and WER with bootstrap 95 %
intervals over utterances, and each arm's relative CER and WER gain against the first arm (``shipped``:
no override) with its paired interval (``bench.stats``). A choice is a change whose CER gain interval lies
above 0 (fewer errors than shipped). The test splits are never read: a screen chooses, a later full-budget run reports.

Default arms (each of ``small.yaml``'s choices turned the other way, recipes/finetune/RESULTS.md sp2, d2,
ic2): ``shipped``; ``nosp`` (no speed perturbation); ``dropout`` (0.1, where it ships none);
``nointerctc`` (no intermediate CTC, which it trains on layer 2 of 4 with weight 0.3). Finished arms are
reused (``bench_step.json`` in each arm's folder); an arm whose folder was made by another command stops
the bench.

``--json`` ends with one line: ``{"arms": [{"arm", "overrides", "dev_cer", "dev_cer_ci", "dev_wer",
"dev_wer_ci", "cer_gain", "cer_gain_ci", "wer_gain", "wer_gain_ci", "updates", "minutes"}...],
"config", "minutes"}``.
"""

import argparse
import json
import logging
import os
import shlex
import sys

from bench import stats
from bench.open_corpus import DEFAULT_CORPUS, prepare
from bench.steps import REPO, dev_comparison, finetune_command, step
from common.curves import EpochHistory
from common.shard_format import POOL_PARQUET

DEFAULT_ARMS = {
    "shipped": "",
    "nosp": """'--train_loader={"speed_perturb":null}'""",
    "dropout": "--dropout=0.1",
    "nointerctc": "--inter_ctc_layers=[] --inter_ctc_weight=0.0",
}
REFERENCE = "shipped"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--corpus", default=DEFAULT_CORPUS, help="corpus folder (as bench/pretrain_gain.py's)")
    parser.add_argument("--data", help="shards, text, tokenizer (default: the corpus folder's parent)")
    parser.add_argument("--exp", default="exp/config_screen", help="one folder per arm")
    parser.add_argument("--config", default="recipes/finetune/hparams/small.yaml")
    parser.add_argument("--minutes", type=float, default=15.0, help="every arm's training budget")
    parser.add_argument("--overrides", default="", help="train.py overrides every arm gets before its own")
    parser.add_argument("--arm", action="append", default=[], metavar="NAME=OVERRIDES",
                        help="an arm: its name and train.py overrides as shell words (repeatable; default: "
                             + ", ".join(DEFAULT_ARMS) + "); 'shipped=' (no override) is always first")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args(argv)
    arms = {REFERENCE: ""}
    for spec in args.arm or [f"{name}={words}" for name, words in DEFAULT_ARMS.items()]:
        name, sep, words = spec.partition("=")
        name = name.strip()
        if not sep or not name.replace("_", "").isalnum():
            raise SystemExit(f"error: --arm {spec!r}: write NAME=OVERRIDES, e.g. dropout=--dropout=0.1")
        if name in arms and (name != REFERENCE or words.strip()):
            raise SystemExit(f"error: --arm {spec!r}: {name} is already an arm" + (
                " (shipped is the config as it is, without overrides)" if name == REFERENCE else ""))
        arms[name] = words
    args.arms = arms
    args.corpus, args.exp = os.path.abspath(args.corpus), os.path.abspath(args.exp)
    args.data = os.path.abspath(args.data or os.path.dirname(args.corpus))
    args.config = os.path.join(REPO, args.config)
    return args


def train_arm(args, data, name, overrides):
    """Train (or reuse) arm ``name``: ``--config`` on every label for ``--minutes`` -> (folder, minutes)."""
    folder = os.path.join(args.exp, name)
    train, valid = (os.path.join(data.shards[split], POOL_PARQUET) for split in ("train", "valid"))
    minutes = step(folder, finetune_command(args.config, folder, data.tokenizer, [train], valid, args.minutes,
                                            [*shlex.split(args.overrides), *shlex.split(overrides)]))
    return folder, minutes


def last_updates(folder):
    """Updates the arm made: the ``steps`` of its last epoch in history.json (None if it has none)."""
    records = EpochHistory(os.path.join(folder, "history.json")).records
    return records[-1].get("steps") if records else None


def rows(args, trained):
    """Per arm: dev CER and WER with intervals, and the paired relative gains against ``shipped``."""
    return [{"arm": name, "overrides": args.arms[name], "updates": last_updates(folder), "minutes": round(minutes, 1),
             **dev_comparison(folder, trained[REFERENCE][0])} for name, (folder, minutes) in trained.items()]


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    data = prepare(args)
    trained = {name: train_arm(args, data, name, words) for name, words in args.arms.items()}
    table = rows(args, trained)
    print(f"\n{os.path.relpath(args.config, REPO)}, {args.minutes:g} minutes per arm, every label, dev greedy CTC "
          "(no LM); gain: relative to shipped, paired 95 % interval")
    print("| arm | overrides | updates | dev CER % | dev WER % | CER gain | WER gain |")
    print("|---|---|---|---|---|---|---|")
    for r in table:
        gains = "" if r["arm"] == REFERENCE else (
            f"{r['cer_gain']:+.1%} [{r['cer_gain_ci'][0]:+.1%}, {r['cer_gain_ci'][1]:+.1%}] | "
            f"{r['wer_gain']:+.1%} [{r['wer_gain_ci'][0]:+.1%}, {r['wer_gain_ci'][1]:+.1%}]")
        print(f"| {r['arm']} | `{r['overrides']}` | {r['updates']} | {r['dev_cer']:.2f} ({r['dev_cer_ci'][0]:.2f}-"
              f"{r['dev_cer_ci'][1]:.2f}) | {r['dev_wer']:.2f} ({r['dev_wer_ci'][0]:.2f}-{r['dev_wer_ci'][1]:.2f}) | "
              + (gains or "— | —") + " |")
    for r in table[1:]:
        verdict = stats.verdict(stats.Estimate(r["cer_gain"], *r["cer_gain_ci"]), lower=f"{r['arm']} HIGHER CER",
                                higher=f"{r['arm']} lower CER")
        print(f"{r['arm']} against shipped: {verdict}")
    if args.json:
        print(json.dumps({"arms": table, "config": os.path.relpath(args.config, REPO), "minutes": args.minutes}))


if __name__ == "__main__":
    main()
