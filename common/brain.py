"""The training lifecycle every recipe's Brain shares.

``RecipeBrain`` owns what happens around a recipe's model logic: the training loader's epoch (so a
resumed run continues at the next batch), the learning-rate step before each update, the batch log,
the per-term averages of each stage, TensorBoard, the epoch's log line, ``history.json`` and
``curves.png``, and the end-of-epoch checkpoint. A recipe's Brain overrides only:

- ``compute_forward`` and ``compute_objectives`` (calling ``add_figures`` with what it reports);
- ``batch_budgets()``: what one batch holds, per modality (logged as the effective batch);
- optionally ``parameter_group(name)``: the learning-rate group of a parameter, when the hparams'
  ``lr_scales`` (group -> factor of the schedule's rate) give groups their own rates;
- optionally ``evaluation_figures(stage)`` (e.g. WER of the validation decode), ``end_test(stats)``,
  ``checkpoint_key`` (the validation figure that ranks checkpoints) and ``higher_is_better``;
- with evaluation split across torchrun ranks (loaders made with ``share="batches"``):
  ``evaluation_state()`` / ``merge_evaluation_states(states)``, what each rank decoded and how the main
  figures are made of all ranks' (every rank then holds the figures of the whole split).

A wall-clock budget (``train_minutes`` in the hparams; null: none) ends training at the update that
spends it, counting the minutes of earlier runs of the same experiment (``history.json``); the epoch
it cuts short is then validated and checkpointed as any other (an epoch of a large corpus may be far
longer than the budget).

Its ``hparams`` need ``lr_scheduler``, ``log_interval_steps``, ``tensorboard_logger``,
``train_logger``, ``batch_log``, ``keep_checkpoints``, ``output_folder``, ``epoch_counter`` and
``train_minutes``.

    class ASR(RecipeBrain):
        def compute_objectives(self, predictions, batch, stage):
            losses = ...
            self.add_figures({"ctc_loss": float(losses["ctc"]), "nll_loss": ...})
            return losses["loss"]
"""

import json
import logging
import os
import time
from collections import defaultdict

import speechbrain as sb
import torch

from common.checkpoints import RandomState
from common.curves import EpochHistory, plot_curves

logger = logging.getLogger(__name__)

HISTORY_NAME, CURVES_NAME = "history.json", "curves.png"


def rank_and_world_size():
    """(this process' rank, processes) in the DDP group; (0, 1) without torchrun."""
    if torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def batch_log_path(output_folder, rank):
    """Where the batch log of rank ``rank`` is written (``batch_log: True``)."""
    return os.path.join(output_folder, "batches", f"rank{rank}.jsonl")


class RecipeBrain(sb.Brain):
    """A SpeechBrain ``Brain`` with the recipes' shared lifecycle (see the module docstring).

    Set ``train_loader`` before ``fit``. ``checkpoint_key`` names the validation figure that ranks
    end-of-epoch checkpoints (None: keep the most recent).
    """

    train_loader = None
    checkpoint_key, higher_is_better = None, False

    # ---- what a recipe reports ----

    def add_figures(self, figures):
        """Add one batch's figures (name -> float) to the stage's averages; a name a batch does not
        report is averaged over the batches that do (per-task figures of a mixed loader)."""
        for name, value in figures.items():
            self.figure_sums[name] += float(value.detach() if hasattr(value, "detach") else value)
            self.figure_counts[name] += 1

    def stage_figures(self):
        """The stage's average of each figure given to ``add_figures``."""
        return {name: total / self.figure_counts[name] for name, total in self.figure_sums.items()}

    def batch_budgets(self):
        """``{modality: (amount, unit)}`` of one batch, e.g. ``{"speech": (60.0, "padded seconds")}``."""
        return {}

    def evaluation_figures(self, stage):
        """Figures of a validation or test stage beyond the averaged ones (error rates)."""
        return {}

    def end_test(self, stats):
        """What a test stage leaves behind (results files); nothing by default."""

    def evaluation_state(self):
        """What this rank's evaluation collected beyond the averaged figures (picklable); None."""
        return None

    def merge_evaluation_states(self, states):
        """Make the stage's evaluation of every rank's ``evaluation_state()`` (rank order)."""

    def parameter_group(self, name):
        """The learning-rate group (an ``lr_scales`` key) of the parameter ``name`` of ``self.modules``
        (``model.transformer...``); the recipe names the groups."""
        raise ValueError(f"{type(self).__name__} has no learning-rate groups: remove lr_scales from the config")

    def network(self, stage):
        """The model for ``stage``: DDP-wrapped in training, the plain module when evaluating, whose
        ranks decode different numbers of batches (DDP's forward would wait for the others)."""
        model = self.modules.model
        return model.module if stage != sb.Stage.TRAIN and hasattr(model, "module") else model

    # ---- lifecycle ----

    def fit(self, epoch_counter, train_set, valid_set=None, *args, **kwargs):
        self.validates = valid_set is not None
        return super().fit(epoch_counter, train_set, valid_set, *args, **kwargs)

    def init_optimizers(self):
        """SpeechBrain's one optimizer; with ``lr_scales`` its parameters in one group per
        ``parameter_group`` name, each remembering its factor (``lr_scale``); unscaled groups come first,
        so ``param_groups[0]`` holds the schedule's rate (logged as ``lr``)."""
        scales = dict(getattr(self.hparams, "lr_scales", None) or {})
        if not scales:
            return super().init_optimizers()
        groups = defaultdict(list)
        for name, parameter in self.modules.named_parameters():
            groups[self.parameter_group(name)].append(parameter)
        unknown = sorted(set(scales) - set(groups))
        if unknown or any(not isinstance(f, (int, float)) or f < 0 for f in scales.values()):
            raise ValueError(f"lr_scales={scales}: each key must be one of {sorted(groups)} (not {unknown}) "
                             "and each factor a number >= 0, e.g. --lr_scales='{language_model: 0.1}'")
        param_groups = sorted(({"params": params, "group": group, "lr_scale": float(scales.get(group, 1.0))}
                               for group, params in groups.items()), key=lambda g: g["lr_scale"] != 1.0)
        self.optimizer = self.opt_class(param_groups)
        self.optimizers_dict = {"opt_class": self.optimizer}
        if self.checkpointer is not None:
            self.checkpointer.add_recoverable("optimizer", self.optimizer)
        logger.info("learning-rate factors: %s", {g["group"]: g["lr_scale"] for g in param_groups})

    def on_fit_start(self):
        if self.checkpointer is not None and "random_state" not in self.checkpointer.recoverables:
            self.random_state = RandomState()  # a checkpoint from before it was saved loads without it
            self.checkpointer.add_recoverable("random_state", self.random_state, optional_load=True)
        super().on_fit_start()
        self.fit_began = time.time()
        records = EpochHistory(os.path.join(self.hparams.output_folder, HISTORY_NAME)).records
        self.minutes_before = records[-1].get("minutes", 0.0) if records else 0.0
        if self.budget_spent(self.minutes_before):
            self.hparams.epoch_counter.limit = self.hparams.epoch_counter.current
        ranks, accumulation = rank_and_world_size()[1], self.grad_accumulation_factor
        for modality, (amount, unit) in self.batch_budgets().items():
            logger.info("effective %s batch per update: %d ranks x %d accumulated x %g %s = %g %s", modality,
                        ranks, accumulation, amount, unit, ranks * accumulation * amount, unit)

    def on_stage_start(self, stage, epoch=None):
        """Start the loader's epoch (resume-aware), the stage clock and fresh figure sums."""
        if stage == sb.Stage.TRAIN and self.train_loader is not None:
            self.train_loader.set_epoch(epoch)
        self.stage_began = time.perf_counter()
        self.figure_sums, self.figure_counts = defaultdict(float), defaultdict(int)
        self.evaluated_batches = 0

    def evaluate_batch(self, batch, stage):
        self.evaluated_batches += 1
        return super().evaluate_batch(batch, stage)

    def on_fit_batch_start(self, batch, should_step):
        """Step the learning-rate schedule so that the coming update uses its rate: update n is made
        at the schedule's value for step n (stepping after the update would make update 1 at the
        optimizer's initial rate, the schedule's peak). The first batch after a resume restores the
        random generators the checkpoint saved."""
        if getattr(self, "random_state", None) is not None:
            self.random_state.restore_pending()
        if should_step:
            self.hparams.lr_scheduler(self.optimizer)
            rate = self.optimizer.param_groups[0]["lr"]  # the schedule sets every group's rate alike ...
            for group in self.optimizer.param_groups:  # ... and lr_scales scale it per group
                group["lr"] = rate * group.get("lr_scale", 1.0)

    def on_fit_batch_end(self, batch, outputs, loss, should_step):
        """The batch log line; every ``log_interval_steps`` updates the figures to TensorBoard; the
        update that spends ``train_minutes`` is the epoch's last (SpeechBrain's step limit ends it)."""
        self.record_batch(batch, loss)
        if should_step and not self.optimizer_step % self.hparams.log_interval_steps:
            self.log_step(loss)
        if should_step and self.budget_spent(self.minutes_before + (time.time() - self.fit_began) / 60):
            self.optimizer_step_limit = self.optimizer_step

    def on_stage_end(self, stage, stage_loss, epoch=None):
        """Training keeps its figures for the epoch's line; validation (or training, when there is
        none) ends the epoch; a test stage goes to ``end_test``."""
        if stage != sb.Stage.TRAIN and rank_and_world_size()[1] > 1:
            stage_loss = self.gather_evaluation(stage_loss)
        stats = {"loss": stage_loss, **self.stage_figures()}
        if stage == sb.Stage.TRAIN:
            self.train_stats = {**stats, "data_wait": round(self.data_wait_share(), 4)}
            if not getattr(self, "validates", False):
                self.end_epoch(epoch, None)
            return
        stats.update(self.evaluation_figures(stage))
        if stage == sb.Stage.VALID:
            self.end_epoch(epoch, stats)
        else:
            self.end_test(stats)

    def end_epoch(self, epoch, valid_stats):
        """The epoch's log line (file and TensorBoard), history and curves, and its checkpoint."""
        minutes = self.minutes_before + (time.time() - self.fit_began) / 60
        meta = {"epoch": epoch, "lr": self.optimizer.param_groups[0]["lr"], "steps": self.optimizer_step,
                "minutes": round(minutes, 4)}
        for logger_name in ("train_logger", "tensorboard_logger"):
            getattr(self.hparams, logger_name).log_stats(meta, train_stats=self.train_stats,
                                                         valid_stats=valid_stats)
        if sb.utils.distributed.if_main_process():
            self.draw_history(epoch, meta, valid_stats)
        key = self.checkpoint_key
        ranked = key is not None and valid_stats is not None
        ranking = {("max_keys" if self.higher_is_better else "min_keys"): [key]} if ranked else {}
        self.checkpointer.save_and_keep_only(meta={"epoch": epoch, **({key: valid_stats[key]} if ranked else {})},
                                             num_to_keep=self.hparams.keep_checkpoints, **ranking)
        if self.budget_spent(minutes):
            logger.info("the training budget of %g minutes is spent in epoch %d (%.1f min, %d updates)",
                        self.hparams.train_minutes, epoch, minutes, self.optimizer_step)
            self.hparams.epoch_counter.limit = epoch

    def budget_spent(self, minutes):
        """Whether ``minutes`` of training spend ``train_minutes`` (rank 0 decides for all ranks)."""
        budget = self.hparams.train_minutes
        spent = torch.tensor(float(budget is not None and minutes >= budget), device=self.device)
        if torch.distributed.is_initialized():
            torch.distributed.broadcast(spent, src=0)
        return bool(spent)

    def draw_history(self, epoch, meta, valid_stats):
        """Add the epoch to ``history.json`` and redraw ``curves.png`` in the output folder."""
        folder = self.hparams.output_folder
        history = EpochHistory(os.path.join(folder, HISTORY_NAME))
        history.add(epoch, lr=meta["lr"], steps=meta["steps"], minutes=meta["minutes"], train=_plain(self.train_stats),
                    valid=_plain(valid_stats) if valid_stats else None)
        try:
            plot_curves(history.records, os.path.join(folder, CURVES_NAME))
        except Exception as error:  # a broken plot must never stop training
            logger.warning("could not draw %s: %s", CURVES_NAME, error)

    def gather_evaluation(self, stage_loss):
        """Under torchrun, the loss, figures and evaluation state of every rank's share of the split,
        combined on every rank; returns the loss per batch over all ranks."""
        share = (float(stage_loss) * self.evaluated_batches, self.evaluated_batches, dict(self.figure_sums),
                 dict(self.figure_counts), self.evaluation_state())
        shares = [None] * rank_and_world_size()[1]
        torch.distributed.all_gather_object(shares, share)
        self.figure_sums, self.figure_counts = defaultdict(float), defaultdict(int)
        for _, _, sums, counts, _ in shares:
            for name in sums:
                self.figure_sums[name] += sums[name]
                self.figure_counts[name] += counts[name]
        self.merge_evaluation_states([state for *_, state in shares])
        batches = sum(count for _, count, *_ in shares)
        return sum(loss for loss, *_ in shares) / max(batches, 1)

    # ---- helpers ----

    def data_wait_share(self):
        """Share of the training stage's wall time spent waiting for the loader's next batch: near 0
        when the loader keeps up, large when the GPU (or CPU) starves."""
        elapsed = time.perf_counter() - self.stage_began
        return self.train_loader.wait_seconds / elapsed if elapsed > 0 and self.train_loader else 0.0

    def log_step(self, loss):
        """The loss, the stage's running figures and the learning rate to TensorBoard (main process)."""
        if not sb.utils.distributed.if_main_process():
            return
        writer, step = self.hparams.tensorboard_logger.writer, self.optimizer_step
        writer.add_scalar("train_step/loss", loss.item(), step)
        for name, value in self.stage_figures().items():
            writer.add_scalar(f"train_step/{name}", value, step)
        writer.add_scalar("train_step/lr", self.optimizer.param_groups[0]["lr"], step)

    def record_batch(self, batch, loss):
        """With ``batch_log: True``, append one JSON line per training batch of this rank: epoch, index
        in the epoch, update step, the learning rate it was trained with, its sample keys and loss.

        An audit trail of what each rank trained on, in order (a rerun after a kill appends the
        batches it redoes: the last line of each (epoch, batch) is the one that counts).
        """
        if not self.hparams.batch_log:
            return
        if getattr(self, "batch_log_file", None) is None:
            path = batch_log_path(self.hparams.output_folder, rank_and_world_size()[0])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.batch_log_file = open(path, "a", encoding="utf-8", buffering=1)  # a line per write
        loader = self.train_loader
        line = {"epoch": loader.epoch, "batch": loader.position - 1, "update": self.optimizer_step,
                "lr": self.optimizer.param_groups[0]["lr"], "keys": list(getattr(batch, "id", [])),
                "loss": float(loss.detach())}
        self.batch_log_file.write(json.dumps(line) + "\n")


def _plain(stats):
    """Stats as JSON numbers (tensors and numpy scalars become floats)."""
    return {name: float(value) for name, value in stats.items() if isinstance(value, (int, float)) or
            hasattr(value, "item")}
