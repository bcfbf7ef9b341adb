#!/usr/bin/env python3
"""Does joint pretraining beat what a user would do instead? Every arm at 15 % labels, one machine, one run.

    python bench/pretrain_gain.py                              # core: scratch+lm and joint+lm, one subset
    python bench/pretrain_gain.py --arms all --seeds 3         # the whole table (resumes finished arms)
    python bench/pretrain_gain.py --arms scratch+lm,text+lm --json

The open corpus (``--corpus``, default ``data/open/corpus``, made by ``local/synth_corpus.py --profile
open`` when missing): a seeded ``--labelled-share`` of ``train.jsonl`` is labelled (225 of 1500 at 15 %),
the rest of train is the unlabelled pool (5.7x the labelled audio; its transcripts are never read), and
``lm_text.txt`` less every training transcript is the text. Arms (``--arms all``; the default ``core``
is ``scratch+lm,joint+lm``):

- ``scratch``: recipes/finetune/train.py on the labelled subset; ``+lm``: decoded with recipes/lm trained
  on ``lm_text.txt`` for ``--lm-minutes`` (default: the pretraining's minutes), trained once, fused in
  every ``+lm`` arm (``--lm-weight``, beam ``--lm-beam``, CTC weight ``--lm-ctc-weight``).
- ``speech``, ``text``, ``joint`` (and each ``+lm``): finetuned from recipes/pretrain/train.py
  (``--pretrain-config``) on all train audio without transcripts (BEST-RQ), on ``lm_text.txt``, or both,
  for ``--pretrain-minutes`` each.
- ``self_training+lm``: scratch + LM pseudo-labels the pool (recipes/finetune/pseudo_label.py: the
  confidence threshold is chosen on dev, dev and test utterances are refused by key and audio) and
  finetuning goes on with labelled + pseudo-labelled speech (``--self-training-rounds``, each
  ``--self-training-minutes``); ``joint+self_training+lm`` does the same from ``joint``: pretraining
  and self-training together.
- ``best+lm``: of the pool's uses (speech/text/joint+lm, the self-training arms) the one with the lowest
  dev WER (median over subsets); its dev figures are printed.
- ``all_labels+lm``: finetuned on every label of train (the ceiling).
- ``new_voices_pool+lm``: ``self_training+lm`` whose pool adds ``unlabelled_new_voices.jsonl``
  (untranscribed speech of the test_unseen voices) when the corpus has it; skipped, saying so, otherwise.
  ``new_voices_share+lm``: the same with ``pseudo_label.py --keep share``: each pool keeps its own
  top-scored share of the size dev's threshold keeps, instead of dev's score (which kept 10 of the new
  voices' 300 utterances in G3: the labeller is less sure of voices it has not heard).
- ``--speech-curve 7,15,30,60``: speech-only pretraining of each budget, finetuned as ``speech``, and its
  dev gain over scratch (greedy CTC, no LM) against the minutes: where unlabelled speech starts to pay,
  if it does at all on this machine. Dev only; it adds no row to the test table.
- ``--speech-targets units``: the speech pretrainings (speech, joint, the curve) predict k-means units of
  an encoder layer of the subset's scratch finetune instead of the config's BEST-RQ codes: HuBERT's next
  iteration with the model the labelled subset trained as the first (its units follow the characters
  three times as well as BEST-RQ's codes: RESULTS.md D4). Per subset, charged that finetune and the unit
  extraction (so is ``scratch_equal_minutes``, through the joint arm's minutes).
- ``scratch_equal_minutes`` (``+lm``): scratch finetuned for every minute the joint arm spent before its
  LM (its pretraining and each pretrained-parts candidate), less one finetune's start-up and dev pass as
  scratch spent them: with the LM, the minutes of ``joint+lm``. What a user would do with that time
  instead of pretraining.

Every finetune has the same config, overrides (``--finetune-overrides``; by default no speed
perturbation for every arm: with it, RESULTS.md G6, dev CER without LM fell for every arm and subset but
dev WER decoded as the test splits are, with the LM, rose for scratch + LM on every subset and for
joint + LM in the median, so dev keeps it off) and ``--finetune-minutes``, but for one rule the bench
applies per pretrained arm on dev: what the finetune keeps of the pretraining (``--pretrained-parts``:
every part, the decoder alone on a fresh encoder, ``lower2``: every part but the encoder's conformer
layers above the second, which RESULTS.md D1's probe found worse than random, or every part with the
encoder kept closer to its pretraining: ``slow_encoder`` at 0.3 of the rate, ``frozen_start`` frozen
for the first 400 updates), each candidate
finetuned, the one of lowest greedy CTC dev CER kept, all of them charged. Selection (these parts, the
self-training threshold, ``best+lm``) reads dev only; the test
splits are decoded after every requested arm is trained, once: hypotheses are kept in each arm's folder
(``bench_hyp_<split>[_lm].jsonl``) and reused, as are finished trainings (``bench_step.json``), so
``--arms all --seeds 3`` can be built over several runs. ``--seeds N`` draws N labelled subsets (seeds
1234, 1235, ...; ``--first-seed`` moves the start); pretrainings, the LM and ``all_labels`` are shared by
all of them.

Prints, per subset, arm and split: WER with its bootstrap 95 % interval over utterances, the relative
WER gain against ``scratch+lm`` with its paired interval (``bench.stats``), and the minutes the arm
spent in all (pretraining + LM + finetuning + pseudo-labelling, each component counted once); then the
median over subsets and the goals. ``--json`` ends with one line: ``{"arms": [{"arm", "split", "wer",
"wer_ci", "gain_vs_scratch_lm", "gain_ci", "minutes"}...], "per_seed": [...], "best": ...}``; with
several subsets a row holds the median WER and gain, and the interval of the subset whose figure is that
median. The default run (one pretraining of 7 min, an LM of 7 min, three 9-minute finetunes: scratch
and joint's two candidates, four test decodings with the LM) is sized to fit 60 minutes on 2 CPU cores.
"""

import argparse
import json
import logging
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field

from bench import stats
from bench.open_corpus import DEFAULT_CORPUS, NEW_VOICES, labelled_subset, prepare
from bench.steps import REPO, dev_comparison, dev_figures, finetune_command, step
from common.atomic import atomic_write_text
from common.shard_format import POOL_PARQUET

logger = logging.getLogger("pretrain_gain")
FIRST_SEED = 1234
MODALITIES = {  # pretrain train.py overrides that restrict pretraining to one modality
    "speech": ["--text_parquets=[]", "--paired_parquets=[]"],
    "text": ['--mixing_weights={"speech":0,"text":1}'],
    "joint": [],
}
# arm -> (model, decoded with the LM); best+lm is chosen among POOL_ARMS on dev
ARMS = {
    "scratch": ("scratch", False), "scratch+lm": ("scratch", True),
    "speech": ("speech", False), "speech+lm": ("speech", True),
    "text": ("text", False), "text+lm": ("text", True),
    "joint": ("joint", False), "joint+lm": ("joint", True),
    "self_training+lm": ("self_training", True), "joint+self_training+lm": ("joint_self_training", True),
    "best+lm": (None, True),
    "all_labels+lm": ("all_labels", True),
    "new_voices_pool+lm": ("new_voices_pool", True), "new_voices_share+lm": ("new_voices_share", True),
    "scratch_equal_minutes": ("scratch_equal_minutes", False),
    "scratch_equal_minutes+lm": ("scratch_equal_minutes", True),
}
NO_SPEED_PERTURB = """'--train_loader={"speed_perturb":null}'"""  # shell words: quotes survive shlex.split
CORE_ARMS = ("scratch+lm", "joint+lm")
REFERENCE = "scratch+lm"
POOL_ARMS = ("speech+lm", "text+lm", "joint+lm", "self_training+lm", "joint+self_training+lm")
PARTS = {  # --pretrained-parts candidates -> their finetune overrides (all: the config's, every group)
    "all": [], "decoder": ["--pretrained_parts=[cross_attention, language_model]"],
    "encoder": ["--pretrained_parts=[encoder, ctc]"],
    "lower2": ["--pretrained_encoder_layers=2"],  # the top conformer layers fresh: RESULTS.md D1
    # every part, the finetune keeping more of the encoder (RESULTS.md D4's lead): at 0.3 of the rate ...
    "slow_encoder": ["--lr_scales={encoder: 0.3}"],
    # ... or frozen for the first 400 updates while the fresh heads adapt to it (wav2vec 2.0's finetuning)
    "frozen_start": ["--freeze_encoder_steps=400"]}
SELF_TRAINING = {  # model -> (labeller, pools, pseudo_label.py options of the arm)
    "self_training": ("scratch", ("pool",), []), "joint_self_training": ("joint", ("pool",), []),
    "new_voices_pool": ("scratch", ("pool", NEW_VOICES), []),
    "new_voices_share": ("scratch", ("pool", NEW_VOICES), ["--keep", "share"])}
NEW_VOICE_ARMS = ("new_voices_pool+lm", "new_voices_share+lm")
CURVE_PREFIX = "speech_"  # model speech_<m>min: finetuned from speech-only pretraining of m minutes
UNITS_SUFFIX = "_units"  # --speech-targets units: the per-subset pretrainings' and their finetunes' folders


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--corpus", default=DEFAULT_CORPUS,
                        help="corpus folder: train.jsonl, dev.jsonl, test_seen/test_unseen (or test).jsonl, "
                             "lm_text.txt, optionally unlabelled_new_voices.jsonl")
    parser.add_argument("--data", help="working folder for shards, text parquets, tokenizer (default: the "
                                       "corpus folder's parent)")
    parser.add_argument("--exp", default="exp/bench_pretrain_gain", help="folder of every arm's experiments")
    parser.add_argument("--upstream-exp", help="folder of the LM and the pretrainings (default: --exp); another "
                                               "bench's --exp reuses them, charged their recorded minutes, when "
                                               "only the finetunes change")
    parser.add_argument("--arms", default="core", help="core, all, or a comma-separated list of " + ", ".join(ARMS))
    parser.add_argument("--seeds", type=int, default=1, help="labelled subsets (seeds 1234, 1235, ...)")
    parser.add_argument("--first-seed", type=int, default=FIRST_SEED,
                        help="the first subset's seed (--seeds 1 --first-seed 1235: the second subset alone)")
    parser.add_argument("--labelled-share", type=float, default=0.15, help="share of train that is labelled")
    parser.add_argument("--pretrain-minutes", type=float, default=7.0,
                        help="each pretraining's budget (it ends at the update that spends it)")
    parser.add_argument("--lm-minutes", type=float, help="the LM's budget (default: --pretrain-minutes, the "
                                                          "minutes text pretraining gets)")
    parser.add_argument("--finetune-minutes", type=float, default=9.0, help="every finetune's budget")
    parser.add_argument("--self-training-rounds", type=int, default=1, help="pseudo-label + finetune rounds")
    parser.add_argument("--self-training-minutes", type=float,
                        help="each round's finetune budget (default: --finetune-minutes)")
    parser.add_argument("--pretrain-config", default="recipes/pretrain/hparams/small.yaml")
    parser.add_argument("--finetune-config", default="recipes/finetune/hparams/small.yaml")
    parser.add_argument("--lm-config", default="recipes/lm/hparams/rnnlm.yaml")
    parser.add_argument("--pretrain-overrides", default="", help="more pretrain train.py overrides (every arm)")
    parser.add_argument("--finetune-overrides", default=NO_SPEED_PERTURB,
                        help="finetune train.py overrides, the same for every arm")
    parser.add_argument("--lm-overrides", default="", help="more recipes/lm train.py overrides")
    parser.add_argument("--lm-weight", type=float, default=1.0, help="LM fusion weight (run.sh's, chosen on dev)")
    parser.add_argument("--lm-beam", type=int, default=16, help="beam size with the LM (run.sh's)")
    parser.add_argument("--lm-ctc-weight", type=float, default=0.6, help="CTC weight with the LM (run.sh's)")
    parser.add_argument("--pretrained-parts", default="all,decoder",
                        help="what each pretrained arm may keep of its pretraining, chosen per arm on dev (the "
                             "finetune's greedy CTC dev CER), each candidate finetuned and charged: of "
                             + ", ".join(PARTS) + " (lower2: every part but the encoder's conformer layers above "
                             "the second; slow_encoder: every part, the encoder at 0.3 of the rate; "
                             "frozen_start: every part, the encoder frozen for the first 400 updates)")
    parser.add_argument("--pseudo-label-args", default="", help="more recipes/finetune/pseudo_label.py options")
    parser.add_argument("--speech-curve", default="",
                        help="pretraining budgets in minutes (e.g. 7,15,30,60): speech-only pretraining of each, "
                             "finetuned as the speech arm, and its dev gain over scratch against the minutes "
                             "(dev only, no LM): where unlabelled speech starts to pay, if it does")
    parser.add_argument("--speech-targets", default="config", choices=("config", "units"),
                        help="what the speech pretrainings (speech, joint, the curve) predict: the pretrain "
                             "config's targets (small.yaml: BEST-RQ codes), or units: k-means (--units-clusters) "
                             "of encoder layer --units-layer of the subset's scratch finetune, on all train audio "
                             "(HuBERT's next iteration, the labelled subset's model as the first). Such "
                             "pretrainings are per subset, in --exp folders ending _units (one --exp per "
                             "layer and cluster count), and charged the scratch finetune and the unit extraction")
    parser.add_argument("--units-layer", type=int, default=4, help="--speech-targets units: the conformer layer "
                                                                   "(1: the first; small.yaml's top: 4)")
    parser.add_argument("--units-clusters", type=int, default=100, help="--speech-targets units: k-means clusters")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args(argv)
    args.arms = arm_list(args.arms)
    if args.units_layer < 1 or args.units_clusters < 2:
        raise SystemExit(f"error: --units-layer {args.units_layer} / --units-clusters {args.units_clusters}: the "
                         "layer counts from 1 (the first conformer layer), and k-means needs 2 clusters or more")
    args.pretrained_parts = [name.strip() for name in args.pretrained_parts.split(",") if name.strip()]
    if not args.pretrained_parts or set(args.pretrained_parts) - set(PARTS):
        raise SystemExit(f"error: --pretrained-parts {args.pretrained_parts}: use names of {list(PARTS)}")
    try:
        args.speech_curve = sorted({float(m) for m in args.speech_curve.split(",") if m.strip()})
    except ValueError:
        raise SystemExit(f"error: --speech-curve {args.speech_curve!r}: give minutes separated by commas, e.g. "
                         "7,15,30,60") from None
    if any(m <= 0 for m in args.speech_curve):
        raise SystemExit(f"error: --speech-curve {args.speech_curve}: every budget must be above 0 minutes")
    args.lm_minutes = args.pretrain_minutes if args.lm_minutes is None else args.lm_minutes
    args.self_training_minutes = args.self_training_minutes or args.finetune_minutes
    args.corpus, args.exp = os.path.abspath(args.corpus), os.path.abspath(args.exp)
    args.upstream_exp = os.path.abspath(args.upstream_exp or args.exp)
    args.data = os.path.abspath(args.data or os.path.dirname(args.corpus))
    for key in ("pretrain_config", "finetune_config", "lm_config"):
        setattr(args, key, os.path.join(REPO, getattr(args, key)))
    return args


def subset_seeds(args):
    """The labelled subsets' seeds: ``--seeds`` of them from ``--first-seed`` on."""
    return [args.first_seed + i for i in range(args.seeds)]


def arm_list(spec):
    """The arms of ``--arms`` (``core``, ``all`` or a list), in table order; unknown names are refused."""
    names = {"core": CORE_ARMS, "all": tuple(ARMS)}.get(spec, [name.strip() for name in spec.split(",") if name])
    unknown = [name for name in names if name not in ARMS]
    if unknown:
        raise SystemExit(f"error: --arms: unknown arm(s) {unknown}: use core, all or names of {list(ARMS)}")
    return [name for name in ARMS if name in names]


@dataclass
class Model:
    """A trained finetune experiment and the steps (name -> minutes) it took, its inputs' included."""

    folder: str
    components: dict = field(default_factory=dict)


class Bench:
    """Trains what the requested arms need (once, reusing finished folders) and decodes it."""

    def __init__(self, args, data):
        self.args, self.data = args, data
        self.done = {}  # step name -> minutes
        self.models = {}  # (model name, seed) -> Model
        self.decoders = {}
        self.choices = {}  # arm folder -> dev figures of each pretrained-parts candidate and the choice

    def lm(self):
        """The LM on lm_text.txt, trained once for ``--lm-minutes``."""
        if "lm" not in self.done:
            a, folder = self.args, os.path.join(self.args.upstream_exp, "lm")
            self.done["lm"] = step(folder, [
                sys.executable, "recipes/lm/train.py", a.lm_config, f"--output_folder={folder}",
                f"--tokenizer_file={self.data.tokenizer}", f"--train_parquets=[{self.data.lm_text}]",
                f"--valid_parquet={self.data.lm_valid}", "--number_of_epochs=1000", f"--train_minutes={a.lm_minutes}",
                "--noprogressbar", *shlex.split(a.lm_overrides)])
        return os.path.join(self.args.upstream_exp, "lm")

    def uses_units(self, modality):
        """Whether ``modality``'s pretraining predicts the scratch finetune's units (``--speech-targets units``)."""
        return self.args.speech_targets == "units" and modality != "text"

    def pretrained(self, modality, seed, minutes=None):
        """``(folder, components)`` of the pretraining on ``modality`` (speech, text, joint), run once for
        ``minutes`` (default ``--pretrain-minutes``; another budget, as ``--speech-curve`` asks, has a folder
        of its own). With the scratch finetune's units as targets it is subset ``seed``'s own, charged them."""
        a = self.args
        minutes = a.pretrain_minutes if minutes is None else minutes
        name = f"pretrain_{modality}" + ("" if minutes == a.pretrain_minutes else f"_{minutes:g}min")
        if self.uses_units(modality):
            (train_units, valid_units), components = self.scratch_units(seed)
            name = f"seed{seed}/{name}{UNITS_SUFFIX}"
            folder = os.path.join(a.exp, name)
            targets = ["--speech_targets=kmeans", f"--units_dirs=[{train_units}]", f"--valid_units_dir={valid_units}"]
        else:
            folder, targets, components = os.path.join(a.upstream_exp, name), [], {}
        if name not in self.done:
            self.done[name] = step(folder, [
                sys.executable, "recipes/pretrain/train.py", a.pretrain_config, f"--output_folder={folder}",
                f"--tokenizer_file={self.data.tokenizer}",
                f"--speech_parquets=[{os.path.join(self.data.shards['train'], POOL_PARQUET)}]",
                f"--text_parquets=[{self.data.lm_text}]",
                f"--valid_parquet={os.path.join(self.data.shards['valid'], POOL_PARQUET)}",
                "--number_of_epochs=1000", f"--train_minutes={minutes}", "--noprogressbar",
                *MODALITIES[modality], *targets, *shlex.split(a.pretrain_overrides)])
        return folder, {**components, name: self.done[name]}

    def scratch_units(self, seed):
        """``([train units, dev units], components)``: k-means units (local/extract_units.py) of encoder layer
        ``--units-layer`` of subset ``seed``'s scratch finetune, fitted on and given to all train audio (the
        pool's transcripts are never read: the labelled subset taught the encoder), applied to dev;
        charged the scratch finetune and both extractions."""
        a, scratch = self.args, self.model("scratch", seed)
        root = f"seed{seed}/units_layer{a.units_layer}_k{a.units_clusters}"
        features = f"{scratch.folder}:{a.units_layer}"
        folders, components = [], dict(scratch.components)
        for split, fit in (("train", ["--n-units", str(a.units_clusters)]), ("valid", None)):
            name = f"{root}/{split}"
            folders.append(os.path.join(a.exp, name))
            fit = fit or ["--kmeans", os.path.join(folders[0], "kmeans.json")]
            if name not in self.done:
                self.done[name] = step(folders[-1], [sys.executable, "local/extract_units.py", self.data.shards[split],
                                                     folders[-1], "--features", features, *fit])
            components[name] = self.done[name]
        return folders, components

    def finetune(self, name, train_parquets, minutes, init=None, parts=None):
        """One finetune (averaged at its end; its test stage is a greedy pass over dev) -> minutes."""
        a, folder = self.args, os.path.join(self.args.exp, name)
        self.done[name] = step(folder, finetune_command(
            a.finetune_config, folder, self.data.tokenizer, train_parquets,
            os.path.join(self.data.shards["valid"], POOL_PARQUET), minutes,
            [*([f"--pretrained={init}"] if init else []), *(PARTS[parts] if parts else []),
             *shlex.split(a.finetune_overrides)]))
        return folder

    def model(self, name, seed):
        """Train (or reuse) model ``name`` on seed ``seed``'s labelled subset; returns its ``Model``."""
        if (name, seed) not in self.models:
            self.models[name, seed] = self._build(name, seed)
        return self.models[name, seed]

    def _build(self, name, seed):
        a = self.args
        labelled, pool = labelled_subset(self.data.shards["train"], a.labelled_share, seed)
        where = f"seed{seed}/{name}"
        if name in MODALITIES:
            return self.finetune_pretrained(name, seed, labelled)
        if name.startswith(CURVE_PREFIX):  # speech_<m>min: speech pretraining of another budget
            return self.finetune_pretrained("speech", seed, labelled, float(name[len(CURVE_PREFIX):-len("min")]),
                                            name)
        if name == "scratch":
            return Model(self.finetune(where, [labelled], a.finetune_minutes), {where: self.done[where]})
        if name == "scratch_equal_minutes":
            joint, scratch = self.model("joint", seed), self.model("scratch", seed)
            overhead = max(0.0, sum(scratch.components.values()) - a.finetune_minutes)  # start-up, dev pass
            budget = round(sum(joint.components.values()) - overhead, 2)
            return Model(self.finetune(where, [labelled], budget), {where: self.done[where]})
        if name == "all_labels":
            everything = os.path.join(self.data.shards["train"], POOL_PARQUET)
            return Model(self.finetune("all_labels", [everything], a.finetune_minutes),
                         {"all_labels": self.done["all_labels"]})
        labeller, pools, options = SELF_TRAINING[name]
        return self.self_train(where, self.model(labeller, seed), labelled, {"pool": pool, NEW_VOICES:
                                                                             self.data.new_voices}, pools, options)

    def finetune_pretrained(self, modality, seed, labelled, pretrain_minutes=None, name=None):
        """Finetune model ``name`` (default ``modality``) of subset ``seed`` from the ``modality`` pretraining
        (of ``pretrain_minutes``) once per ``--pretrained-parts`` candidate and keep the one of lowest dev CER
        (the finetune's own greedy CTC pass over dev); every candidate's minutes are charged to the arm."""
        a, (init, components) = self.args, self.pretrained(modality, seed, pretrain_minutes)
        where = f"seed{seed}/{name or modality}" + (UNITS_SUFFIX if self.uses_units(modality) else "")
        dev = {}
        for parts in a.pretrained_parts:
            folder = where if parts == "all" else f"{where}_{parts}"
            dev[folder] = (dev_figures(self.finetune(folder, [labelled], a.finetune_minutes, init, parts)), parts)
            components[folder] = self.done[folder]
        chosen = min(dev, key=lambda folder: dev[folder][0]["cer"])
        if len(dev) > 1:
            print(f"{where}: pretrained parts chosen on dev (greedy CTC CER / WER %): " + ", ".join(
                f"{parts} {figures['cer']:.2f} / {figures['wer']:.2f}" for figures, parts in dev.values())
                  + f" -> {dev[chosen][1]}", flush=True)
        self.choices[where] = {parts: figures for figures, parts in dev.values()} | {"chosen": dev[chosen][1]}
        return Model(os.path.join(a.exp, chosen), components)

    def self_train(self, where, labeller, labelled, pool_paths, pools, options=()):
        """Rounds of pseudo-labelling the pools with ``labeller`` + LM (pseudo_label.py ``options``) and
        finetuning from it."""
        a, lm = self.args, self.lm()
        components = {**labeller.components, "lm": self.done["lm"]}
        current = labeller.folder
        for number in range(1, a.self_training_rounds + 1):
            folder = os.path.join(a.exp, where, f"round{number}")
            labels = os.path.join(folder, "pseudo_labels")
            held_out = [self.data.shards[name] for name in ["valid", *self.data.tests]]
            components[f"{where}/labels{number}"] = step(labels, [
                sys.executable, "recipes/finetune/pseudo_label.py", current,
                "--unlabelled", *[pool_paths[p] for p in pools], "--valid", self.data.shards["valid"],
                "--held_out", *held_out, "--output", labels, "--lm_dir", lm, "--lm_weight", str(a.lm_weight),
                "--beam", str(a.lm_beam), "--ctc_weight", str(a.lm_ctc_weight), *options,
                *shlex.split(a.pseudo_label_args)])
            current = self.finetune(f"{where}/round{number}", [labelled, os.path.join(labels, POOL_PARQUET)],
                                    a.self_training_minutes, init=os.path.join(labels, "model"))
            components[f"{where}/round{number}"] = self.done[f"{where}/round{number}"]
        return Model(current, components)

    def decode(self, model, split, with_lm):
        """``bench_hyp_<split>[_lm].jsonl`` of ``model`` (decoded once, then reused) -> ``stats.Scored``."""
        path = os.path.join(model.folder, f"bench_hyp_{split}{'_lm' if with_lm else ''}.jsonl")
        if not os.path.isfile(path):
            from common.pseudo_labels import decode_scored, parquet_audio, parquet_texts

            began = time.perf_counter()
            parquet = os.path.join(self.data.shards[split], POOL_PARQUET)
            refs = parquet_texts([parquet])
            hyps = {s.key: s.text for s in decode_scored(self.decoder(model.folder, with_lm), parquet_audio([parquet]),
                                                         self.args.lm_beam if with_lm else None)}
            atomic_write_text(path, "".join(json.dumps({"key": k, "hyp": hyps.get(k, ""), "ref": refs[k]},
                                                       ensure_ascii=False) + "\n" for k in sorted(refs)))
            print(f"decoded {split} with {model.folder}{' + LM' if with_lm else ''} "
                  f"({(time.perf_counter() - began) / 60:.1f} min)", flush=True)
        return stats.read_scored(path)

    def decoder(self, folder, with_lm):
        """The averaged model of ``folder`` ready to decode (with the bench's LM settings), loaded once."""
        from common.inference import load_trained

        if (folder, with_lm) not in self.decoders:
            settings = ({"lm_dir": self.lm(), "lm_weight": self.args.lm_weight, "ctc_weight": self.args.lm_ctc_weight}
                        if with_lm else {"lm_weight": 0.0})
            self.decoders = {(folder, with_lm): load_trained(folder, **settings)}  # one model in memory at a time
        return self.decoders[folder, with_lm]

    def minutes(self, model, with_lm):
        """Minutes the arm spent in all: its model's steps, plus the LM's when it decodes with it."""
        components = dict(model.components)
        if with_lm:
            components["lm"] = self.done["lm"]
        return sum(components.values())


# ---- the table --------------------------------------------------------------------------------------

def available_arms(args, data):
    """The requested arms this corpus allows (the new-voice arms need the new voices' speech)."""
    arms = list(args.arms)
    for arm in NEW_VOICE_ARMS:
        if arm in arms and data.new_voices is None:
            print(f"{arm} skipped: the corpus has no unlabelled_new_voices.jsonl", flush=True)
            arms.remove(arm)
    return arms


def train_all(bench, arms, seeds):
    """Every model the arms need, on every seed (``best+lm``'s candidates and the reference included)."""
    needed = [REFERENCE, *arms, *(POOL_ARMS if "best+lm" in arms else ())]
    for seed in seeds:
        for arm in dict.fromkeys(needed):
            name, with_lm = ARMS[arm]
            if name is not None:
                bench.model(name, seed)
            if with_lm:
                bench.lm()


def curve_model(args, minutes):
    """The model of ``--speech-curve``'s budget ``minutes``: the speech arm's at ``--pretrain-minutes``."""
    return "speech" if minutes == args.pretrain_minutes else f"{CURVE_PREFIX}{minutes:g}min"


def speech_curve(bench, seeds):
    """Speech-only pretraining's dev gain over scratch (greedy CTC, no LM, the finetunes' own pass over
    dev) per ``--speech-curve`` budget and subset, with paired intervals, then the median per budget.
    Dev only: the curve finds the budget where unlabelled speech starts to pay; the test splits are
    read for the table's arms alone."""
    rows = []
    targets = ("the config's" if bench.args.speech_targets == "config" else
               f"k-means units ({bench.args.units_clusters}) of the scratch finetune's layer {bench.args.units_layer}")
    print(f"\nspeech-only pretraining ({targets} targets) against scratch on dev (greedy CTC, no LM; gain: "
          "relative, paired 95 % CI):")
    for minutes in bench.args.speech_curve:
        mine = []
        for seed in seeds:
            scratch, speech = bench.model("scratch", seed), bench.model(curve_model(bench.args, minutes), seed)
            row = {"pretrain_minutes": minutes, "seed": seed, "minutes": round(bench.minutes(speech, False), 1),
                   "scratch_minutes": round(bench.minutes(scratch, False), 1)}
            row |= dev_comparison(speech.folder, scratch.folder)
            base = dev_comparison(scratch.folder, scratch.folder)
            row |= {f"scratch_dev_{name}": base[f"dev_{name}"] for name in ("cer", "wer")}
            mine.append(row)
            print(f"  {minutes:g} min, subset {seed}: dev CER {row['dev_cer']:.2f} against {row['scratch_dev_cer']:.2f}"
                  f" ({row['cer_gain']:+.1%} [{row['cer_gain_ci'][0]:+.1%}, {row['cer_gain_ci'][1]:+.1%}]), WER "
                  f"{row['dev_wer']:.2f} against {row['scratch_dev_wer']:.2f} ({row['wer_gain']:+.1%}); minutes "
                  f"{row['minutes']:.1f} against {row['scratch_minutes']:.1f}", flush=True)
        middle = stats.median_seed(mine, lambda r: r["cer_gain"])
        verdict = stats.verdict(stats.Estimate(middle["cer_gain"], *middle["cer_gain_ci"]),
                                lower="speech pretraining HIGHER", higher="speech pretraining lower")
        print(f"  {minutes:g} min: median dev CER gain {middle['cer_gain']:+.1%}: {verdict}", flush=True)
        rows += mine
    return rows


def choose_best(bench, seeds):
    """``best+lm``: the pool arm of lowest median dev WER over the seeds; prints the dev figures."""
    dev = {arm: statistics.median(stats.error_rate(bench.decode(bench.model(ARMS[arm][0], seed), "valid", True)).value
                                  for seed in seeds) for arm in POOL_ARMS}
    best = min(dev, key=dev.get)
    print("best+lm chosen on dev (median WER % over subsets): " +
          ", ".join(f"{arm} {wer:.2f}" for arm, wer in dev.items()) + f" -> {best}", flush=True)
    return best, dev


def seed_rows(bench, arms, seed, splits, best):
    """The rows of one seed: arm, split, WER and interval, gain against scratch+lm and interval, minutes."""
    rows = []
    reference = bench.model("scratch", seed)
    for split in splits:
        baseline = bench.decode(reference, split, True)
        for arm in arms:
            name, with_lm = ARMS[best if arm == "best+lm" else arm]
            model = bench.model(name, seed)
            scored = bench.decode(model, split, with_lm)
            wer, gain = stats.error_rate(scored), stats.relative_gain(scored, baseline)
            rows.append({"arm": arm, "split": split, "seed": seed, "wer": round(wer.value, 2),
                         "wer_ci": [round(wer.low, 2), round(wer.high, 2)], "gain_vs_scratch_lm": round(gain.value, 4),
                         "gain_ci": gain.as_list(), "minutes": round(bench.minutes(model, with_lm), 1)})
    return rows


def median_rows(rows, arms, splits):
    """Per arm and split, the median over seeds of WER and gain, each with the interval of the seed whose
    figure is that median (the lower middle one for an even count), and the median minutes."""
    merged = []
    for split in splits:
        for arm in arms:
            mine = [r for r in rows if r["arm"] == arm and r["split"] == split]
            by_wer = stats.median_seed(mine, lambda r: r["wer"])
            by_gain = stats.median_seed(mine, lambda r: r["gain_vs_scratch_lm"])
            merged.append({"arm": arm, "split": split, "wer": stats.median_over_seeds([r["wer"] for r in mine])[0],
                           "wer_ci": by_wer["wer_ci"],
                           "gain_vs_scratch_lm": stats.median_over_seeds([r["gain_vs_scratch_lm"] for r in mine])[0],
                           "gain_ci": by_gain["gain_ci"],
                           "minutes": stats.median_over_seeds([r["minutes"] for r in mine])[0]})
    return merged


def equal_minutes_gains(bench, seeds, splits):
    """Per split and subset, joint+lm's relative WER gain against scratch_equal_minutes+lm (the same
    minutes, spent on finetuning instead of pretraining), with its paired interval; then the median."""
    rows = []
    for split in splits:
        mine = []
        for seed in seeds:
            scratch = bench.decode(bench.model("scratch_equal_minutes", seed), split, True)
            gain = stats.relative_gain(bench.decode(bench.model("joint", seed), split, True), scratch)
            mine.append({"split": split, "seed": seed, "gain": round(gain.value, 4), "gain_ci": gain.as_list()})
        middle = stats.median_seed(mine, lambda r: r["gain"])
        rows += mine
        verdict = stats.verdict(stats.Estimate(middle["gain"], *middle["gain_ci"]), lower="joint+lm HIGHER",
                                higher="joint+lm lower")  # a gain above 0 is fewer errors
        print(f"joint+lm against scratch_equal_minutes+lm on {split}: " + ", ".join(
            f"{r['seed']} {r['gain']:+.1%} [{r['gain_ci'][0]:+.1%}, {r['gain_ci'][1]:+.1%}]" for r in mine)
              + f"; median {middle['gain']:+.1%}: {verdict}", flush=True)
    return rows


def format_table(rows, title):
    """One line per arm and split: WER [interval], gain vs scratch+lm [interval], minutes."""
    lines = [title, f"{'arm':<26}{'split':<13}{'WER % [95 % CI]':>24}{'gain vs scratch+lm [95 % CI]':>32}"
                    f"{'minutes':>9}"]
    for r in rows:
        wer = f"{r['wer']:.2f} [{r['wer_ci'][0]:.2f}, {r['wer_ci'][1]:.2f}]"
        gain = ("—" if r["arm"] == REFERENCE else
                f"{r['gain_vs_scratch_lm']:+.1%} [{r['gain_ci'][0]:+.1%}, {r['gain_ci'][1]:+.1%}]")
        lines.append(f"{r['arm']:<26}{r['split']:<13}{wer:>24}{gain:>32}{r['minutes']:>9.1f}")
    return "\n".join(lines)


def gain_text(row):
    """'12.3 % [4.0, 20.1]': a row's relative gain and its interval, in %."""
    return f"{row['gain_vs_scratch_lm']:.1%} [{row['gain_ci'][0]:.1%}, {row['gain_ci'][1]:.1%}]"


def goals(rows, tests):
    """The goals that the finished arms can answer, each met or not (intervals included)."""
    found = {(r["arm"], r["split"]): r for r in rows}
    lines = []
    for split in tests:
        joint = found.get(("joint+lm", split))
        if joint:
            met = joint["gain_vs_scratch_lm"] >= 0.10 and joint["gain_ci"][0] > 0
            lines.append(f"joint+lm >= 10 % lower WER than scratch+lm on {split}, interval above 0: "
                         f"{gain_text(joint)}: {'met' if met else 'NOT met'}")
        speech, equal = found.get(("speech", split)), found.get(("scratch_equal_minutes", split))
        if speech and equal:
            lines.append(f"speech pretraining vs scratch at equal minutes on {split}: {speech['wer']:.2f} against "
                         f"{equal['wer']:.2f} %: {'met' if speech['wer'] < equal['wer'] else 'NOT met'}")
        best, ceiling = found.get(("best+lm", split)), found.get(("all_labels+lm", split))
        if best and ceiling:
            lines.append(f"best+lm within 1.3x all_labels+lm on {split}: {best['wer']:.2f} against 1.3 x "
                         f"{ceiling['wer']:.2f} %: {'met' if best['wer'] <= 1.3 * ceiling['wer'] else 'NOT met'}")
    for arm in NEW_VOICE_ARMS:
        voices = found.get((arm, "test_unseen"))
        if voices:
            met = voices["gain_vs_scratch_lm"] >= 0.25
            lines.append(f"{arm} >= 25 % lower WER than scratch+lm on test_unseen: "
                         f"{gain_text(voices)}: {'met' if met else 'NOT met'}")
    return lines


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    data = prepare(args)
    bench, seeds = Bench(args, data), subset_seeds(args)
    arms = available_arms(args, data)
    train_all(bench, arms, seeds)
    for seed in seeds:  # the curve's finetunes, after the table's
        for minutes in args.speech_curve:
            bench.model(curve_model(args, minutes), seed)
    curve = speech_curve(bench, seeds) if args.speech_curve else []
    best, dev = choose_best(bench, seeds) if "best+lm" in arms else (None, {})
    rows = []  # the test splits are decoded only now, after every choice made on dev
    for seed in seeds:
        rows += seed_rows(bench, arms, seed, data.tests, best)
        print(format_table([r for r in rows if r["seed"] == seed], f"\nsubset seed {seed} "
                           f"({args.labelled_share:.0%} of train labelled):"), flush=True)
    merged = median_rows(rows, arms, data.tests)
    if len(seeds) > 1:
        print(format_table(merged, f"\nmedian of {len(seeds)} subsets (intervals: the median subset's):"))
    for line in goals(merged, data.tests):
        print(line)
    equal = (equal_minutes_gains(bench, seeds, data.tests)
             if {"joint+lm", "scratch_equal_minutes+lm"} <= set(arms) else [])
    if args.json:
        print(json.dumps({"arms": merged, "per_seed": rows, "best": best, "best_dev_wer": dev,
                          "pretrained_parts_dev": bench.choices, "joint_vs_equal_minutes": equal,
                          "speech_curve": curve,
                          "seeds": seeds, "labelled_share": args.labelled_share}))


if __name__ == "__main__":
    main()
