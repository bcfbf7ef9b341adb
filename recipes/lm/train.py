#!/usr/bin/env python3
"""Language model recipe: next-token prediction over the ASR tokenizer's pieces, from text shards.

    python recipes/lm/train.py recipes/lm/hparams/rnnlm.yaml --tokenizer_file=tokenizer/char.model \\
        --train_parquets="[text/lm_train.parquet]" --valid_parquet=text/lm_valid.parquet

Trains ``lm_model`` (SpeechBrain's RNNLM by default) with the recipes' shared lifecycle (resume,
wall-clock budget, curves), ranks checkpoints by validation loss and averages the best into
``lm.ckpt``; the tokenizer is copied beside it (``tokenizer.model``) so that decoding can check the
LM scores the same pieces. The finetune recipe fuses it with ``--lm_dir=OUTPUT_FOLDER --lm_weight=W``.
"""

import math
import os
import shutil
import sys

import speechbrain as sb
import torch

from common.brain import RecipeBrain, rank_and_world_size
from common.data import TextLoaderConfig, make_text_loader
from common.evaluation import average_best_checkpoints
from common.inference import LM_CHECKPOINT
from common.models.transfer import TOKENIZER_COPY
from common.recipe import end_distributed, prepare_experiment
from common.user_errors import run_command


class LanguageModel(RecipeBrain):
    """Teacher-forced next-token prediction: ``<s> w1 .. wn`` predicts ``w1 .. wn </s>``."""

    checkpoint_key = "loss"

    def compute_forward(self, batch, stage):
        batch = batch.to(self.device)
        logits = self.modules.model(batch.tokens_bos.data)
        logits = logits[0] if isinstance(logits, tuple) else logits  # (logits, hidden) with return_hidden
        return torch.log_softmax(logits, dim=-1)

    def compute_objectives(self, log_probs, batch, stage):
        tokens, lengths = batch.tokens_eos
        loss = sb.nnet.losses.nll_loss(log_probs, tokens, length=lengths)
        self.add_figures({"nll": loss})
        return loss

    def stage_figures(self):
        """The stage's figures with the perplexity (``exp`` of the mean loss per token) for its loss."""
        figures = super().stage_figures()
        if "nll" in figures:
            figures["perplexity"] = math.exp(min(figures.pop("nll"), 50.0))
        return figures

    def batch_budgets(self):
        return {"text": (self.train_loader.config.max_batch_tokens, "padded tokens")}


def text_loader(hparams, parquets, training, rank=0, world_size=1):
    """Text batches as the ``train_loader`` (this rank's share) or ``eval_loader`` block says."""
    block = "train_loader" if training else "eval_loader"
    return make_text_loader(parquets, hparams["tokenizer_file"], TextLoaderConfig.from_config(hparams[block], block),
                            seed=hparams["seed"], rank=rank, world_size=world_size)


def input_keys(hparams):
    return ["tokenizer_file", "train_parquets", "valid_parquet"]


def save_averaged(brain, hparams):
    """``lm.ckpt`` (the best checkpoints averaged) and the tokenizer copy, on the main process."""
    if not sb.utils.distributed.if_main_process():
        return
    folder = hparams["output_folder"]
    average_best_checkpoints(hparams["checkpointer"], hparams["lm_model"], hparams["average_checkpoints"],
                             min_key="loss", save_path=os.path.join(folder, LM_CHECKPOINT))
    shutil.copyfile(hparams["tokenizer_file"], os.path.join(folder, TOKENIZER_COPY))


def main(argv):
    hparams, run_opts = prepare_experiment(argv, input_keys)
    brain = LanguageModel(modules={"model": hparams["lm_model"]}, opt_class=hparams["optimizer"], hparams=hparams,
                          run_opts=run_opts, checkpointer=hparams["checkpointer"])
    brain.train_loader = text_loader(hparams, hparams["train_parquets"], True, *rank_and_world_size())
    hparams["checkpointer"].add_recoverable("train_loader", brain.train_loader)
    brain.fit(hparams["epoch_counter"], brain.train_loader, text_loader(hparams, hparams["valid_parquet"], False))
    save_averaged(brain, hparams)


if __name__ == "__main__":
    run_command(main, sys.argv[1:], cleanup=end_distributed)
