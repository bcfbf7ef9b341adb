"""common/checkpoints.py: a checkpoint whose save is interrupted is never recovered."""

import pytest
import torch
from speechbrain.utils.checkpoints import Checkpointer, mark_as_loader, mark_as_saver, register_checkpoint_hooks

from common.checkpoints import AtomicCheckpointer


@register_checkpoint_hooks
class Crashing:
    """A recoverable whose save can be made to fail half-way through a checkpoint (like a kill -9)."""

    crash = False

    @mark_as_saver
    def save(self, path):
        if self.crash:
            raise KeyboardInterrupt("killed while saving")
        path.write_text("ok")

    @mark_as_loader
    def load(self, path, end_of_epoch=False):
        assert path.read_text() == "ok"


def save_then_interrupt(checkpointer_class, folder):
    """Save a complete checkpoint of a model at value 1, then an interrupted one at value 2; return a
    fresh model recovered by a new checkpointer of the class (as a rerun would)."""
    model, crashing = torch.nn.Linear(2, 2), Crashing()
    checkpointer = checkpointer_class(folder, recoverables={"model": model, "crashing": crashing})
    torch.nn.init.constant_(model.weight, 1.0)
    checkpointer.save_checkpoint(meta={"step": 1})
    torch.nn.init.constant_(model.weight, 2.0)
    crashing.crash = True
    with pytest.raises(KeyboardInterrupt):
        checkpointer.save_checkpoint(meta={"step": 2})
    rerun_model = torch.nn.Linear(2, 2)
    rerun = checkpointer_class(folder, recoverables={"model": rerun_model, "crashing": Crashing()})
    return rerun, rerun.recover_if_possible(), rerun_model


def test_a_rerun_recovers_the_last_complete_checkpoint_and_removes_the_interrupted_one(tmp_path):
    """Killed between the model's file and the other files of checkpoint 2, the rerun loads
    checkpoint 1 (weights 1) and deletes checkpoint 2's folder."""
    rerun, checkpoint, model = save_then_interrupt(AtomicCheckpointer, tmp_path)
    assert checkpoint.meta["step"] == 1 and torch.all(model.weight == 1.0)
    assert len(list(tmp_path.iterdir())) == 1 and len(rerun.list_checkpoints()) == 1


def test_speechbrains_checkpointer_would_pick_the_interrupted_checkpoint(tmp_path):
    """The failure this module prevents: plain SpeechBrain takes the incomplete checkpoint 2 as the
    latest and cannot load it."""
    with pytest.raises((KeyError, RuntimeError, FileNotFoundError, AssertionError)):
        save_then_interrupt(Checkpointer, tmp_path)


def test_completed_saves_publish_their_meta_file(tmp_path):
    """A completed save leaves CKPT.yaml (no pending file) and is recovered with its meta."""
    model = torch.nn.Linear(2, 2)
    checkpointer = AtomicCheckpointer(tmp_path, recoverables={"model": model})
    saved = checkpointer.save_and_keep_only(meta={"WER": 3.0}, min_keys=["WER"])
    folder = checkpointer.list_checkpoints()[0].path
    assert sorted(p.name for p in folder.iterdir()) == ["CKPT.yaml", "model.ckpt"]
    assert saved is None or saved.path == folder
    assert AtomicCheckpointer(tmp_path, recoverables={"model": model}).recover_if_possible().meta["WER"] == 3.0


def test_a_recovered_random_state_draws_what_the_saved_run_drew_next(tmp_path):
    """RandomState: after a checkpoint, the draws of torch, numpy and Python an uninterrupted process
    makes next are the draws a recovered one makes once restore_pending() runs, however many numbers
    were drawn between the recovery and the restore; restore_pending() restores only once."""
    import random

    import numpy as np

    from common.checkpoints import RandomState

    def draws():
        return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]

    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    saved = RandomState()
    AtomicCheckpointer(tmp_path, {"random_state": saved}).save_checkpoint()
    uninterrupted = draws()
    resumed = RandomState()
    AtomicCheckpointer(tmp_path, {"random_state": resumed}).recover_if_possible()
    draws()  # what a run draws between recovery and its first batch
    resumed.restore_pending()
    assert draws() == uninterrupted
    resumed.restore_pending()
    assert draws() != uninterrupted
