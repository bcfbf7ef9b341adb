#!/usr/bin/env python3
"""Does pretraining pay? Finetune on a share of the labels from the pretrained checkpoint vs from scratch.

    python bench/pretrain_gain.py [--seeds 1234 2] [--modalities text|speech|speech+text]
        [--labelled-share 0.15] [--pretrain-minutes 7] [--finetune-minutes 9] [--exp DIR]
        [--pretrained-exp DIR] [--json]
    python bench/pretrain_gain.py --corpus demo [--finetune-epochs 100] [--pretrain-epochs 30] ...

``--corpus open`` (the default; the default config's corpus, ``make open-corpus``; its shards are made by
the finetune recipe's stages 0-1 when missing): the pretrain recipe with ``hparams/small.yaml`` sees all
1500 training utterances without transcripts (BEST-RQ targets) and the corpus's ``lm_text.txt`` (Bible
sentences, none of dev or test) as mono text, which trains the decoder as a language model; its
tokenizer (characters and ``<mask>``) is built from the transcripts and that text. ``--modalities``
picks the batches pretraining draws: ``text`` (the default on this corpus: what measured best, the
speech task does not pay yet), ``speech`` or ``speech+text`` (α = 0.5). Then recipes/finetune/train.py
(small.yaml) trains twice per seed on the same seeded ``--labelled-share`` of the labelled utterances
(225 of 1500 at 15 %: the unlabelled pool is 6.7x the labelled set), with that tokenizer and the same
wall-clock budget: once from scratch, once from the pretrained checkpoint; both are tested on test_seen
and test_unseen. Each arm gets its measured better setting (``--scratch-overrides``,
``--finetune-overrides``; README, Pretraining): from scratch without speed perturbation (with it, 225
utterances stayed on the CTC plateau), from a text-pretrained decoder at a tenth of the rate
(``lr_scales``). ``--pretrained-exp DIR`` skips pretraining and finetunes from DIR.

``--corpus demo``: the demo corpus and configs (k-means units; transcripts as text, Pig Latin pairs),
budgets in epochs, its test split (a held-out voice), speech and text.

Goal: the pretrained WER at least 15 % lower (relative) than from scratch, median over the seeds. Prints
a table per seed (WER, CER, relative WER gain vs scratch, per test split), the median gain per split and
the commands run; with --json the last line holds every figure. On 2 quiet CPU cores, the open defaults
(one seed): 35 min measured (pretraining 7 min and the epoch it ends in: 7.6 min for text alone, 2
epochs; each finetune 9 min plus its decoding: 13.4-13.8 min; up to ~40 on a 20 % slower machine); 27
min more per further seed; 35 min on the demo.
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
             "finetune_config": "recipes/finetune/hparams/demo.yaml", "tests": ["test"],
             "modalities": "speech+text", "scratch_overrides": "", "pretrained_overrides": ""},
    "open": {"data": "data/open", "pretrain_config": "hparams/small.yaml",
             "finetune_config": "recipes/finetune/hparams/small.yaml", "tests": ["test_seen", "test_unseen"],
             "modalities": "text",  # BEST-RQ speech batches took back most of the text's gain
             # small.yaml's speed perturbation kept 225 utterances on the CTC plateau from scratch
             "scratch_overrides": '--train_loader={"speed_perturb":null}',
             # a decoder pretrained as a language model keeps more of it at a tenth of the rate
             "pretrained_overrides": '--lr_scales={"language_model":0.1}'},
}
MODALITY_OVERRIDES = {  # pretrain train.py overrides that restrict the batches to one modality
    "text": ['--mixing_weights={"speech":0,"text":1}'],
    "speech": ["--text_parquets=[]", "--paired_parquets=[]"],
    "speech+text": [],
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--corpus", default="open", choices=sorted(CORPORA), help="which built-in corpus")
    parser.add_argument("--labelled-share", type=float, default=0.15, help="share of labelled utterances")
    parser.add_argument("--finetune-epochs", type=int, default=100,
                        help="demo: epochs of each finetune (a 15 %% subset needs more than the demo's)")
    parser.add_argument("--pretrain-epochs", type=int, default=30, help="demo: pretraining epochs")
    parser.add_argument("--finetune-minutes", type=float, default=9.0, help="open: each finetune's budget")
    parser.add_argument("--pretrain-minutes", type=float, default=7.0,
                        help="open: pretraining's budget; it ends after the epoch that spends it (text alone: "
                             "epochs of 3.7-4.7 min, so 2 epochs, robust to the machine's speed)")
    parser.add_argument("--modalities", choices=sorted(MODALITY_OVERRIDES),
                        help="what pretraining sees (default: text on open, speech+text on demo)")
    parser.add_argument("--speech-only", action="store_const", const="speech", dest="modalities",
                        help="the same as --modalities speech; its runs are named *_speech")
    parser.add_argument("--exp", help="folder of the experiments (default exp/bench_pretrain_gain[_open])")
    parser.add_argument("--seeds", "--seed", type=int, nargs="+", default=[1234],
                        help="each picks a labelled subset; the claim is the median over them")
    parser.add_argument("--pretrain-overrides", default="", help="extra pretrain train.py overrides")
    parser.add_argument("--finetune-overrides",
                        help="finetune train.py overrides for the pretrained model (default: the corpus's, "
                             "--lr_scales={\"language_model\":0.1} on open when text is pretrained)")
    parser.add_argument("--scratch-overrides",
                        help="finetune train.py overrides for the scratch model (default: the corpus's, "
                             "--train_loader={\"speed_perturb\":null} on open)")
    parser.add_argument("--shared-finetune-overrides", default="",
                        help="finetune train.py overrides for both runs, scratch and pretrained "
                             "(e.g. --train_loader={\"speed_perturb\":null})")
    parser.add_argument("--pretrained-exp",
                        help="finetune from this finished pretraining experiment (its tokenizer) instead of "
                             "pretraining again: other --seeds' labelled subsets on the same pretrained model")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args(argv)
    corpus = CORPORA[args.corpus]
    args.exp = args.exp or "exp/bench_pretrain_gain" + ("_open" if args.corpus == "open" else "")
    args.data = corpus["data"]
    args.modalities = args.modalities or corpus["modalities"]
    if args.scratch_overrides is None:
        args.scratch_overrides = corpus["scratch_overrides"]
    if args.finetune_overrides is None:  # lr_scales only help a decoder that text pretraining trained
        args.finetune_overrides = corpus["pretrained_overrides"] if "text" in args.modalities else ""
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
    seconds = {"prepare": run(recipe + ["--stop_stage", "2"])}
    seconds["pretrain"] = run(recipe + ["--stage", "3", "--exp", pretrain_exp, "--", *budget, "--noprogressbar",
                                        *MODALITY_OVERRIDES[args.modalities], *args.pretrain_overrides.split()])
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
    arm = args.finetune_overrides if pretrained else args.scratch_overrides
    command = [sys.executable, "recipes/finetune/train.py", corpus["finetune_config"],
               f"--output_folder={output}", f"--tokenizer_file={tokenizer}", f"--train_parquet={parquet}",
               f"--valid_parquet={shards}/valid/metadata_pool.parquet", f"--test_parquets=[{tests}]",
               *budget, "--noprogressbar", *args.shared_finetune_overrides.split(), *arm.split()]
    if pretrained:
        command.append(f"--pretrained={pretrained}")
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


def run_name(arm, seed):
    """The folder of one finetune: scratch / pretrained for seed 1234, with _seed<N> for another seed."""
    return arm if seed == 1234 else f"{arm}_seed{seed}"


def bench_seed(args, seed, pretrain_exp, arm):
    """Both finetunes on one seed's labelled subset; returns (results, seconds, labelled, total)."""
    parquet, labelled, total = labelled_subset(os.path.join(args.data, "shards", "train"),
                                               args.labelled_share, seed)
    tokenizer = os.path.join(pretrain_exp, "tokenizer.model")
    results, seconds = {}, {}
    results["scratch"], seconds["scratch"] = finetune(args, run_name("scratch", seed), parquet, tokenizer)
    results[arm], seconds[arm] = finetune(args, run_name(arm, seed), parquet, tokenizer, pretrained=pretrain_exp)
    return results, seconds, labelled, total


def median_gains(per_seed, arm, splits):
    """The median over seeds of the relative WER gain, per test split."""
    return {split: float(np.median([relative_gain(results["scratch"][split], results[arm][split])
                                    for results in per_seed.values()])) for split in splits}


def main(argv=None):
    args = parse_args(argv)
    arm = "pretrained" + ("_speech" if args.modalities == "speech" else "")
    pretrain_exp = args.pretrained_exp or os.path.join(args.exp, arm.replace("pretrained", "pretrain"))
    pretrain_seconds = {"pretrain": 0.0} if args.pretrained_exp else prepare_and_pretrain(args, pretrain_exp)
    budget = (f"{args.finetune_epochs} epochs each; pretraining {args.pretrain_epochs} epochs" if args.corpus == "demo"
              else f"{args.finetune_minutes:g} min each; pretraining {args.pretrain_minutes:g} min")
    pretraining = (f"reused: {args.pretrained_exp}" if args.pretrained_exp
                   else f"{args.modalities}, {pretrain_seconds['pretrain'] / 60:.1f} min wall")
    per_seed, splits = {}, CORPORA[args.corpus]["tests"]
    for seed in args.seeds:
        results, seconds, labelled, total = bench_seed(args, seed, pretrain_exp, arm)
        per_seed[seed] = results
        print(f"\nseed {seed}: finetune on {labelled} of {total} labelled utterances ({args.labelled_share:.0%}), "
              f"{budget} ({pretraining})")
        print(table(results, seconds), flush=True)
    gains = median_gains(per_seed, arm, splits)
    for split, gain in gains.items():
        print(f"relative WER gain of pretraining on {split}, median of {len(args.seeds)} seed(s): {gain:.1%} "
              f"(goal >= 15 %): {'met' if gain >= 0.15 else 'NOT met'}")
    if args.json:
        print(json.dumps({"per_seed": {str(seed): results for seed, results in per_seed.items()},
                          "median_relative_wer_gain": gains, "seconds": pretrain_seconds}))


if __name__ == "__main__":
    main()
