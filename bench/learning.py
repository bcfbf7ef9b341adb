"""Learning benchmark: Tandem against SpeechBrain's own training of the same model, same data, same
wall-clock budget, in one run on one machine.

Every leg trains from scratch on the open corpus (``make open-corpus``: 2 h of Bible sentences, 22
training voices) for ``--minutes`` (training ends at the update that spends them; that epoch is validated), one
leg after the other, then decodes dev, test_seen (training voices) and test_unseen (voices never heard):

- ``tandem``: ``recipes/finetune/train.py`` with ``recipes/finetune/hparams/small.yaml``, its shards
  and character tokenizer made by ``recipes/finetune/run.sh`` stages 0-1;
- ``speechbrain_same_model``: SpeechBrain's own data pipeline and training loop
  (``bench/speechbrain_conformer_small.py --settings same_model``: DynamicItemDataset,
  DynamicBatchSampler, Brain, Noam, checkpoint averaging) with small.yaml's model, tokenizer,
  augmentation and optimiser settings: what a competent SpeechBrain user would configure for 2 h;
- ``speechbrain_librispeech``: SpeechBrain's LibriSpeech conformer-small as its recipe writes it (a
  unigram tokenizer of ``--librispeech-tokens`` pieces), a reference row;
- ``tandem+lm`` and ``speechbrain_same_model+lm``: the two models above decoded with the same language
  model fused: ``recipes/lm`` (SpeechBrain's RNNLM over the character tokenizer) trained ONCE on the
  corpus's ``lm_text.txt`` for ``--lm-minutes``, its minutes added to each +lm leg's. Tandem fuses it
  through ``common.decoding``, SpeechBrain through its ``S2STransformerBeamSearcher`` with its
  ``RNNLMScorer`` (the LM's weights loaded by ``common.inference.load_language_model``).

Dev chooses, test reports: every leg decodes dev with each setting of a small grid (``--beams`` x
``--ctc-weights``, x ``--lm-weights`` with the LM), the lowest dev WER wins, and only that setting
decodes the test splits (``bench/dev_choice.py``). Figures come from ``bench/stats.py``: WER with a
bootstrap 95 % interval over utterances, and the paired interval of Tandem's WER minus each other
leg's (``tandem+lm`` against the +lm legs); no claim is made where the interval holds 0.

``--seeds`` runs every leg once per seed (``<out>/seed<S>/<leg>/``); a leg whose folder holds its
``results.json`` is reused, not trained or decoded again, so a three-seed table can be completed over
several runs. With several seeds a leg's WER is the median over seeds, printed with the interval of the
seed whose WER it is and the spread (max - min), then the seeds pooled (each utterance's errors summed
over the seeds) with its interval; the differences are those of the pooled WERs.

    python bench/learning.py             # one seed: 3 x 20 min of training + an 8-min LM, then decoding
    python bench/learning.py --minutes 60 --seeds 1234 1235 1236 --json

``--overrides`` go to small.yaml in every leg (Tandem's train.py, the same_model settings, and the
keys the librispeech settings have: the smoke test's tiny model); ``--tandem-overrides`` to Tandem's
legs alone. Prints, per leg: updates, epochs, audio hours seen, data-wait share (time waiting for
batches / training time), updates per minute, training minutes; per leg and test split the WER with
its interval; the dev WER of every decoding setting; the differences with their verdicts. ``--json``
ends with one JSON line: ``{"legs": [...], "difference": [...], "dev_choices": {...}}``.
"""

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys

import numpy as np

from bench import dev_choice, stats
from common.atomic import atomic_write_text
from common.shard_format import POOL_PARQUET

logger = logging.getLogger("bench.learning")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "recipes", "finetune", "hparams", "small.yaml")
LM_CONFIG = os.path.join(ROOT, "recipes", "lm", "hparams", "rnnlm.yaml")
TESTS = ("test_seen", "test_unseen")
SHARD_SPLITS = {"train": "train", "valid": "dev", "test_seen": "test_seen", "test_unseen": "test_unseen"}
LEGS = ("tandem", "tandem+lm", "speechbrain_same_model", "speechbrain_same_model+lm", "speechbrain_librispeech")
RESULTS = "results.json"


# ---- data and the language model ----

def prepare_data(data, librispeech_tokens=None):
    """``{"char": tokenizer, "unigram": tokenizer or None, "parquets": {split: parquet}}`` of the corpus
    in ``data/corpus``: run.sh stages 0-1 make the shards and the character tokenizer unless they
    exist; the unigram tokenizer of the librispeech leg is trained on the training shards."""
    corpus = os.path.join(data, "corpus")
    manifests = [os.path.join(corpus, f"{name}.jsonl") for name in ("train", "dev", *TESTS)]
    for path in manifests + [os.path.join(corpus, "lm_text.txt")]:
        if not os.path.isfile(path):
            sys.exit(f"error: {path} is missing: run `make open-corpus` (or local/synth_corpus.py {corpus} "
                     "--profile open), or give --data a folder whose corpus/ holds train, dev, test_seen, "
                     "test_unseen .jsonl and lm_text.txt")
    parquets = {name: os.path.join(data, "shards", shard, POOL_PARQUET) for shard, name in SHARD_SPLITS.items()}
    char = os.path.join(data, "tokenizer", "char.model")
    if not (os.path.isfile(char) and all(os.path.isfile(p) for p in parquets.values())):
        subprocess.run(["bash", "recipes/finetune/run.sh", "--data", data, "--stop_stage", "1", "--config",
                        CONFIG, "--train", manifests[0], "--valid", manifests[1], "--test", " ".join(manifests[2:])],
                       check=True, cwd=ROOT, env=dict(os.environ, PYTHON=sys.executable))
    unigram = None
    if librispeech_tokens:
        unigram = os.path.join(data, "tokenizer", f"unigram_{librispeech_tokens}.model")
        if not os.path.isfile(unigram):
            from local import train_tokenizer
            train_tokenizer.main([os.path.join(data, "shards", "train"), os.path.join(data, "tokenizer"),
                                  "--vocab-size", str(librispeech_tokens), "--model-type", "unigram"])
    return {"char": char, "unigram": unigram, "parquets": parquets, "corpus": corpus}


def train_language_model(data, out, minutes, overrides):
    """``(folder, training minutes)`` of the LM every +lm leg fuses: recipes/lm on lm_text.txt (dev
    held out), trained once into ``out/lm`` and reused from there."""
    from local import make_text_shards
    from recipes.lm import train as lm_recipe
    folder = os.path.join(out, "lm")
    if os.path.isfile(os.path.join(folder, "lm.ckpt")):
        logger.info("reusing the language model in %s", folder)
    else:
        text = os.path.join(out, "lm_text")
        parquets = {name: os.path.join(text, f"{name}.parquet") for name in ("lm_text", "dev")}
        make_text_shards.main([os.path.join(data["corpus"], "lm_text.txt"), parquets["lm_text"]])
        make_text_shards.main([os.path.join(data["corpus"], "dev.jsonl"), parquets["dev"]])
        lm_recipe.main([LM_CONFIG, f"--output_folder={folder}", f"--tokenizer_file={data['char']}",
                        f"--train_parquets=[{parquets['lm_text']}]", f"--valid_parquet={parquets['dev']}",
                        f"--train_minutes={minutes}", "--noprogressbar", *overrides])
    return folder, last_history(folder)["minutes"]


def last_history(folder):
    """The last epoch's record of a recipe's ``history.json``."""
    with open(os.path.join(folder, "history.json")) as f:
        return json.load(f)[-1]


# ---- the legs ----

class Bench:
    """What every leg shares: the data, the budget, the overrides and the decoding grids."""

    def __init__(self, args, data):
        self.args, self.data = args, data
        self.overrides = args.overrides.split()
        self.grid = dev_choice.decoding_grid(args.beams, args.ctc_weights)
        self.lm_grid = dev_choice.decoding_grid(args.beams, args.ctc_weights, args.lm_weights)
        self.lm_dir, self.lm_minutes = None, 0.0

    def budget(self):
        """What a finished leg must have been run with to be reused."""
        a = self.args
        return {"minutes": a.minutes, "lm_minutes": a.lm_minutes, "overrides": a.overrides,
                "tandem_overrides": a.tandem_overrides, "lm_overrides": a.lm_overrides, "beams": a.beams,
                "ctc_weights": a.ctc_weights, "lm_weights": a.lm_weights}

    def tandem_argv(self, exp, seed):
        p = self.data["parquets"]
        return [CONFIG, f"--output_folder={exp}", f"--seed={seed}", f"--tokenizer_file={self.data['char']}",
                f"--train_parquet={p['train']}", f"--valid_parquet={p['dev']}",
                f"--test_parquets=[{', '.join(p[name] for name in TESTS)}]", "--noprogressbar",
                *self.overrides, *self.args.tandem_overrides.split()]

    def tandem(self, folder, seed):
        """Train small.yaml for the budget; decode with the settings chosen on dev."""
        from recipes.finetune import train as finetune
        exp = os.path.join(folder, "exp")
        finetune.main([*self.tandem_argv(exp, seed), f"--train_minutes={self.args.minutes}", "--do_test=False"])
        return self.decode_tandem(folder, exp, seed, self.grid)

    def tandem_lm(self, folder, seed, trained):
        """Decode a copy of the tandem leg's model with the LM fused."""
        exp = os.path.join(folder, "exp")
        os.makedirs(exp, exist_ok=True)
        shutil.copytree(os.path.join(trained, "exp", "save"), os.path.join(exp, "save"), dirs_exist_ok=True)
        for name in ("hyperparams.yaml", "history.json"):
            shutil.copy(os.path.join(trained, "exp", name), exp)
        return self.decode_tandem(folder, exp, seed, self.lm_grid, [f"--lm_dir={self.lm_dir}"])

    def decode_tandem(self, folder, exp, seed, grid, extra=()):
        """train.py's test stage for each setting of ``grid`` on dev, then for the chosen one on the tests."""
        from recipes.finetune import train as finetune
        brain, hparams = finetune.build_brain([*self.tandem_argv(exp, seed), "--do_train=False", *extra])

        def decode(setting, split):
            for key, value in setting.items():
                setattr(brain.hparams, key, value)
            brain.split = f"dev_{dev_choice.setting_name(setting)}" if split == "dev" else split
            brain.evaluate(finetune.speech_loader(hparams, self.data["parquets"][split], False), **brain.ranking())
            return os.path.join(exp, f"hyp_{brain.split}.jsonl")
        choice = dev_choice.choose_on_dev(grid, decode, "dev", TESTS)
        durations, _ = finetune.speech_loader(hparams, hparams["train_parquet"], True).used_utterances()
        history = json.load(open(os.path.join(exp, "history.json")))
        last = history[-1]
        figures = {"minutes": last["minutes"], "epochs": last["epoch"], "updates": last["steps"],
                   "audio_hours": round(last["epoch"] * float(np.sum(durations)) / 3600, 4),
                   "data_wait": round(float(np.mean([r["train"].get("data_wait", 0.0) for r in history])), 4)}
        return figures, choice

    def speechbrain(self, folder, seed, settings, tokenizer, trained=None):
        """bench/speechbrain_conformer_small.py in this process (``trained``: decode that leg's model)."""
        from bench import speechbrain_conformer_small as sb_leg
        argv = ["--settings", settings, "--data", os.path.dirname(self.data["corpus"]), "--tokenizer", tokenizer,
                "--out", os.path.join(folder, "exp"), "--minutes", str(self.args.minutes), "--seed", str(seed),
                f"--overrides={self.args.overrides}", "--beams", *map(str, self.args.beams),
                "--ctc-weights", *map(str, self.args.ctc_weights)]
        if trained:
            argv += ["--trained", os.path.join(trained, "exp"), "--lm-dir", self.lm_dir,
                     "--lm-weights", *map(str, self.args.lm_weights)]
        results = sb_leg.main(argv)
        figures = {key: results[key] for key in ("minutes", "epochs", "updates", "audio_hours", "data_wait")}
        return figures, {"dev": results["dev_choices"], "chosen": results["chosen"],
                         "tests": {split: results["splits"][split]["hyps"] for split in TESTS}}

    def run_leg(self, leg, folder, seed):
        """``(training figures, dev choice)`` of one leg, trained and decoded now."""
        seed_folder = os.path.dirname(folder)
        if leg == "tandem":
            return self.tandem(folder, seed)
        if leg == "tandem+lm":
            return self.tandem_lm(folder, seed, os.path.join(seed_folder, "tandem"))
        if leg == "speechbrain_same_model":
            return self.speechbrain(folder, seed, "same_model", self.data["char"])
        if leg == "speechbrain_same_model+lm":
            return self.speechbrain(folder, seed, "same_model", self.data["char"],
                                    trained=os.path.join(seed_folder, "speechbrain_same_model"))
        return self.speechbrain(folder, seed, "librispeech", self.data["unigram"])

    def leg(self, leg, seed):
        """The leg's results: reused from its folder when finished, else trained, decoded and written."""
        folder = os.path.join(self.args.out, f"seed{seed}", leg)
        path = os.path.join(folder, RESULTS)
        if os.path.isfile(path):
            with open(path) as f:
                results = json.load(f)
            if results["budget"] != self.budget():
                sys.exit(f"error: {path} was made with {results['budget']}, not {self.budget()}: give another "
                         "--out, or delete that leg's folder to run it again")
            logger.info("reusing the finished leg %s (seed %d): %s", leg, seed, path)
            return results
        figures, choice = self.run_leg(leg, folder, seed)
        acoustic_minutes = figures["minutes"]
        if leg.endswith("+lm"):  # the LM's training is charged to the leg
            figures = {**figures, "acoustic_minutes": acoustic_minutes, "lm_minutes": self.lm_minutes,
                       "minutes": acoustic_minutes + self.lm_minutes}
        results = {"leg": leg, "seed": seed, "budget": self.budget(), **figures,
                   "updates_per_minute": round(figures["updates"] / max(acoustic_minutes, 1e-9), 2),
                   "dev_choices": choice["dev"], "chosen": choice["chosen"],
                   "hyps": {split: os.path.relpath(hyps, folder) for split, hyps in choice["tests"].items()}}
        atomic_write_text(path, json.dumps(results, indent=1))
        return results


# ---- figures ----

def scored(results, folder):
    """``{split: stats.Scored}`` of a finished leg."""
    return {split: stats.read_scored(os.path.join(folder, hyps)) for split, hyps in results["hyps"].items()}


def over_seeds(per_seed):
    """One Scored of several seeds' decodings of a split: each utterance's edits and words summed."""
    keys = per_seed[0].keys
    for other in per_seed[1:]:
        if other.keys != keys:
            raise ValueError("seeds decoded different utterances of a split: decode the whole split each time")
    return stats.Scored(keys, sum(s.edits for s in per_seed), sum(s.lengths for s in per_seed))


def leg_rows(legs, runs, scores):
    """One row per leg and test split: the median WER over seeds with the interval of the seed whose WER is
    that median (the lower middle one for an even count), its spread (max - min), and the WER of the seeds
    pooled (each utterance's errors summed over seeds) with its own interval, the one the differences use."""
    rows = []
    for leg in legs:
        figures = {key: stats.median_over_seeds([r[key] for r in runs[leg]])[0]
                   for key in ("updates", "epochs", "audio_hours", "data_wait", "updates_per_minute", "minutes")}
        for split in TESTS:
            per_seed = [stats.error_rate(s) for s in scores[leg][split]]
            median, spread = stats.median_over_seeds([e.value for e in per_seed])
            pooled = stats.error_rate(over_seeds(scores[leg][split]))
            rows.append({"leg": leg, "split": split, "wer": round(median, 2), "wer_spread": round(spread, 2),
                         "wer_ci": stats.median_seed(per_seed, lambda e: e.value).as_list(),
                         "wer_pooled": round(pooled.value, 2), "wer_pooled_ci": pooled.as_list(),
                         "seeds": len(per_seed), **figures})
    return rows


def comparisons(legs):
    """``(Tandem leg, other leg)`` pairs: tandem against every other leg, tandem+lm against the +lm legs."""
    pairs = [("tandem", leg) for leg in legs if leg != "tandem" and "tandem" in legs]
    return pairs + [("tandem+lm", leg) for leg in legs if leg.endswith("+lm") and leg != "tandem+lm"
                    and "tandem+lm" in legs]


def differences(legs, runs, scores):
    """Tandem's WER minus each other leg's per split, paired interval (of the seed mean) and verdict."""
    rows = []
    for mine, other in comparisons(legs):
        for split in TESTS:
            estimate = stats.difference(over_seeds(scores[mine][split]), over_seeds(scores[other][split]))
            rate = [stats.median_over_seeds([r["updates_per_minute"] for r in runs[leg]])[0] for leg in (mine, other)]
            rows.append({"tandem_leg": mine, "leg": other, "split": split, "difference": round(estimate.value, 2),
                         "ci": estimate.as_list(), "verdict": stats.verdict(estimate, f"{mine} lower",
                                                                            f"{mine} higher"),
                         "updates_per_minute_ratio": round(rate[0] / max(rate[1], 1e-9), 2)})
    return rows


def format_table(header, lines):
    widths = [max(len(str(line[i])) for line in [header, *lines]) for i in range(len(header))]
    return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths))
                     for line in [header, *lines])


def report(rows, diffs, runs, args):
    """The three tables: legs, dev choices, differences."""
    seeds = (f"median of {len(args.seeds)} seeds (spread) [that seed's 95 % interval]; pooled seeds [95 % interval]"
             if len(args.seeds) > 1 else "[95 % interval]")
    print(f"\nLearning benchmark: {args.minutes:g} min of training per leg (+ {args.lm_minutes:g} min LM for +lm "
          f"legs), {args.data}, {os.cpu_count()} CPU threads; WER %: {seeds}")
    print(format_table(
        ["leg", "split", "WER %", "updates", "epochs", "audio h", "data wait %", "upd/min", "train min"],
        [[r["leg"], r["split"], f"{r['wer']:.2f}" + (f" ({r['wer_spread']:.2f})" if r["seeds"] > 1 else "")
          + f" [{r['wer_ci'][0]:.2f}, {r['wer_ci'][1]:.2f}]" + (
              f"; pooled {r['wer_pooled']:.2f} [{r['wer_pooled_ci'][0]:.2f}, {r['wer_pooled_ci'][1]:.2f}]"
              if r["seeds"] > 1 else ""), f"{r['updates']:g}", f"{r['epochs']:g}",
          f"{r['audio_hours']:.2f}", f"{100 * r['data_wait']:.1f}", f"{r['updates_per_minute']:.1f}",
          f"{r['minutes']:.1f}"] for r in rows]))
    print("\nDev WER % of each decoding setting (* chosen; test decoded once with it)")
    print(format_table(["leg", "seed", "setting", "dev WER %"], [
        [leg, run["seed"], dev_choice.setting_name(row["setting"]) + (" *" if row["setting"] == run["chosen"] else ""),
         f"{row['wer']:.2f} [{row['wer_ci'][0]:.2f}, {row['wer_ci'][1]:.2f}]"]
        for leg, seed_runs in runs.items() for run in seed_runs for row in run["dev_choices"]]))
    print("\nTandem's WER minus each leg's (points, paired 95 % interval; no claim where it holds 0)")
    print(format_table(["tandem leg", "against", "split", "difference", "verdict", "upd/min ratio"], [
        [d["tandem_leg"], d["leg"], d["split"], f"{d['difference']:+.2f} [{d['ci'][0]:+.2f}, {d['ci'][1]:+.2f}]",
         d["verdict"], f"{d['updates_per_minute_ratio']:.2f}x"] for d in diffs]))


def ordered_legs(chosen):
    """The chosen legs in run order, with the leg whose model a +lm leg decodes added before it."""
    wanted = set(chosen) | {leg.removesuffix("+lm") for leg in chosen}
    return [leg for leg in LEGS if leg in wanted]


def expected_training_minutes(legs, args):
    """Wall-clock minutes the run spends training when no leg is reused: each leg that trains (the +lm
    legs decode their base leg's model) runs the budget once per seed, the LM once; every epoch that
    crosses the budget adds up to one epoch more."""
    trained = [leg for leg in legs if not leg.endswith("+lm")]
    lm = args.lm_minutes if len(trained) < len(legs) else 0.0
    return len(trained) * args.minutes * len(args.seeds) + lm


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="data/open", help="folder whose corpus/ holds the open corpus "
                        "(make open-corpus); shards and tokenizers are written beside it")
    parser.add_argument("--out", default="exp/bench_learning", help="one folder per seed and leg; finished "
                        "legs in it are reused")
    parser.add_argument("--minutes", type=float, default=20.0, help="training budget of each leg")
    parser.add_argument("--lm-minutes", type=float, default=8.0, help="training budget of the shared LM")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1234], help="one run of every leg per seed")
    parser.add_argument("--legs", nargs="+", default=list(LEGS), choices=LEGS)
    parser.add_argument("--overrides", default="", help="small.yaml overrides for every leg, e.g. "
                        "--overrides='--d_model=32 --num_encoder_layers=1'")
    parser.add_argument("--tandem-overrides", default="", help="train.py overrides for the Tandem legs alone, "
                        "e.g. --tandem-overrides='--train_loader={\"speed_perturb\":null}'")
    parser.add_argument("--lm-overrides", default="", help="recipes/lm train.py overrides")
    parser.add_argument("--librispeech-tokens", type=int, default=500, help="unigram pieces of the "
                        "speechbrain_librispeech leg's tokenizer")
    parser.add_argument("--beams", type=int, nargs="+", default=[8, 16], help="dev grid: beam sizes")
    parser.add_argument("--ctc-weights", type=float, nargs="+", default=[0.4, 0.6], help="dev grid: CTC weights")
    parser.add_argument("--lm-weights", type=float, nargs="+", default=[0.5, 1.0], help="dev grid: LM weights")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    legs = ordered_legs(args.legs)
    data = prepare_data(args.data, args.librispeech_tokens if "speechbrain_librispeech" in legs else None)
    bench = Bench(args, data)
    logger.info("training: %g min when no leg in %s is reused (%d seeds x %g min per leg that trains, + %g min "
                "LM); decoding comes on top: dev %d times per leg (%d with the LM), each test split once",
                expected_training_minutes(legs, args), args.out, len(args.seeds), args.minutes, args.lm_minutes,
                len(bench.grid), len(bench.lm_grid))
    if any(leg.endswith("+lm") for leg in legs):
        bench.lm_dir, bench.lm_minutes = train_language_model(data, args.out, args.lm_minutes,
                                                              args.lm_overrides.split())
    runs = {leg: [] for leg in legs}
    for seed in args.seeds:
        for leg in legs:
            runs[leg].append(bench.leg(leg, seed))
    scores = {leg: {split: [scored(run, os.path.join(args.out, f"seed{run['seed']}", leg))[split]
                            for run in runs[leg]] for split in TESTS} for leg in legs}
    rows, diffs = leg_rows(legs, runs, scores), differences(legs, runs, scores)
    report(rows, diffs, runs, args)
    if args.json:
        choices = {leg: {str(run["seed"]): {"chosen": run["chosen"], "dev": run["dev_choices"]} for run in seed_runs}
                   for leg, seed_runs in runs.items()}
        print(json.dumps({"legs": rows, "difference": diffs, "dev_choices": choices, "minutes": args.minutes,
                          "lm_minutes": args.lm_minutes, "seeds": args.seeds}))
    return rows, diffs


if __name__ == "__main__":
    main()
