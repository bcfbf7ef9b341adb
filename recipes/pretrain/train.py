#!/usr/bin/env python3
"""Pretrain recipe: joint speech-text pretraining of the shared encoder-decoder (SpeechUT / YiTrans).

    python recipes/pretrain/train.py recipes/pretrain/hparams/conformer.yaml \\
        --speech_parquets=[shards/train/metadata_pool.parquet] --units_dirs=[units/train] \\
        --text_parquets=[text/mono.parquet] --paired_parquets=[text/pairs.parquet] \\
        --tokenizer_file=tokenizer/unigram_5000.model

Each batch holds one modality, drawn from a ``MixedLoader`` (weights or temperature α):

- ``speech``: span-masked encoder input, cross-entropy on masked frames against k-means units
  (``speech_targets: kmeans``, from ``units_dirs``) or BEST-RQ codes (``bestrq``, computed in the pass);
- ``text``: BART noising of the source, the decoder reconstructs the sentence;
- ``paired``: the source through the same text path, the decoder produces the target.

The loss of a batch is its task's loss times ``task_loss_weights[task]``; per-task losses and
accuracies go to train_log.txt and TensorBoard. Checkpoints hold the graph (``model.ckpt``, the names
finetuning loads), the feature statistics, the pretraining heads, the optimizer and the loader's
position. The tokenizer is copied into the experiment folder: finetuning must use the same one.
"""

import logging
import os
import shutil
import sys
from collections import defaultdict

import numpy as np
import speechbrain as sb

from common.brain import RecipeBrain, rank_and_world_size
from common.data import (
    MixedLoader,
    SpeechLoaderConfig,
    TextLoaderConfig,
    Tokenizer,
    make_speech_loader,
    make_text_loader,
    speech_input,
)
from common.data.units import read_units, units_at_frames
from common.masking import mask_spans
from common.objectives import masked_unit_loss, sequence_loss
from common.recipe import prepare_experiment
from common.text_noising import TextNoiser, noise_batch, ordinary_piece_ids

logger = logging.getLogger(__name__)

SPEECH, TEXT, PAIRED = "speech", "text", "paired"
LOGGED = {SPEECH: ("masked_loss", "masked_accuracy", "unmasked_accuracy"), TEXT: ("loss", "accuracy"),
          PAIRED: ("loss", "accuracy")}


class JointPretraining(RecipeBrain):
    """One task per batch (``batch.stream``; evaluation batches are speech).

    Set ``units`` (``UnitTable`` of every speech split), ``noiser`` (``TextNoiser``), for training
    ``train_loader`` and, when validating, ``valid_loader`` before ``fit``.
    """

    units, noiser, valid_loader = None, None, None

    def rng(self, stage):
        """Masking / noising randomness of this step: a function of (seed, epoch, step, stage)."""
        return np.random.default_rng([self.hparams.seed, self.hparams.epoch_counter.current, self.step,
                                      int(stage == sb.Stage.TRAIN)])

    def compute_forward(self, batch, stage):
        """The task's pass; returns (task, output)."""
        batch = batch.to(self.device)
        task, rng = getattr(batch, "stream", SPEECH), self.rng(stage)
        if task == SPEECH:
            wavs, wav_lens = speech_input(batch)
            hp = self.hparams
            mask = lambda lengths, frames: mask_spans(lengths, frames, hp.mask_prob, hp.mask_span_frames, rng)  # noqa: E731,E501
            return task, self.modules.pretrain(SPEECH, wavs, wav_lens, mask, epoch=hp.epoch_counter.current)
        src, src_lens = batch.src_tokens
        if task == TEXT:
            src, src_lens = noise_batch(self.noiser, src, src_lens, rng)
        return task, self.modules.pretrain(task, src, src_lens, batch.tokens_bos.data)

    def compute_objectives(self, predictions, batch, stage):
        """The task's loss times its weight; per-task figures kept for logging."""
        task, out = predictions
        if task == SPEECH:
            targets = out.targets
            if targets is None:  # k-means units, looked up by key and brought to the encoder frame rate
                units, lengths = self.units.batch(batch.id)
                targets = units_at_frames(units, lengths, out.unit_logits.shape[1],
                                          self.hparams.encoder_frame_rate_hz, self.units.frame_rate_hz)
            losses = masked_unit_loss(out.unit_logits, targets.to(self.device), out.frame_mask,
                                      self.hparams.unmasked_weight)
        else:
            losses = sequence_loss(out, *batch.tokens_eos, label_smoothing=self.hparams.label_smoothing)
        self.add_figures({f"{task}_{term}": losses[term] for term in LOGGED[task]})
        self.task_batches[task] += 1
        return self.hparams.task_loss_weights[task] * losses["loss"]

    def stage_figures(self):
        """Stage averages of each task's figures (over its batches), and its share of the batches."""
        total = max(sum(self.task_batches.values()), 1)
        return {**super().stage_figures(),
                **{f"{task}_share": count / total for task, count in self.task_batches.items()}}

    def on_stage_start(self, stage, epoch=None):
        """Fresh task counts (the base class starts the loader's epoch and the figure sums)."""
        super().on_stage_start(stage, epoch)
        self.task_batches = defaultdict(int)

    def batch_budgets(self):
        streams = self.train_loader.streams
        budgets = {SPEECH: (streams[SPEECH].config.max_batch_seconds, "padded seconds")}
        text = streams.get(TEXT) or streams.get(PAIRED)
        if text is not None:
            budgets["text"] = (text.config.max_batch_tokens, "padded tokens")
        return budgets


def speech_loader(hparams, parquets, training, rank=0, world_size=1):
    """Speech batches (texts unused: untranscribed shards welcome): this rank's share as the
    ``speech_loader`` block says, or every utterance as the ``eval_loader`` block says."""
    block = "speech_loader" if training else "eval_loader"
    config = SpeechLoaderConfig.from_config(hparams[block], block)
    return make_speech_loader(parquets, hparams["tokenizer_file"], config,
                              seed=hparams["seed"], rank=rank, world_size=world_size,
                              fbank=hparams["graph"]["compute_features"], require_text=False)


def text_loader(hparams, parquets, rank, world_size, paired):
    """Mono (``paired=False``) or paired text batches of this rank, as the ``text_loader`` block says."""
    columns = hparams["paired_columns"] if paired else hparams["text_columns"]
    return make_text_loader(parquets, hparams["tokenizer_file"],
                            TextLoaderConfig.from_config(hparams["text_loader"], "text_loader"),
                            seed=hparams["seed"], rank=rank, world_size=world_size, **columns)


def training_mix(hparams, rank, world_size):
    """The MixedLoader of the configured modalities (speech always; text and paired when given)."""
    streams = {SPEECH: speech_loader(hparams, hparams["speech_parquets"], True, rank, world_size)}
    if hparams["text_parquets"]:
        streams[TEXT] = text_loader(hparams, hparams["text_parquets"], rank, world_size, paired=False)
    if hparams["paired_parquets"]:
        streams[PAIRED] = text_loader(hparams, hparams["paired_parquets"], rank, world_size, paired=True)
    weights = hparams["mixing_weights"]
    if weights is not None:
        weights = {name: weights[name] for name in streams}
    return MixedLoader(streams, weights=weights, alpha=None if weights else hparams["mixing_alpha"],
                       seed=hparams["seed"])


def make_noiser(hparams, tokenizer):
    """The BART noiser of the ``text_noising`` block, with the tokenizer's <mask> and pieces."""
    return TextNoiser(tokenizer.piece_id(hparams["mask_token"]), ordinary_piece_ids(tokenizer.processor),
                      **hparams["text_noising"])


INPUT_KEYS = ("speech_parquets", "units_dirs", "valid_parquet", "valid_units_dir", "text_parquets",
              "paired_parquets", "tokenizer_file")


def main(argv):
    hparams, run_opts = prepare_experiment(argv, lambda hparams: INPUT_KEYS)
    shutil.copy(hparams["tokenizer_file"], os.path.join(hparams["output_folder"], "tokenizer.model"))
    brain = JointPretraining(modules={"pretrain": hparams["pretrain_model"]}, opt_class=hparams["optimizer"],
                             hparams=hparams, run_opts=run_opts, checkpointer=hparams["checkpointer"])
    brain.noiser = make_noiser(hparams, Tokenizer(hparams["tokenizer_file"]))
    kmeans = hparams["speech_targets"] == "kmeans"
    if kmeans:
        unit_dirs = hparams["units_dirs"] + ([hparams["valid_units_dir"]] if hparams["valid_units_dir"] else [])
        brain.units = read_units(unit_dirs, expected_hash=hparams["kmeans_hash"])
    brain.train_loader = training_mix(hparams, *rank_and_world_size())
    if kmeans:
        brain.units.check_covers(brain.train_loader.streams[SPEECH].used_keys(), hparams["speech_parquets"])
    hparams["checkpointer"].add_recoverable("train_loader", brain.train_loader)
    if hparams["valid_parquet"]:
        brain.valid_loader = speech_loader(hparams, hparams["valid_parquet"], False)
        brain.valid_loader.name = "valid"  # labels its end-of-pass log line
        if kmeans:
            brain.units.check_covers(brain.valid_loader.used_keys(), hparams["valid_parquet"])
    brain.fit(hparams["epoch_counter"], brain.train_loader, brain.valid_loader)


if __name__ == "__main__":
    main(sys.argv[1:])
