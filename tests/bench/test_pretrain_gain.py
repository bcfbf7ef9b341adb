"""bench/pretrain_gain.py end to end on a tiny espeak corpus: the JSON line the checks read, and a second
invocation that reuses every finished arm instead of training or decoding again."""

import json
import os
import shlex
import subprocess
import sys

import pytest
import yaml

from bench import pretrain_gain
from bench.open_corpus import Data
from bench.pretrain_gain import NO_SPEED_PERTURB, Bench, Model, parse_args
from tests.recipes.finetune_args import REPO, TINY
from tests.recipes.test_lm import TINY_LM
from tests.recipes.test_pretrain import TINY as TINY_PRETRAIN

ROW_KEYS = {"arm", "split", "wer", "wer_ci", "gain_vs_scratch_lm", "gain_ci", "minutes"}


def tiny_corpus(speech_corpus, folder):
    """The session's espeak corpus as the bench reads a corpus: its manifests, test as test_seen, and as
    lm_text.txt the training transcripts with each also word-reversed (the bench drops the former; no
    new voices)."""
    os.makedirs(folder)
    os.symlink(speech_corpus / "wav", folder / "wav")
    for source, name in (("train", "train"), ("dev", "dev"), ("test", "test_seen")):
        (folder / f"{name}.jsonl").write_text((speech_corpus / f"{source}.jsonl").read_text())
    texts = [json.loads(line)["text"] for line in open(speech_corpus / "train.jsonl")]
    (folder / "lm_text.txt").write_text("\n".join(texts + [" ".join(t.split()[::-1]) for t in texts]) + "\n")
    return folder


def bench(corpus, exp):
    """Run the bench's default arms with tiny models and one-epoch budgets; returns its stdout."""
    command = [sys.executable, "bench/pretrain_gain.py", "--corpus", str(corpus), "--exp", str(exp), "--json",
               "--labelled-share", "0.25", "--pretrain-minutes", "0.01", "--finetune-minutes", "0.01",
               "--lm-beam", "2", f"--finetune-overrides={shlex.join(TINY)}",
               f"--pretrain-overrides={shlex.join(TINY_PRETRAIN + ['--bestrq_codebook_size=32'])}",
               f"--lm-overrides={shlex.join(TINY_LM)}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout


def test_the_bench_prints_every_arm_with_intervals_and_reuses_finished_arms(speech_corpus, tmp_path):
    """The default arms (scratch+lm, joint+lm) end in one JSON line of rows with the interface's keys, the
    reference's gain 0, intervals around each figure and the minutes spent; joint's pretrained parts
    are chosen on dev between its two finetunes; a second run trains and
    decodes nothing (every step and hypothesis file is reused) and prints the same figures."""
    corpus = tiny_corpus(speech_corpus, tmp_path / "corpus")
    first = bench(corpus, tmp_path / "exp")
    rows = json.loads(first.strip().splitlines()[-1])["arms"]
    assert [(r["arm"], r["split"]) for r in rows] == [("scratch+lm", "test_seen"), ("joint+lm", "test_seen")]
    for row in rows:
        assert set(row) == ROW_KEYS
        assert row["wer_ci"][0] <= row["wer"] <= row["wer_ci"][1]
        assert row["gain_ci"][0] <= row["gain_vs_scratch_lm"] <= row["gain_ci"][1]
    assert rows[0]["gain_vs_scratch_lm"] == 0.0
    assert rows[1]["minutes"] > rows[0]["minutes"] > 0  # joint+lm also spent the pretraining's minutes
    assert "new_voices" not in first  # only the requested arms are mentioned
    choice = json.loads(first.strip().splitlines()[-1])["pretrained_parts_dev"]["seed1234/joint"]
    assert set(choice) == {"all", "decoder", "chosen"}  # both candidates finetuned, the lower dev CER kept
    assert choice["chosen"] == min(("all", "decoder"), key=lambda parts: choice[parts]["cer"])
    assert "pretrained parts chosen on dev" in first
    second = bench(corpus, tmp_path / "exp")
    assert "+ " not in "".join(line[:2] for line in second.splitlines())  # no command was run again
    assert "decoded" not in second and second.count("reused") == 5  # LM, pretraining, three finetunes
    assert json.loads(second.strip().splitlines()[-1])["arms"] == rows


def test_the_default_finetune_override_reaches_train_py_as_a_mapping():
    """The default --finetune-overrides, split into words as the bench splits them, is one override whose
    value reads as {speed_perturb: None} (without the shell quotes, YAML read a key "speed_perturb:null")."""
    (word,) = shlex.split(NO_SPEED_PERTURB)
    key, value = word.split("=", 1)
    assert key == "--train_loader" and yaml.safe_load(value) == {"speed_perturb": None}


def test_subsets_are_drawn_from_the_first_seed_on():
    """--seeds N draws seeds 1234, 1235, ...; --first-seed moves the start, so one later subset can be
    trained alone into the folder (seed1235/...) the full run would use."""
    assert pretrain_gain.subset_seeds(parse_args(["--seeds", "3"])) == [1234, 1235, 1236]
    assert pretrain_gain.subset_seeds(parse_args(["--seeds", "1", "--first-seed", "1235"])) == [1235]


def test_scratch_at_equal_minutes_is_charged_what_joint_lm_spent(monkeypatch, tmp_path):
    """scratch_equal_minutes finetunes for every minute the joint arm spent before its LM (pretraining and
    both parts candidates) less scratch's own start-up and dev pass, so with the LM both arms are
    charged the same minutes; the labelled subset is the seed's, as scratch's."""
    monkeypatch.setattr(pretrain_gain, "labelled_subset", lambda shards, share, seed: (f"labelled{seed}", "pool"))
    bench = Bench(parse_args(["--exp", str(tmp_path), "--finetune-minutes", "9"]), Data({"train": "t"}, [], "", "", ""))
    bench.done["lm"] = 7.1
    bench.models["scratch", 1234] = Model("scratch", {"seed1234/scratch": 9.2})
    bench.models["joint", 1234] = Model("joint", {"pretrain_joint": 7.1, "seed1234/joint": 9.2,
                                                  "seed1234/joint_decoder": 9.1})
    asked = []

    def finetune(name, parquets, minutes, init=None, parts=None):
        asked.append((name, parquets, minutes, init))
        bench.done[name] = minutes + 0.2  # the start-up and dev pass scratch also spent
        return name

    monkeypatch.setattr(bench, "finetune", finetune)
    equal = bench.model("scratch_equal_minutes", 1234)
    assert asked == [("seed1234/scratch_equal_minutes", ["labelled1234"], pytest.approx(25.2), None)]
    assert bench.minutes(equal, True) == pytest.approx(bench.minutes(bench.models["joint", 1234], True))
    assert bench.minutes(equal, True) > bench.minutes(bench.models["scratch", 1234], True) + 16


def test_upstream_exp_holds_the_lm_and_pretraining_and_exp_the_finetunes(monkeypatch, tmp_path):
    """With --upstream-exp, the LM and the pretraining are read from (or trained into) that folder while
    every finetune goes to --exp, so a bench that changes only finetune overrides reuses them; without it
    all of them live in --exp."""
    monkeypatch.setattr(pretrain_gain, "labelled_subset", lambda shards, share, seed: (f"labelled{seed}", "pool"))
    monkeypatch.setattr(pretrain_gain, "dev_figures", lambda folder: {"cer": 30.0, "wer": 70.0})
    steps = []
    monkeypatch.setattr(pretrain_gain, "step", lambda folder, command: steps.append(folder) or 7.0)
    data = Data({"train": "t", "valid": "v"}, [], "", "", "")
    for argv, upstream in (([], tmp_path / "new"), (["--upstream-exp", str(tmp_path / "old")], tmp_path / "old")):
        steps.clear()
        bench = Bench(parse_args(["--exp", str(tmp_path / "new"), "--pretrained-parts", "all", *argv]), data)
        bench.lm()
        bench.model("joint", 1234)
        assert steps == [str(upstream / "lm"), str(upstream / "pretrain_joint"),
                         str(tmp_path / "new" / "seed1234" / "joint")]


def test_speech_curve_pretrains_once_per_budget_and_scores_dev_against_scratch(monkeypatch, tmp_path):
    """--speech-curve 7,15: one speech-only pretraining per budget (7 is the speech arm's own, 15 a folder
    of its own, each with its --train_minutes), each finetuned as the speech arm; its rows are the paired
    dev gains over scratch from the finetunes' greedy dev hypotheses, with every minute charged."""
    monkeypatch.setattr(pretrain_gain, "labelled_subset", lambda shards, share, seed: (f"labelled{seed}", "pool"))
    refs = [f"a{i} b{i} c{i} d{i}" for i in range(40)]
    errors = {"scratch": 2, "speech": 3, "speech_15min": 1}  # wrong words per utterance on dev
    pretrainings = []

    def step(folder, command):
        minutes = float(next(w for w in command if w.startswith("--train_minutes=")).split("=")[1])
        os.makedirs(folder, exist_ok=True)
        if "recipes/pretrain/train.py" in command:
            pretrainings.append((os.path.basename(folder), minutes))
        else:
            wrong = errors[os.path.basename(folder)]
            lines = [{"key": f"u{i}", "ref": ref, "hyp": " ".join(["x"] * wrong + ref.split()[wrong:])}
                     for i, ref in enumerate(refs)]
            with open(os.path.join(folder, "hyp_valid_ctc_greedy.jsonl"), "w") as f:
                f.writelines(json.dumps(line) + "\n" for line in lines)
            with open(os.path.join(folder, "results.json"), "w") as f:
                json.dump({"valid": {"wer": 25.0 * wrong, "cer": 20.0 * wrong}}, f)
        return minutes + 0.2

    monkeypatch.setattr(pretrain_gain, "step", step)
    args = parse_args(["--exp", str(tmp_path), "--pretrained-parts", "all", "--speech-curve", "15,7"])
    bench = Bench(args, Data({"train": "t", "valid": "v"}, [], "", "", ""))
    for minutes in args.speech_curve:
        bench.model(pretrain_gain.curve_model(args, minutes), 1234)
    rows = pretrain_gain.speech_curve(bench, [1234])
    assert pretrainings == [("pretrain_speech", 7.0), ("pretrain_speech_15min", 15.0)]
    assert bench.models["speech", 1234].folder == str(tmp_path / "seed1234" / "speech")
    by_budget = {row["pretrain_minutes"]: row for row in rows}
    assert by_budget[7.0]["wer_gain"] == pytest.approx(1 - 3 / 2) and by_budget[7.0]["wer_gain_ci"][1] < 0
    assert by_budget[15.0]["wer_gain"] == pytest.approx(1 - 1 / 2) and by_budget[15.0]["cer_gain_ci"][0] > 0
    assert by_budget[15.0]["minutes"] == pytest.approx(15.2 + 9.2)
    assert by_budget[15.0]["scratch_minutes"] == pytest.approx(9.2)
    with pytest.raises(SystemExit, match="--speech-curve"):
        parse_args(["--speech-curve", "7,fifteen"])


def test_each_parts_candidate_is_a_finetune_of_its_own_with_its_overrides(monkeypatch, tmp_path):
    """--pretrained-parts all,decoder,lower2,slow_encoder,frozen_start: five finetunes from the same
    pretraining, in folders of their own, told apart by their overrides only (the decoder candidate's
    words as G1-G6 recorded them, so their folders are reused); the lowest dev CER is kept and every
    candidate charged."""
    monkeypatch.setattr(pretrain_gain, "labelled_subset", lambda shards, share, seed: (f"labelled{seed}", "pool"))
    cer = {"joint": 33.0, "joint_decoder": 32.0, "joint_lower2": 31.5, "joint_slow_encoder": 31.0,
           "joint_frozen_start": 32.5}
    monkeypatch.setattr(pretrain_gain, "dev_figures", lambda folder: {"cer": cer[os.path.basename(folder)],
                                                                     "wer": 70.0})
    commands = {}
    monkeypatch.setattr(pretrain_gain, "step", lambda folder, command: commands.setdefault(folder, command) and 9.0)
    bench = Bench(parse_args(["--exp", str(tmp_path), "--pretrained-parts",
                              "all,decoder,lower2,slow_encoder,frozen_start"]),
                  Data({"train": "t", "valid": "v"}, [], "", "", ""))
    model = bench.model("joint", 1234)
    finetunes = {os.path.basename(f): c for f, c in commands.items() if "recipes/finetune/train.py" in c}
    keys = ("--pretrained_parts", "--pretrained_encoder_layers", "--lr_scales", "--freeze_encoder_steps")
    tails = {name: [w for w in command if w.startswith(keys)] for name, command in finetunes.items()}
    assert tails == {"joint": [], "joint_decoder": ["--pretrained_parts=[cross_attention, language_model]"],
                     "joint_lower2": ["--pretrained_encoder_layers=2"],
                     "joint_slow_encoder": ["--lr_scales={encoder: 0.3}"],
                     "joint_frozen_start": ["--freeze_encoder_steps=400"]}
    assert all(any(w.startswith("--pretrained=") for w in command) for command in finetunes.values())
    assert model.folder == str(tmp_path / "seed1234" / "joint_slow_encoder")
    assert bench.minutes(model, False) == pytest.approx(6 * 9.0)  # the pretraining and five finetunes
    assert bench.choices["seed1234/joint"]["chosen"] == "slow_encoder"


TARGET_KEYS = ("--speech_targets", "--units_dirs", "--valid_units_dir")


def test_units_targets_pretrain_per_subset_on_the_scratch_finetunes_units_and_charge_them(monkeypatch, tmp_path):
    """--speech-targets units: the subset's scratch finetune is trained first, local/extract_units.py
    clusters its --units-layer on train (fit) and applies that k-means to dev, and the speech
    pretraining of that subset (a folder of its own, ending _units) predicts those units; its finetune
    is charged the scratch finetune, both extractions, the pretraining and itself. Text pretraining
    keeps the shared folder and the config's targets. A second bench builds the same commands (its
    steps are reused); a layer below 1 is refused before anything trains."""
    monkeypatch.setattr(pretrain_gain, "labelled_subset", lambda shards, share, seed: (f"labelled{seed}", "pool"))
    monkeypatch.setattr(pretrain_gain, "dev_figures", lambda folder: {"cer": 30.0, "wer": 70.0})
    commands = {}

    def step(folder, command):  # each step's minutes tell which steps were charged: 1, 2, 4, 8, 16, ...
        commands.setdefault(folder, command)
        return 2.0 ** list(commands).index(folder)

    monkeypatch.setattr(pretrain_gain, "step", step)
    argv = ["--exp", str(tmp_path), "--pretrained-parts", "all", "--speech-targets", "units", "--units-layer", "3",
            "--units-clusters", "50"]
    data = Data({"train": "shards/train", "valid": "shards/valid"}, [], "text", "", "tok")
    bench = Bench(parse_args(argv), data)
    model = bench.model("speech", 1234)
    seed_dir = tmp_path / "seed1234"
    units = seed_dir / "units_layer3_k50"
    assert list(commands) == [str(seed_dir / "scratch"), str(units / "train"), str(units / "valid"),
                              str(seed_dir / "pretrain_speech_units"), str(seed_dir / "speech_units")]
    fit, apply = commands[str(units / "train")], commands[str(units / "valid")]
    assert fit[1:] == ["local/extract_units.py", "shards/train", str(units / "train"), "--features",
                       f"{seed_dir / 'scratch'}:3", "--n-units", "50"]
    assert apply[-2:] == ["--kmeans", str(units / "train" / "kmeans.json")] and "shards/valid" in apply
    pretraining = commands[str(seed_dir / "pretrain_speech_units")]
    assert ["--speech_targets=kmeans", f"--units_dirs=[{units / 'train'}]",
            f"--valid_units_dir={units / 'valid'}"] == [w for w in pretraining if w.startswith(TARGET_KEYS)]
    assert model.folder == str(seed_dir / "speech_units")
    assert bench.minutes(model, False) == 1 + 2 + 4 + 8 + 16  # scratch, 2 extractions, pretraining, finetune
    first = dict(commands)
    commands.clear()
    Bench(parse_args(argv), data).model("speech", 1234)
    assert commands == first
    with pytest.raises(SystemExit, match="--units-layer 0"):
        parse_args([*argv, "--units-layer", "0"])
    bench.model("text", 1234)
    text = commands[str(tmp_path / "pretrain_text")]
    assert not [w for w in text if w.startswith(TARGET_KEYS)]
    assert str(seed_dir / "text") in commands
