"""SpeechBrain's Checkpointer, made safe against a process killed while it saves.

SpeechBrain writes a checkpoint folder's ``CKPT.yaml`` first and the parameter files after it, and
any folder holding a ``CKPT.yaml`` counts as a checkpoint. A run killed (kill -9, a preempted node,
an out-of-memory kill) between the two leaves a checkpoint that looks complete, is chosen as the most
recent on the next run, and fails to load (a missing or truncated parameter file).
``AtomicCheckpointer`` writes ``CKPT.yaml`` under a temporary name and renames it once every
parameter file is written, so a folder becomes a checkpoint only when it is whole; folders left
incomplete by a killed save are removed when the next run recovers.

``RandomState`` is a recoverable of every rank's random generators, so that a resumed run draws the
dropout masks and augmentations an uninterrupted run would (``RecipeBrain`` registers it).

In a config::

    checkpointer: !new:common.checkpoints.AtomicCheckpointer
        checkpoints_dir: !ref <save_folder>
        recoverables: ...
"""

import logging
import os
import random
import shutil

import numpy as np
import torch
from speechbrain.utils.checkpoints import (
    CKPT_PREFIX,
    METAFNAME,
    Checkpointer,
    mark_as_loader,
    mark_as_saver,
    register_checkpoint_hooks,
)
from speechbrain.utils.distributed import ddp_barrier, if_main_process

logger = logging.getLogger(__name__)

PENDING_SUFFIX = ".pending"


def pending_name(path):
    """Where the meta file waits until the checkpoint's parameter files are all written."""
    return path.with_name(path.name + PENDING_SUFFIX)


class AtomicCheckpointer(Checkpointer):
    """A ``Checkpointer`` whose checkpoints appear only once complete (see the module docstring)."""

    def _save_checkpoint_metafile(self, fpath, meta_to_include=None, end_of_epoch=True):
        """Write the meta file under its pending name; ``save_checkpoint`` publishes it."""
        return super()._save_checkpoint_metafile(pending_name(fpath), meta_to_include or {}, end_of_epoch)

    def save_checkpoint(self, *args, **kwargs):
        """Save as SpeechBrain does, then rename the meta file into place (main process) before any
        rank goes on: ``save_and_keep_only`` next lists the checkpoints on every rank, and a rank that
        listed them before the rename kept the previous one where the main process deleted it, a
        collective the others never joined (a hang under torchrun)."""
        checkpoint = super().save_checkpoint(*args, **kwargs)
        if checkpoint is not None:  # None on the other ranks: the main process writes checkpoints
            meta = checkpoint.path / METAFNAME
            os.replace(pending_name(meta), meta)
        ddp_barrier()
        return checkpoint

    def recover_if_possible(self, *args, **kwargs):
        """Remove checkpoints left incomplete by a killed save, then recover as SpeechBrain does."""
        if if_main_process():
            self.remove_incomplete_checkpoints()
        return super().recover_if_possible(*args, **kwargs)

    def remove_incomplete_checkpoints(self):
        """Delete checkpoint folders without a published meta file; returns their names."""
        removed = []
        if not self.checkpoints_dir.is_dir():
            return removed
        for folder in sorted(self.checkpoints_dir.iterdir()):
            if folder.is_dir() and folder.name.startswith(CKPT_PREFIX) and not (folder / METAFNAME).exists():
                logger.warning("Removing %s: a checkpoint whose save was interrupted", folder)
                shutil.rmtree(folder)
                removed.append(folder.name)
        return removed


class RandomState:
    """Every rank's random generators (torch CPU and CUDA, numpy, Python) as a checkpoint recoverable.

    ``save`` gathers each rank's state and the main process writes them in one file; ``load`` keeps this
    rank's and ``restore_pending()`` (called just before the first training batch after a resume) puts it
    back there, where an uninterrupted run drew its next random number: anything drawn in between (a
    dataloader iterator's seed, the validation set's setup) would otherwise shift every later draw.
    A checkpoint saved by a different number of ranks restores nothing (with a warning).
    """

    def __init__(self):
        self.pending = None

    @mark_as_saver
    def save(self, path):
        states = [current_random_state()]
        if torch.distributed.is_initialized():
            states = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(states, current_random_state())
        if if_main_process():
            torch.save(states, path)

    @mark_as_loader
    def load(self, path, end_of_epoch=False):
        states = torch.load(path, weights_only=False)
        rank, ranks = ((torch.distributed.get_rank(), torch.distributed.get_world_size())
                       if torch.distributed.is_initialized() else (0, 1))
        if len(states) != ranks:
            logger.warning("%s holds the random state of %d ranks, this run has %d: random draws start anew",
                           path, len(states), ranks)
            return
        self.pending = states[rank]

    def restore_pending(self):
        """Restore the state ``load`` read, once; nothing when none is waiting."""
        if self.pending is not None:
            restore_random_state(self.pending)
            self.pending = None


# every rank runs save (it gathers the ranks' states), not only the main process as by default
RandomState = register_checkpoint_hooks(RandomState, save_on_main_only=False)


def current_random_state():
    """This process's random generators' states (picklable)."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def restore_random_state(state):
    """Put back the states ``current_random_state`` returned."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
