"""Tests for common/recipe.py: config mistakes are caught before any work, with the fix named,
and the experiment folder records what ran."""

import os
import subprocess

import pytest

from common.process_lock import acquire_process_lock
from common.recipe import ConfigError, last_override_wins, load_checked_hparams, prepare_experiment

CONFIG = """\
output_folder: !ref <exp_root>/demo
exp_root: !PLACEHOLDER
max_batch_seconds: 120.0
num_epochs: 10
sort_by_duration: True
graph: !include:graph.yaml
    d_model: 8
"""
GRAPH = "d_model: 4\nnum_layers: 2\n"


@pytest.fixture
def config(tmp_path):
    """A recipe config with a placeholder, typed scalars and an !include:, in tmp_path."""
    (tmp_path / "graph.yaml").write_text(GRAPH)
    path = tmp_path / "train.yaml"
    path.write_text(CONFIG)
    return str(path)


def test_valid_overrides_load_and_reach_the_included_graph(config, tmp_path):
    """Overrides replace values; the include receives its parameters."""
    hparams = load_checked_hparams(config, f"exp_root: {tmp_path}\nnum_epochs: 3")
    assert hparams["num_epochs"] == 3
    assert hparams["graph"]["d_model"] == 8
    assert hparams["output_folder"] == f"{tmp_path}/demo"


def test_mistyped_override_names_the_closest_valid_key(config):
    """--max_batch_secnds is refused and max_batch_seconds suggested."""
    with pytest.raises(ConfigError, match='"max_batch_secnds".*Did you mean "max_batch_seconds"'):
        load_checked_hparams(config, "exp_root: x\nmax_batch_secnds: 60")


def test_missing_placeholder_names_the_key_to_set(config):
    """An unset !PLACEHOLDER says which --key to pass."""
    with pytest.raises(ConfigError, match="exp_root is a !PLACEHOLDER.*--exp_root="):
        load_checked_hparams(config, "")


@pytest.mark.parametrize("override, expected", [
    ("max_batch_seconds: abc", "'abc' is of type str.*120.0 is of type float"),
    ("num_epochs: 2.5", "2.5 is of type float.*10 is of type int"),
    ("sort_by_duration: 1", "1 is of type int.*True is of type bool"),
])
def test_override_of_the_wrong_type_is_reported(config, override, expected):
    """A value that cannot stand where the config has a number or bool is refused."""
    with pytest.raises(ConfigError, match=expected):
        load_checked_hparams(config, f"exp_root: x\n{override}")


def test_misspelled_include_parameter_names_the_closest_key(config, tmp_path):
    """HyperPyYAML would silently ignore d_modle under the !include:; we refuse it."""
    (tmp_path / "train.yaml").write_text(CONFIG.replace("    d_model: 8", "    d_modle: 8"))
    with pytest.raises(ConfigError, match='"d_modle".*graph.yaml.*Did you mean "d_model"'):
        load_checked_hparams(config, "exp_root: x")


def test_prepare_experiment_writes_config_and_command_line(config, tmp_path):
    """The folder holds the resolved hyperparams.yaml, the command, log.txt and the lock."""
    hparams, run_opts = prepare_experiment(
        [config, f"--exp_root={tmp_path}", "--num_epochs=2", "--device=cpu"])
    folder = tmp_path / "demo"
    assert run_opts["device"] == "cpu"
    assert "num_epochs: 2" in (folder / "hyperparams.yaml").read_text()
    assert "--num_epochs=2" in (folder / "command.txt").read_text()
    assert (folder / "log.txt").exists()
    assert (folder / "run.lock").read_text() == str(os.getpid())


def test_run_lock_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path):
    """A lock held by a running process blocks; one left by a finished process does not."""
    live = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "run.lock").write_text(str(live.pid))
        with pytest.raises(RuntimeError, match=f"in use by process {live.pid}"):
            acquire_process_lock(str(tmp_path))
    finally:
        live.kill()
        live.wait()
    acquire_process_lock(str(tmp_path))
    assert (tmp_path / "run.lock").read_text() == str(os.getpid())


def test_derived_config_changes_only_its_keys_and_the_command_line_wins(config, tmp_path):
    """A base_config file lists only what differs; !ref in it resolves against the base; a key the
    base lacks is refused with the closest one; prepare_experiment saves the merged config."""
    derived = tmp_path / "small.yaml"
    derived.write_text("base_config: train.yaml\nnum_epochs: 4\nmax_batch_seconds: !ref <num_epochs> * 10\n")
    hparams = load_checked_hparams(str(derived), f"exp_root: {tmp_path}\nnum_epochs: 5")
    assert (hparams["num_epochs"], hparams["max_batch_seconds"], hparams["graph"]["d_model"]) == (5, 50, 8)
    hparams, _ = prepare_experiment([str(derived), f"--exp_root={tmp_path}"])
    assert "max_batch_seconds: 40" in (tmp_path / "demo" / "hyperparams.yaml").read_text()
    derived.write_text("base_config: train.yaml\nnum_epoch: 4\n")
    with pytest.raises(ConfigError, match='"num_epoch".*base of.*Did you mean "num_epochs"'):
        load_checked_hparams(str(derived), "exp_root: x")


def test_a_repeated_override_is_replaced_by_the_last_one():
    """run.sh passes some overrides itself; the user's later --key=value wins instead of failing as a
    duplicate yaml key. Options given as two words are left alone."""
    argv = ["h.yaml", "--do_test=False", "--device", "cpu", "--lr=1", "--do_test=True"]
    assert last_override_wins(argv) == ["h.yaml", "--device", "cpu", "--lr=1", "--do_test=True"]


def test_model_size_file_stands_in_its_place_in_root_and_derived_configs(tmp_path):
    """A size file's keys are the config's keys at the place of ``model_size`` (the graph receives them
    by !ref, the saved config holds them); a derived config naming another size replaces them all; a
    config restating a size key beside its size file is refused (a size is written once)."""
    (tmp_path / "graph.yaml").write_text(GRAPH)
    (tmp_path / "big.yaml").write_text("d_model: 16\nnum_layers: 3\n")
    (tmp_path / "tiny.yaml").write_text("d_model: 4\nnum_layers: 1\n")
    root = tmp_path / "train.yaml"
    root.write_text(f"exp_root: {tmp_path}\noutput_folder: !ref <exp_root>/run\nmodel_size: big.yaml\n"
                    "graph: !include:graph.yaml\n    d_model: !ref <d_model>\n    num_layers: !ref <num_layers>\n")
    hparams, _ = prepare_experiment([str(root)])
    assert (hparams["d_model"], hparams["graph"]["num_layers"]) == (16, 3)
    saved = (tmp_path / "run" / "hyperparams.yaml").read_text()
    assert "d_model: 16" in saved and "model_size:" not in saved
    derived = tmp_path / "small.yaml"
    derived.write_text("base_config: train.yaml\nmodel_size: tiny.yaml\n")
    hparams = load_checked_hparams(str(derived), {"num_layers": 2})
    assert (hparams["graph"]["d_model"], hparams["graph"]["num_layers"]) == (4, 2)
    derived.write_text("base_config: train.yaml\nmodel_size: tiny.yaml\nd_model: 8\n")
    with pytest.raises(ConfigError, match="sets d_model beside model_size"):
        load_checked_hparams(str(derived))


@pytest.mark.parametrize("size", ["conformer", "small", "demo"])
def test_pretraining_and_finetuning_of_one_size_read_one_size_file(size):
    """recipes/pretrain/hparams/X.yaml and recipes/finetune/hparams/X.yaml resolve to the same model
    size, both from recipes/hparams/model/sizes/X.yaml: finetuning loads the pretrained weights by name."""
    from common.recipe import read_yaml_tree, resolve_derived_config

    sizes = read_yaml_tree(f"recipes/hparams/model/sizes/{size}.yaml")
    for recipe in ("pretrain", "finetune"):
        base, overrides = resolve_derived_config(f"recipes/{recipe}/hparams/{size}.yaml")
        tree = {**read_yaml_tree(base), **overrides}
        assert {key: tree[key] for key in sizes} == dict(sizes), recipe
