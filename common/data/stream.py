"""Epoch-wise batch streams with an exact resume state, recoverable by SpeechBrain's Checkpointer.

State = (epoch, batches consumed in that epoch). Plans are pure functions of (seed, epoch, ...), so a
restored stream replans its epoch and skips the consumed batches without reading their audio.
"""

import json
import logging
import time

from speechbrain.dataio.dataloader import LoopedLoader
from speechbrain.utils.checkpoints import mark_as_loader, mark_as_saver, register_checkpoint_hooks
from torch.utils.data import IterableDataset, get_worker_info

logger = logging.getLogger(__name__)


@register_checkpoint_hooks
class BatchStream(LoopedLoader):
    """Base of the loaders: iterate one epoch per ``for`` loop, resume exactly, report ``len()``.

    It subclasses ``LoopedLoader`` only so that ``Brain.fit`` takes it as a ready loader (Brain.fit
    wraps anything that is not a ``DataLoader``/``LoopedLoader``); iteration and state are its own.
    Subclasses implement ``batches_in_epoch(epoch)`` and ``epoch_batches(epoch, start)``.

    Usage in a recipe: ``checkpointer.add_recoverable("train_loader", loader)`` and
    ``loader.set_epoch(epoch)`` at the start of each epoch (optional: a finished ``for`` loop moves
    to the next epoch by itself).
    """

    def __init__(self):
        self.epoch = 0
        self.position = 0  # batches of ``self.epoch`` already consumed
        self.wait_seconds = 0.0  # time the consumer waited for batches in the current ``for`` loop

    def __len__(self):
        return self.batches_in_epoch(self.epoch)

    def set_epoch(self, epoch):
        """Start ``epoch`` from its first batch, unless it is the epoch in progress (resume)."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def __iter__(self):
        epoch, self.wait_seconds = self.epoch, 0.0
        batches = self.epoch_batches(epoch, self.position)
        while True:
            asked = time.perf_counter()
            batch = next(batches, None)
            self.wait_seconds += time.perf_counter() - asked
            if batch is None:
                break
            self.position += 1
            yield batch
        self.end_epoch(epoch)
        self.epoch, self.position = epoch + 1, 0

    def __next__(self):
        raise TypeError(f"iterate a {type(self).__name__} with `for`, one epoch per loop")

    def end_epoch(self, epoch):
        """Hook called after the last batch of an epoch (logging of epoch figures)."""

    def batches_in_epoch(self, epoch):
        """Number of batches this rank yields in ``epoch``."""
        raise NotImplementedError

    def epoch_batches(self, epoch, start):
        """Yield the batches of ``epoch`` from index ``start`` on."""
        raise NotImplementedError

    def state_dict(self):
        """The resume state: epoch and batches consumed in it."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state):
        """Restore a state from ``state_dict``: the next batch is the one after the last consumed."""
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    @mark_as_saver
    def save(self, path):
        """SpeechBrain checkpoint hook: write the state as JSON."""
        with open(path, "w") as file:
            json.dump(self.state_dict(), file)

    @mark_as_loader
    def load(self, path, end_of_epoch=False):
        """SpeechBrain checkpoint hook: read the state written by ``save``."""
        with open(path) as file:
            self.load_state_dict(json.load(file))


class SlotDataset(IterableDataset):
    """Base of the loaders' datasets: yields one rank's planned batches of one epoch, each dataloader
    worker those of one slot (``planning.SlotPlan``). Subclasses implement ``slot_batches(slot)`` (the
    slot's batches from the first not yet consumed); set ``slots`` and ``consumed`` before iterating.

    Torch's DataLoader takes batches from its workers round-robin from worker 0. A rank resumed after
    ``consumed`` batches next owes a batch of slot ``consumed % workers``, so worker ``i`` serves slot
    ``(i + consumed) % workers``: the batches then come in plan order after any resume.
    """

    slots, consumed = (), 0

    def __iter__(self):
        info, workers = get_worker_info(), len(self.slots)
        if info is not None:
            yield from self.slot_batches((info.id + self.consumed) % workers)
            return
        streams = [self.slot_batches((i + self.consumed) % workers) for i in range(workers)]
        while streams:  # in the main process: the same round-robin
            batches = [next(stream, None) for stream in streams]
            streams = [stream for stream, batch in zip(streams, batches) if batch is not None]
            yield from (batch for batch in batches if batch is not None)

    def slot_batches(self, slot):
        """Yield the batches of ``slot`` from its first one not yet consumed."""
        raise NotImplementedError
