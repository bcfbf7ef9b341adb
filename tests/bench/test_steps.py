"""bench/steps.py: a finished training step is reused only for the command and config settings that
made it."""

import json
import shlex
import sys

import pytest

from bench import steps
from bench.steps import step


def test_a_finished_step_is_reused_only_for_the_command_that_made_it(tmp_path, capsys):
    """A step folder's record is reused when the command is the same (whatever the interpreter's path);
    with other overrides the bench stops, naming the folder and both commands, instead of charging and
    decoding a model trained otherwise."""
    folder = tmp_path / "seed1234" / "scratch"
    folder.mkdir(parents=True)
    (folder / "bench_step.json").write_text(json.dumps({"minutes": 9.2, "command": "/old/python train.py a.yaml "
                                                                                 "--train_minutes=9.0"}))
    assert step(str(folder), [sys.executable, "train.py", "a.yaml", "--train_minutes=9.0"]) == 9.2
    assert "reused" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="made by another command") as stopped:
        step(str(folder), [sys.executable, "train.py", "a.yaml", "--train_minutes=9.0", "--train_loader={}"])
    assert str(folder) in str(stopped.value) and "--train_loader" in str(stopped.value)


def test_a_finished_step_is_not_reused_once_a_setting_in_its_configs_changed(tmp_path, capsys, monkeypatch):
    """The record keeps a digest of the configs the command names, their base and model size included:
    a changed comment still reuses the step, a changed value in the base or the size file stops the
    bench, naming the folder; a record made before digests were kept is reused and says so."""
    monkeypatch.setattr(steps, "run", lambda command: 9.0)
    configs = tmp_path / "hparams"
    (configs / "sizes").mkdir(parents=True)
    (configs / "base.yaml").write_text("dropout: 0.0  # none\ninter_ctc_weight: 0.0\n")
    (configs / "sizes" / "small.yaml").write_text("d_model: 144\n")
    derived = configs / "small.yaml"
    derived.write_text("base_config: base.yaml\nmodel_size: sizes/small.yaml\nlr_peak: 0.002\n")
    folder, command = str(tmp_path / "scratch"), [sys.executable, "train.py", str(derived), "--seed=1"]
    assert step(folder, command) == 9.0
    (configs / "base.yaml").write_text("# the shipped base\ndropout: 0.0  # none, measured on dev\n\n"
                                       "inter_ctc_weight: 0.0\n")
    assert step(folder, command) == 9.0 and "reused" in capsys.readouterr().out
    for path, text in ((configs / "base.yaml", "dropout: 0.0\ninter_ctc_weight: 0.3\n"),
                       (configs / "sizes" / "small.yaml", "d_model: 256\n")):
        original = path.read_text()
        path.write_text(text)
        with pytest.raises(SystemExit, match="other settings") as stopped:
            step(folder, command)
        assert folder in str(stopped.value)
        path.write_text(original)
    record = tmp_path / "scratch" / "bench_step.json"
    record.write_text(json.dumps({"minutes": 8.0, "command": shlex.join(command)}))
    assert step(folder, command) == 8.0 and "before configs were recorded" in capsys.readouterr().out
