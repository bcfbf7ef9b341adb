"""Learning benchmark: Tandem's default config against plain SpeechBrain conformer-small, same data,
same wall-clock budget, same run.

Both train from scratch on the open corpus (``make open-corpus``: 2 h of Bible sentences, 23 voices)
for ``--minutes`` of training each, one after the other, then decode test_seen (training voices) and
test_unseen (6 voices never heard):

- tandem: ``recipes/finetune/train.py recipes/finetune/hparams/small.yaml`` (``train_minutes``), its
  shards and tokenizer made by ``recipes/finetune/run.sh`` stages 0-1;
- speechbrain: ``bench/speechbrain_conformer_small.py`` (SpeechBrain's LibriSpeech conformer-small,
  scaled to the CPU budget) on the same corpus files, with a unigram-500 tokenizer of the same text.

    python bench/learning.py [--minutes 60] [--systems tandem speechbrain] [--lm-minutes 8] [--json]

With ``--lm-minutes M`` (the recipe's ``run.sh --lm_text``), the Tandem leg also trains ``recipes/lm``
on the corpus's ``lm_text.txt`` (no dev or test sentence) for M minutes after the acoustic model and
decodes a copy of it with the LM fused (``lm``, ``tandem_lm``: beam 16, CTC weight 0.6, LM weight 1.0, as
run.sh); that row's training minutes are the two together.

It prints one row per system and test split: joint beam WER / CER, greedy-CTC WER, epochs, updates
and training minutes. Results land in ``--out`` (one folder per system, ``results.json`` each).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from common.shard_format import POOL_PARQUET
from local.train_tokenizer import tokenizer_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = ("test_seen", "test_unseen")


def prepare_data(data, python):
    """Shards and tokenizers of the open corpus (each step skips what exists)."""
    corpus = os.path.join(data, "corpus")
    if not os.path.isfile(os.path.join(corpus, "train.jsonl")):
        sys.exit(f"error: no open corpus in {corpus}: run `make open-corpus` (or local/synth_corpus.py "
                 f"{corpus} --profile open) first")
    tests = " ".join(os.path.join(corpus, f"{name}.jsonl") for name in TESTS)
    subprocess.run(["bash", "recipes/finetune/run.sh", "--data", data, "--stop_stage", "1",
                    "--train", os.path.join(corpus, "train.jsonl"), "--valid", os.path.join(corpus, "dev.jsonl"),
                    "--test", tests], check=True, cwd=ROOT)
    sb_tokenizer = os.path.join(data, "tokenizer", "unigram_500.model")
    if not os.path.isfile(sb_tokenizer):
        subprocess.run([python, "local/train_tokenizer.py", os.path.join(data, "shards", "train"),
                        os.path.join(data, "tokenizer"), "--vocab-size", "500", "--model-type", "unigram"],
                       check=True, cwd=ROOT)
    return sb_tokenizer


def config_value(python, config, key):
    """A plain value of a recipe config, as run.sh reads it."""
    return subprocess.run([python, "local/config_value.py", config, key], check=True, cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()


LM_DECODING = ["--lm_weight=1.0", "--beam_size=16", "--ctc_weight=0.6"]  # recipes/finetune/run.sh's with an LM


def tandem_command(data, out, python, seed, overrides=()):
    """``(train.py command of small.yaml on the open corpus, its tokenizer name)``."""
    config = "recipes/finetune/hparams/small.yaml"
    token_type, token_count = (config_value(python, config, key) for key in ("token_type", "token_count"))
    tokenizer = tokenizer_name(token_type, token_count)  # as run.sh names it
    shards = os.path.join(data, "shards")
    tests = ", ".join(os.path.join(shards, name, POOL_PARQUET) for name in TESTS)
    command = [python, "recipes/finetune/train.py", config, f"--output_folder={out}", f"--seed={seed}",
               f"--tokenizer_file={os.path.join(data, 'tokenizer', tokenizer + '.model')}",
               f"--train_parquet={os.path.join(shards, 'train', POOL_PARQUET)}",
               f"--valid_parquet={os.path.join(shards, 'valid', POOL_PARQUET)}",
               f"--test_parquets=[{tests}]", "--noprogressbar", *overrides]
    return command, tokenizer


def tandem_row(system, out, tokenizer, started, extra_minutes=0.0):
    """The row of a Tandem experiment folder: its results.json and last history.json entry."""
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    with open(os.path.join(out, "history.json")) as f:
        last = json.load(f)[-1]
    return {"system": system, "tokenizer": tokenizer, "epochs": last["epoch"], "updates": last["steps"],
            "train_minutes": last["minutes"] + extra_minutes, "wall_minutes": (time.time() - started) / 60,
            "splits": {name: {"beam_WER": results[name]["wer"], "beam_CER": results[name]["cer"],
                              "greedy_WER": results[name]["ctc_greedy"]["wer"]} for name in TESTS}}


def run_tandem(data, out, minutes, python, seed, overrides=()):
    """Train and test ``small.yaml`` (with train.py ``overrides``) under the budget; its row."""
    command, tokenizer = tandem_command(data, out, python, seed, overrides)
    started = time.time()
    subprocess.run([*command, f"--train_minutes={minutes}"], check=True, cwd=ROOT)
    return tandem_row("tandem", out, tokenizer, started)


def run_tandem_lm(data, acoustic, out, lm_minutes, python, seed, overrides=()):
    """Train recipes/lm on the corpus's lm_text.txt for ``lm_minutes`` (into ``lm`` beside ``out``) and decode a copy
    of the ``acoustic`` experiment with it in ``out``; its row counts both trainings' minutes."""
    command, tokenizer = tandem_command(data, out, python, seed, overrides)
    lm_exp, corpus = os.path.join(os.path.dirname(out), "lm"), os.path.join(data, "corpus")
    started = time.time()
    subprocess.run(["bash", "recipes/lm/run.sh", "--tokenizer", os.path.join(data, "tokenizer", tokenizer + ".model"),
                    "--data", data, "--text", os.path.join(corpus, "lm_text.txt"),
                    "--valid", os.path.join(corpus, "dev.jsonl"), "--exp", lm_exp, "--",
                    f"--train_minutes={lm_minutes}", "--noprogressbar"], check=True, cwd=ROOT)
    os.makedirs(out, exist_ok=True)
    shutil.copytree(os.path.join(acoustic, "save"), os.path.join(out, "save"), dirs_exist_ok=True)
    for name in ("hyperparams.yaml", "history.json"):
        shutil.copy(os.path.join(acoustic, name), out)
    subprocess.run([*command, "--do_train=False", f"--lm_dir={lm_exp}", *LM_DECODING], check=True, cwd=ROOT)
    with open(os.path.join(lm_exp, "history.json")) as f:
        lm_minutes_spent = json.load(f)[-1]["minutes"]
    return tandem_row("tandem_lm", out, tokenizer, started, extra_minutes=lm_minutes_spent)


def run_speechbrain(data, out, minutes, python, seed, tokenizer):
    """Train and test plain SpeechBrain conformer-small under the budget."""
    started = time.time()
    subprocess.run([python, "bench/speechbrain_conformer_small.py", "--data", data, "--out", out,
                    "--tokenizer", tokenizer, "--minutes", str(minutes), "--seed", str(seed),
                    "--tests", " ".join(TESTS)], check=True, cwd=ROOT)
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    return {**results, "tokenizer": "unigram_500", "wall_minutes": (time.time() - started) / 60}


def table(rows):
    """One line per system and split."""
    header = ["system", "split", "WER %", "CER %", "greedy WER %", "tokens", "epochs", "updates", "train min",
              "wall min"]
    lines = [header]
    for row in rows:
        for split in TESTS:
            figures = row["splits"][split]
            lines.append([row["system"], split, f"{figures['beam_WER']:.1f}", f"{figures['beam_CER']:.1f}",
                          f"{figures['greedy_WER']:.1f}", row["tokenizer"], str(row["epochs"]), str(row["updates"]),
                          f"{row['train_minutes']:.1f}", f"{row['wall_minutes']:.1f}"])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)) for line in lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="data/open", help="the open corpus folder (make open-corpus)")
    parser.add_argument("--out", default="exp/bench_learning")
    parser.add_argument("--minutes", type=float, default=60.0, help="training budget of each system")
    parser.add_argument("--systems", nargs="+", default=["tandem", "speechbrain"], choices=["tandem", "speechbrain"])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--tandem-overrides", default="",
                        help="train.py overrides for small.yaml, e.g. --train_loader={\"speed_perturb\":null}")
    parser.add_argument("--lm-minutes", type=float, default=0.0,
                        help="also train an LM on lm_text.txt for this long and test Tandem with it (0: no LM)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args(argv)
    python = sys.executable
    sb_tokenizer = prepare_data(args.data, python)
    rows = []
    for system in args.systems:
        out = os.path.join(args.out, system)
        if system == "tandem":
            rows.append(run_tandem(args.data, out, args.minutes, python, args.seed, args.tandem_overrides.split()))
            if args.lm_minutes > 0:
                rows.append(run_tandem_lm(args.data, out, out + "_lm", args.lm_minutes, python, args.seed,
                                          args.tandem_overrides.split()))
        else:
            rows.append(run_speechbrain(args.data, out, args.minutes, python, args.seed, sb_tokenizer))
    print(f"Learning benchmark: {args.minutes:g} min of training each, 2 h open corpus ({args.data}), "
          f"{os.cpu_count()} CPU threads")
    print(table(rows))
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
