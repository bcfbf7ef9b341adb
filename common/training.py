"""Steps every recipe's Brain takes after an optimizer update."""

import speechbrain as sb


def after_update(brain, loss, figures):
    """Step the learning-rate schedule; every ``log_interval_steps`` updates write the loss, the
    ``figures()`` dict (per-term or per-task averages) and the learning rate to TensorBoard.

    Call it from ``Brain.on_fit_batch_end`` when ``should_step``; ``brain.hparams`` needs
    ``lr_scheduler``, ``log_interval_steps`` and ``tensorboard_logger``.
    """
    hparams = brain.hparams
    hparams.lr_scheduler(brain.optimizer)
    if brain.optimizer_step % hparams.log_interval_steps or not sb.utils.distributed.if_main_process():
        return
    writer = hparams.tensorboard_logger.writer
    writer.add_scalar("train_step/loss", loss.item(), brain.optimizer_step)
    for name, value in figures().items():
        writer.add_scalar(f"train_step/{name}", value, brain.optimizer_step)
    writer.add_scalar("train_step/lr", brain.optimizer.param_groups[0]["lr"], brain.optimizer_step)
