"""Steps every recipe's Brain takes around training: after each update, per batch, at the start."""

import json
import logging
import os
import time

import speechbrain as sb
import torch

logger = logging.getLogger(__name__)


def before_update(brain):
    """Step the learning-rate schedule so that the coming update uses its rate: update n is made at
    the schedule's value for step n (stepping after the update would make update 1 at the
    optimizer's initial rate, the schedule's peak). Call it from ``Brain.on_fit_batch_start`` when
    ``should_step``; ``brain.hparams`` needs ``lr_scheduler``."""
    brain.hparams.lr_scheduler(brain.optimizer)


def after_update(brain, loss, figures):
    """Every ``log_interval_steps`` updates write the loss, the ``figures()`` dict (per-term or
    per-task averages) and the learning rate to TensorBoard.

    Call it from ``Brain.on_fit_batch_end`` when ``should_step``; ``brain.hparams`` needs
    ``log_interval_steps`` and ``tensorboard_logger``.
    """
    hparams = brain.hparams
    if brain.optimizer_step % hparams.log_interval_steps or not sb.utils.distributed.if_main_process():
        return
    writer = hparams.tensorboard_logger.writer
    writer.add_scalar("train_step/loss", loss.item(), brain.optimizer_step)
    for name, value in figures().items():
        writer.add_scalar(f"train_step/{name}", value, brain.optimizer_step)
    writer.add_scalar("train_step/lr", brain.optimizer.param_groups[0]["lr"], brain.optimizer_step)


def rank_and_world_size():
    """(this process' rank, processes) in the DDP group; (0, 1) without torchrun."""
    if torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def log_effective_batch(brain, budgets):
    """Log what one update sees: ranks x accumulated batches x per-batch budget, per modality.

    ``budgets`` maps a modality to ``(amount, unit)``, e.g. ``{"speech": (1200.0, "padded seconds")}``.
    """
    ranks, accumulation = rank_and_world_size()[1], brain.grad_accumulation_factor
    for modality, (amount, unit) in budgets.items():
        logger.info("effective %s batch per update: %d ranks x %d accumulated x %g %s = %g %s",
                    modality, ranks, accumulation, amount, unit, ranks * accumulation * amount, unit)


def batch_log_path(output_folder, rank):
    """Where ``record_batch`` writes rank ``rank``'s batches."""
    return os.path.join(output_folder, "batches", f"rank{rank}.jsonl")


def record_batch(brain, batch, loss):
    """With ``batch_log: True``, append one JSON line per training batch of this rank: epoch, index
    in the epoch, update step, the learning rate it was trained with, its sample keys and loss.

    An audit trail of what each rank trained on, in order (a rerun after a kill appends the batches
    it redoes: the last line of each (epoch, batch) is the one that counts). Call it from
    ``on_fit_batch_end``.
    """
    if not brain.hparams.batch_log:
        return
    if getattr(brain, "batch_log_file", None) is None:
        path = batch_log_path(brain.hparams.output_folder, rank_and_world_size()[0])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        brain.batch_log_file = open(path, "a", encoding="utf-8", buffering=1)  # a line per write
    loader = brain.train_loader
    line = {"epoch": loader.epoch, "batch": loader.position - 1, "update": brain.optimizer_step,
            "lr": brain.optimizer.param_groups[0]["lr"], "keys": list(getattr(batch, "id", [])),
            "loss": float(loss.detach())}
    brain.batch_log_file.write(json.dumps(line) + "\n")


def start_stage_clock(brain):
    """Note when a stage began (for ``data_wait_share``)."""
    brain.stage_began = time.perf_counter()


def data_wait_share(brain):
    """Share of the training stage's wall time spent waiting for the loader's next batch: near 0
    when the loader keeps up, large when the GPU (or CPU) starves."""
    elapsed = time.perf_counter() - brain.stage_began
    return brain.train_loader.wait_seconds / elapsed if elapsed > 0 else 0.0
