#!/usr/bin/env python3
"""Pretrain recipe: joint speech-text pretraining of the shared encoder-decoder (SpeechUT / YiTrans).

    python recipes/pretrain/train.py recipes/pretrain/hparams/conformer.yaml \\
        --speech_parquets=[shards/train/metadata_pool.parquet] --units_dirs=[units/train] \\
        --text_parquets=[text/mono.parquet] --paired_parquets=[text/pairs.parquet] \\
        --tokenizer_file=tokenizer/unigram_5000.model

Each batch holds one modality, drawn from a ``MixedLoader`` (weights or temperature α):

- ``speech``: span-masked encoder input, cross-entropy on masked frames against k-means units
  (``speech_targets: kmeans``, from ``units_dirs``) or BEST-RQ codes (``bestrq``, computed in the pass);
- ``text``: BART noising of the source, the decoder reconstructs the sentence (``text_task: denoise``),
  or the decoder alone predicts it, a language model with no source (``text_task: lm``);
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
import torch

from common.atomic import atomic_write_text
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
from common.data.report import REPORT_FILE
from common.data.units import read_units, units_at_frames
from common.masking import mask_spans
from common.models.pretraining import LM_TASK, check_text_task
from common.objectives import masked_unit_loss, sequence_loss
from common.recipe import end_distributed, prepare_experiment
from common.text_noising import TextNoiser, ordinary_piece_ids
from common.user_errors import run_command

logger = logging.getLogger(__name__)

SPEECH, TEXT, PAIRED = "speech", "text", "paired"
LOGGED = {SPEECH: ("masked_loss", "masked_accuracy", "unmasked_accuracy"), TEXT: ("loss", "accuracy"),
          PAIRED: ("loss", "accuracy")}


class JointPretraining(RecipeBrain):
    """One task per batch (``batch.stream``; evaluation batches are speech).

    Set ``units`` (``UnitTable`` of every speech split, k-means targets: its frame rate), for training
    ``train_loader`` and, when validating, ``valid_loader`` before ``fit``. Speech batches carry their
    units (``batch.units``), mono text batches come noised from their loader.
    """

    units, valid_loader = None, None

    def rng(self, stage):
        """Masking randomness of this step: a function of (seed, epoch, step, stage)."""
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
        if task == TEXT and self.hparams.text_task == "lm":
            return task, self.modules.pretrain(LM_TASK, batch.tokens_bos.data)
        src, src_lens = batch.src_tokens  # mono text comes noised from its loader
        return task, self.modules.pretrain(task, src, src_lens, batch.tokens_bos.data)

    def compute_objectives(self, predictions, batch, stage):
        """The task's loss times its weight; per-task figures kept for logging."""
        task, out = predictions
        if task == SPEECH:
            targets = out.targets
            if targets is None:  # k-means units, a field of the speech batch, brought to the encoder frame rate
                units, rel_lens = batch.units
                lengths = torch.round(rel_lens * units.shape[1]).long()
                targets = units_at_frames(units, lengths, out.unit_logits.shape[1],
                                          self.hparams.encoder_frame_rate_hz, self.units.frame_rate_hz)
            losses = masked_unit_loss(out.unit_logits, targets.to(self.device), out.frame_mask,
                                      self.hparams.unmasked_weight)
        else:
            losses = sequence_loss(out, *batch.tokens_eos, label_smoothing=self.hparams.label_smoothing)
        self.add_figures({f"{task}_{term}": losses[term] for term in LOGGED[task]})
        self.task_batches[task] += 1
        if getattr(batch, "corpus", None) is not None:
            self.corpus_batches[f"{task}_{batch.corpus}"] += 1
        return self.hparams.task_loss_weights[task] * losses["loss"]

    def stage_figures(self):
        """Stage averages of each task's figures (over its batches), and the share of the batches of
        each task and of each corpus within it (``speech_<corpus>_share``: beside ``mix_targets``)."""
        total = max(sum(self.task_batches.values()), 1)
        counts = {**self.task_batches, **self.corpus_batches}
        return {**super().stage_figures(), **{f"{name}_share": count / total for name, count in counts.items()}}

    def on_stage_start(self, stage, epoch=None):
        """Fresh task and corpus counts (the base class starts the loader's epoch and the figure sums)."""
        super().on_stage_start(stage, epoch)
        self.task_batches, self.corpus_batches = defaultdict(int), defaultdict(int)

    def batch_budgets(self):
        streams = self.train_loader.streams
        budgets = {SPEECH: (leaf_loaders(streams[SPEECH])[0].config.max_batch_seconds, "padded seconds")}
        text = streams.get(TEXT) or streams.get(PAIRED)
        if text is not None:
            budgets["text"] = (leaf_loaders(text)[0].config.max_batch_tokens, "padded tokens")
        return budgets


def leaf_loaders(stream):
    """The speech or text loaders under ``stream`` (itself, or those a mix of corpora holds)."""
    return [leaf for inner in stream.streams.values() for leaf in leaf_loaders(inner)] \
        if isinstance(stream, MixedLoader) else [stream]


def mix_targets(mix):
    """``{task: share, task_corpus: share}`` the training mix aims at (corpus shares of the whole)."""
    targets = {}
    for task, share in mix.targets().items():
        targets[task] = share
        if isinstance(mix.streams[task], MixedLoader):
            targets.update({f"{task}_{corpus}": share * inner for corpus, inner in mix.streams[task].targets().items()})
    return targets


def speech_loader(hparams, parquets, training, rank=0, world_size=1, units=None):
    """Speech batches (texts unused: untranscribed shards welcome; ``units``, a UnitTable, as a batch
    field): this rank's share as the ``speech_loader`` block says, or every utterance as the
    ``eval_loader`` block says."""
    block = "speech_loader" if training else "eval_loader"
    config = SpeechLoaderConfig.from_config(hparams[block], block)
    return make_speech_loader(parquets, hparams["tokenizer_file"], config,
                              seed=hparams["seed"], rank=rank, world_size=world_size,
                              fbank=hparams["graph"]["compute_features"], require_text=False, units=units)


def text_loader(hparams, parquets, rank, world_size, paired):
    """Mono (``paired=False``, sources BART-noised in the loader unless ``text_task`` is ``lm``) or paired
    text batches of this rank, as the ``text_loader`` block says."""
    columns = hparams["paired_columns"] if paired else hparams["text_columns"]
    tokenizer = Tokenizer(hparams["tokenizer_file"])
    denoise = not paired and hparams["text_task"] == "denoise"
    return make_text_loader(parquets, tokenizer, TextLoaderConfig.from_config(hparams["text_loader"], "text_loader"),
                            seed=hparams["seed"], rank=rank, world_size=world_size,
                            noiser=make_noiser(hparams, tokenizer) if denoise else None, **columns)


def mix_report(mix, epoch=1):
    """Markdown: each task's and corpus's batches per epoch (natural) and its planned share of the mix."""
    targets = mix_targets(mix)
    rows = []
    for task, stream in mix.streams.items():
        inner = stream.streams if isinstance(stream, MixedLoader) else {}
        rows.append((task, stream.batches_in_epoch(epoch), targets[task]))
        rows += [(f"{task}_{corpus}", loader.batches_in_epoch(epoch), targets[f"{task}_{corpus}"])
                 for corpus, loader in inner.items()]
    lines = ["# Pretraining mix", "", f"{mix.total} batches per mixed epoch (this rank).", "",
             "| stream | batches per own epoch | planned share of the mix |", "|---|---|---|"]
    lines += [f"| {name} | {batches} | {share:.3f} |" for name, batches, share in rows]
    return "\n".join(lines) + "\n"


def write_mix_report(mix, hparams):
    """``data_report/report.md`` of the experiment: the planned mix (main process)."""
    if sb.utils.distributed.if_main_process():
        folder = os.path.join(hparams["output_folder"], "data_report")
        os.makedirs(folder, exist_ok=True)
        atomic_write_text(os.path.join(folder, REPORT_FILE), mix_report(mix))


def corpus_name(parquet):
    """A corpus's name: its shard folder's (speech) or its parquet file's stem (text)."""
    path = os.path.abspath(parquet)
    if os.path.basename(path).startswith("metadata_"):
        return os.path.basename(os.path.dirname(path))
    return os.path.splitext(os.path.basename(path))[0]


def weights_by_name(weights, names, option, what):
    """``option``'s weight of each of ``names`` (None: no weights given); a name without one is refused."""
    if weights is None:
        return None
    missing = [name for name in names if name not in weights]
    if missing:
        raise ValueError(f"{option} has no weight for {missing}: give one per {what} of {names}")
    return {name: weights[name] for name in names}


def corpus_mix(hparams, parquets, make_loader):
    """The corpora of one modality: one loader (``make_loader(parquets)``) of all of them, or, with
    ``corpus_mixing_alpha`` or ``corpus_weights`` and several corpora, one per corpus mixed by them."""
    alpha, weights = hparams["corpus_mixing_alpha"], hparams["corpus_weights"] or None
    if len(parquets) < 2 or (alpha is None and weights is None):
        return make_loader(parquets)
    names = [corpus_name(parquet) for parquet in parquets]
    if len(set(names)) < len(names):
        raise ValueError(f"corpora need distinct names (shard folder or parquet stem) to be mixed: {names}")
    weights = weights_by_name(weights, names, "corpus_weights", "corpus name")
    streams = {name: make_loader([parquet]) for name, parquet in zip(names, parquets)}
    return MixedLoader(streams, weights=weights, alpha=None if weights else alpha, seed=hparams["seed"], tag="corpus")


def training_mix(hparams, rank, world_size, units=None):
    """The MixedLoader of the configured modalities (speech always, with its ``units`` when the targets
    are k-means units; text and paired when given), each modality's corpora mixed as ``corpus_mix`` says."""
    streams = {SPEECH: corpus_mix(hparams, hparams["speech_parquets"],
                                  lambda parquets: speech_loader(hparams, parquets, True, rank, world_size, units))}
    if hparams["text_parquets"]:
        streams[TEXT] = corpus_mix(hparams, hparams["text_parquets"],
                                   lambda parquets: text_loader(hparams, parquets, rank, world_size, paired=False))
    if hparams["paired_parquets"]:
        streams[PAIRED] = corpus_mix(hparams, hparams["paired_parquets"],
                                     lambda parquets: text_loader(hparams, parquets, rank, world_size, paired=True))
    weights = weights_by_name(hparams["mixing_weights"] or None, list(streams), "mixing_weights", "task")
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
    check_text_task(hparams["text_task"])
    shutil.copy(hparams["tokenizer_file"], os.path.join(hparams["output_folder"], "tokenizer.model"))
    brain = JointPretraining(modules={"pretrain": hparams["pretrain_model"]}, opt_class=hparams["optimizer"],
                             hparams=hparams, run_opts=run_opts, checkpointer=hparams["checkpointer"])
    if hparams["speech_targets"] == "kmeans":
        unit_dirs = hparams["units_dirs"] + ([hparams["valid_units_dir"]] if hparams["valid_units_dir"] else [])
        brain.units = read_units(unit_dirs, expected_hash=hparams["kmeans_hash"])
    brain.train_loader = training_mix(hparams, *rank_and_world_size(), units=brain.units)
    logger.info("training mix targets: %s", ", ".join(
        f"{name} {share:.3f}" for name, share in mix_targets(brain.train_loader).items()))
    write_mix_report(brain.train_loader, hparams)
    if hparams["dry_run"]:
        logger.info("dry run: the planned mix is written; nothing was trained")
        return
    hparams["checkpointer"].add_recoverable("train_loader", brain.train_loader)
    if hparams["valid_parquet"]:
        brain.valid_loader = speech_loader(hparams, hparams["valid_parquet"], False, units=brain.units)
        brain.valid_loader.name = "valid"  # labels its end-of-pass log line
    brain.fit(hparams["epoch_counter"], brain.train_loader, brain.valid_loader)


if __name__ == "__main__":
    run_command(main, sys.argv[1:], cleanup=end_distributed)
