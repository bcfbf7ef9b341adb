"""common/fingerprint.py: lock.json records the inputs; a resume on changed training inputs stops."""

import json
import logging

import pytest

from common.fingerprint import ChangedInputs, check_and_write_lock, config_settings, make_lock, pop_force_flag
from common.recipe import preview_config


def lock_of(tmp_path, world_size=1, **files):
    """A lock over files written with the given contents (key -> text)."""
    hparams = {}
    for key, text in files.items():
        path = tmp_path / f"{key}.bin"
        path.write_text(text)
        hparams[key] = str(path)
    return make_lock(hparams, list(files), world_size, 0, "x.yaml")


def test_a_changed_training_input_stops_a_resume_and_names_it(tmp_path, caplog):
    """Same inputs resume; a changed tokenizer under checkpoints raises, naming the key and path, and
    leaves lock.json as it was; --force_resume lets it continue with a warning; without checkpoints
    (a fresh folder) nothing is compared; a changed test set never stops a run."""
    folder = tmp_path / "exp"
    folder.mkdir()
    check_and_write_lock(folder, lock_of(tmp_path, tokenizer_file="a", test_parquets="t"), has_checkpoints=False)
    first = (folder / "lock.json").read_text()
    check_and_write_lock(folder, lock_of(tmp_path, tokenizer_file="a", test_parquets="t"), has_checkpoints=True)
    changed = lock_of(tmp_path, tokenizer_file="b", test_parquets="t")
    with pytest.raises(ChangedInputs, match=r"tokenizer_file: .*tokenizer_file\.bin differs"):
        check_and_write_lock(folder, changed, has_checkpoints=True)
    assert (folder / "lock.json").read_text() == first
    with caplog.at_level(logging.WARNING):
        check_and_write_lock(folder, changed, has_checkpoints=True, force=True)
    assert "continuing on changed inputs" in caplog.text
    check_and_write_lock(folder, lock_of(tmp_path, tokenizer_file="b", test_parquets="other"), has_checkpoints=True)
    assert json.loads((folder / "lock.json").read_text())["inputs"]["tokenizer_file"]["sha256"] == \
        changed["inputs"]["tokenizer_file"]["sha256"]


def test_another_world_size_is_reported_not_refused(tmp_path, caplog):
    folder = tmp_path / "exp"
    folder.mkdir()
    check_and_write_lock(folder, lock_of(tmp_path, world_size=1, train_parquet="p"), has_checkpoints=False)
    with caplog.at_level(logging.WARNING):
        check_and_write_lock(folder, lock_of(tmp_path, world_size=2, train_parquet="p"), has_checkpoints=True)
    assert "resuming with 2 ranks instead of 1" in caplog.text


def test_the_lock_records_code_packages_and_the_force_flag_is_taken_off_the_command_line(tmp_path):
    lock = lock_of(tmp_path, tokenizer_file="a")
    assert set(lock) >= {"inputs", "code", "packages", "world_size", "loader_workers"}
    assert lock["packages"]["torch"] and len(lock["inputs"]["tokenizer_file"]["sha256"]) == 64
    assert pop_force_flag(["x.yaml", "--force_resume=True", "--seed=1"]) == (["x.yaml", "--seed=1"], True)
    assert pop_force_flag(["x.yaml"]) == (["x.yaml"], False)


def test_a_resume_with_changed_settings_names_each_value_and_a_decoding_run_keeps_the_trained_ones(tmp_path, caplog):
    """The lock records the config's plain values (not the objects built from them); resuming training
    under another speed perturbation logs the key with both values; a decoding run neither warns nor
    replaces the settings the checkpoints were trained with."""
    config = tmp_path / "x.yaml"
    config.write_text("epochs: 30\nloader:\n    speed_perturb: [0.9, 1.0, 1.1]\n    filters: {max_duration: 20.0}\n"
                      "model: !new:torch.nn.Linear\n    in_features: 2\n    out_features: 2\n")
    folder = tmp_path / "exp"
    folder.mkdir()

    def lock_with(overrides, training=True, **kwargs):
        settings = config_settings(preview_config(str(config), overrides))
        check_and_write_lock(folder, make_lock({}, [], 1, 0, "x.yaml", settings), training=training, **kwargs)
        return settings

    trained = lock_with("", has_checkpoints=False)
    assert trained == {"epochs": 30, "loader.speed_perturb": [0.9, 1.0, 1.1], "loader.filters.max_duration": 20.0}
    with caplog.at_level(logging.WARNING):
        lock_with("loader: {speed_perturb: null}", training=False, has_checkpoints=True)
    assert "settings changed" not in caplog.text
    assert json.loads((folder / "lock.json").read_text())["settings"] == trained
    with caplog.at_level(logging.WARNING):
        lock_with("loader: {speed_perturb: null}", has_checkpoints=True)
    assert "loader.speed_perturb: [0.9, 1.0, 1.1] -> None" in caplog.text
    assert "epochs" not in caplog.text.split("settings changed", 1)[1]


def test_a_retrained_lm_folder_of_the_same_file_sizes_stops_a_resume_naming_the_file(tmp_path, monkeypatch):
    """A folder input is fingerprinted by its files' contents, not their names and sizes: an LM folder
    retrained into weights of the very same size stops the resume, and the error names ``lm.ckpt``. The
    per-file sha256 is cached by size and mtime: a resume over an unchanged folder reads none of its files."""
    import common.fingerprint as fingerprint

    lm = tmp_path / "lm"
    (lm / "save").mkdir(parents=True)
    (lm / "lm.ckpt").write_bytes(b"\x01" * 4096)
    (lm / "save" / "hyperparams.yaml").write_text("rnn_layers: 2\n")
    folder = tmp_path / "exp"
    folder.mkdir()
    hparams = {"language_model": str(lm)}
    check_and_write_lock(folder, make_lock(hparams, ["language_model"], 1, 0, "x.yaml"), has_checkpoints=False)
    reads = []
    monkeypatch.setattr(fingerprint, "sha256_of", lambda path, chunk=1 << 20: reads.append(path) or "x")
    resumed = make_lock(hparams, ["language_model"], 1, 0, "x.yaml", previous=fingerprint.read_lock(folder))
    assert reads == []
    check_and_write_lock(folder, resumed, has_checkpoints=True)
    monkeypatch.undo()
    (lm / "lm.ckpt").write_bytes(b"\x02" * 4096)  # retrained: the same size
    retrained = make_lock(hparams, ["language_model"], 1, 0, "x.yaml", previous=fingerprint.read_lock(folder))
    with pytest.raises(ChangedInputs, match=r"language_model: .*lm differs from the folder .*: changed lm\.ckpt\n"):
        check_and_write_lock(folder, retrained, has_checkpoints=True)


def test_a_folder_fingerprinted_by_names_and_sizes_before_is_not_refused(tmp_path):
    """An experiment whose lock predates content fingerprints (a folder's sha256 without ``files``) resumes:
    its folders are fingerprinted anew, not declared changed."""
    units = tmp_path / "units"
    units.mkdir()
    (units / "a.npy").write_bytes(b"1")
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "lock.json").write_text(json.dumps({"inputs": {"units_dirs[0]": {"path": str(units),
                                                                               "sha256": "dir:0123"}}}))
    check_and_write_lock(folder, make_lock({"units_dirs": [str(units)]}, ["units_dirs"], 1, 0, "x.yaml"),
                         has_checkpoints=True)
    assert "files" in json.loads((folder / "lock.json").read_text())["inputs"]["units_dirs[0]"]
