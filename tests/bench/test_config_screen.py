"""bench/config_screen.py end to end on the tiny espeak corpus: one change per arm against the config as
shipped, dev figures with intervals and paired gains against it, finished arms reused."""

import json
import os
import shlex
import subprocess
import sys

import pytest
import yaml

from bench.config_screen import parse_args
from tests.bench.test_pretrain_gain import tiny_corpus
from tests.recipes.finetune_args import REPO, TINY

ROW_KEYS = {"arm", "overrides", "dev_cer", "dev_cer_ci", "dev_wer", "dev_wer_ci", "cer_gain", "cer_gain_ci",
            "wer_gain", "wer_gain_ci", "updates", "minutes"}


class Untagged(yaml.SafeLoader):
    """Reads an experiment's hyperparams.yaml as plain data: its ``!apply`` / ``!new`` / ``!ref`` nodes as None."""


Untagged.add_multi_constructor("!", lambda loader, suffix, node: None)


def screen(corpus, exp):
    """Two arms against shipped with a tiny model and a budget of a few updates; returns stdout."""
    command = [sys.executable, "bench/config_screen.py", "--corpus", str(corpus), "--exp", str(exp), "--json",
               "--minutes", "0.02", f"--overrides={shlex.join(TINY)}", "--arm", "dropout=--dropout=0.1",
               "--arm", """nosp='--train_loader={"speed_perturb":null}'"""]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout


def test_each_arm_changes_one_setting_and_is_scored_on_dev_against_shipped(speech_corpus, tmp_path):
    """shipped trains first with no override; each other arm's train.py gets only its own override on
    top of the common ones (its hyperparams.yaml says so); every row has a dev CER and WER inside its
    interval and a paired gain against shipped (shipped's own: 0); a second run reuses every arm."""
    corpus = tiny_corpus(speech_corpus, tmp_path / "corpus")
    first = screen(corpus, tmp_path / "exp")
    result = json.loads(first.strip().splitlines()[-1])
    rows = result["arms"]
    assert [r["arm"] for r in rows] == ["shipped", "dropout", "nosp"]
    for row in rows:
        assert set(row) == ROW_KEYS and row["updates"] >= 1
        assert row["dev_cer_ci"][0] <= row["dev_cer"] <= row["dev_cer_ci"][1]
        assert row["cer_gain_ci"][0] <= row["cer_gain"] <= row["cer_gain_ci"][1]
    assert rows[0]["cer_gain"] == rows[0]["wer_gain"] == 0.0
    config = {arm: yaml.load(open(tmp_path / "exp" / arm / "hyperparams.yaml"), Untagged)
              for arm in ("shipped", "dropout", "nosp")}
    assert config["dropout"]["dropout"] == 0.1 != config["shipped"]["dropout"]
    assert config["nosp"]["train_loader"]["speed_perturb"] is None
    assert config["shipped"]["train_loader"]["speed_perturb"] == config["dropout"]["train_loader"]["speed_perturb"]
    assert config["dropout"]["d_model"] == config["nosp"]["d_model"] == 32  # the common overrides reach every arm
    second = screen(corpus, tmp_path / "exp")
    assert second.count("reused") == 3 and json.loads(second.strip().splitlines()[-1])["arms"] == rows


def test_an_arm_is_written_name_equals_overrides():
    """--arm needs NAME=OVERRIDES (a name of letters, digits and _: it names the arm's folder); shipped
    is always the first arm, without overrides; a name is given once; without --arm the default arms run."""
    assert list(parse_args(["--arm", "lr=--lr_peak=0.001"]).arms) == ["shipped", "lr"]
    assert list(parse_args([]).arms) == ["shipped", "nosp", "dropout", "nointerctc"]
    for wrong in ("nosp", "--dropout=0.1", "a/b=--dropout=0.1"):  # no name, or one unfit for a folder
        with pytest.raises(SystemExit, match="NAME=OVERRIDES"):
            parse_args([f"--arm={wrong}"])
    assert list(parse_args(["--arm", "shipped=", "--arm", "lr=--lr_peak=0.001"]).arms) == ["shipped", "lr"]
    for twice in (["--arm", "shipped=--dropout=0.1"], ["--arm", "lr=--lr_peak=0.001", "--arm", "lr=--lr_peak=0.002"]):
        with pytest.raises(SystemExit, match="already an arm"):  # the reference is never changed, no arm replaced
            parse_args(twice)
