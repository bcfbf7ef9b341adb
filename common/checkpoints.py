"""SpeechBrain's Checkpointer, made safe against a process killed while it saves.

SpeechBrain writes a checkpoint folder's ``CKPT.yaml`` first and the parameter files after it, and
any folder holding a ``CKPT.yaml`` counts as a checkpoint. A run killed (kill -9, a preempted node,
an out-of-memory kill) between the two leaves a checkpoint that looks complete, is chosen as the most
recent on the next run, and fails to load (a missing or truncated parameter file).
``AtomicCheckpointer`` writes ``CKPT.yaml`` under a temporary name and renames it once every
parameter file is written, so a folder becomes a checkpoint only when it is whole; folders left
incomplete by a killed save are removed when the next run recovers.

In a config::

    checkpointer: !new:common.checkpoints.AtomicCheckpointer
        checkpoints_dir: !ref <save_folder>
        recoverables: ...
"""

import logging
import os
import shutil

from speechbrain.utils.checkpoints import CKPT_PREFIX, METAFNAME, Checkpointer
from speechbrain.utils.distributed import if_main_process

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
        """Save as SpeechBrain does, then rename the meta file into place (main process)."""
        checkpoint = super().save_checkpoint(*args, **kwargs)
        if checkpoint is not None:  # None on the other ranks: the main process writes checkpoints
            meta = checkpoint.path / METAFNAME
            os.replace(pending_name(meta), meta)
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
