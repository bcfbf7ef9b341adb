#!/usr/bin/env python3
"""Finetune recipe: joint CTC/attention speech recognition (or translation) from shards.

    python recipes/finetune/train.py recipes/finetune/hparams/conformer.yaml \\
        --train_parquet=... --valid_parquet=... --test_parquets="[...]" --tokenizer_file=...

Trains the shared conformer encoder-decoder (recipes/hparams/model/conformer.yaml) with
(1 - dec_weight) * CTC + dec_weight * label-smoothed NLL, validates each epoch (greedy CTC by
default), then averages the best checkpoints and scores each test split with joint CTC/attention
beam search (WER/CER with alignments, BLEU for translation) into ``results.json``.
``do_train`` / ``do_test`` choose the phases (run.sh stages 2 and 3).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import logging  # noqa: E402
from collections import defaultdict  # noqa: E402

import speechbrain as sb  # noqa: E402

from common.data import Tokenizer, loader_features, make_speech_loader, speech_input  # noqa: E402
from common.decoding import beam_search, build_beam_searcher, ctc_greedy, ids_to_text  # noqa: E402
from common.evaluation import average_best_checkpoints, record_results  # noqa: E402
from common.metrics import TranscriptMetrics  # noqa: E402
from common.models.transfer import check_same_tokenizer, load_pretrained  # noqa: E402
from common.objectives import joint_ctc_attention_loss  # noqa: E402
from common.recipe import prepare_experiment  # noqa: E402
from common.training import (after_update, before_update, data_wait_share, log_effective_batch, rank_and_world_size,  # noqa: E402
                             record_batch, start_stage_clock)

logger = logging.getLogger(__name__)

LOSS_TERMS = ("ctc_loss", "nll_loss", "accuracy")


class ASR(sb.Brain):
    """Joint CTC/attention training; decoding and scoring in the evaluation stages.

    Set ``tokenizer`` (``common.data.Tokenizer``), ``prefix_ids`` (target prefix token ids) and,
    for training, ``train_loader`` before ``fit``; ``split`` names the split ``evaluate`` scores.
    """

    tokenizer, prefix_ids, train_loader, split = None, (), None, "test"

    def compute_forward(self, batch, stage):
        """Teacher-forced pass of both heads; returns (``EncoderDecoderOutput``, wav lengths)."""
        batch = batch.to(self.device)
        wavs, wav_lens = speech_input(batch)
        epoch = self.hparams.epoch_counter.current
        return self.modules.model(wavs, wav_lens, batch.tokens_bos.data, epoch=epoch), wav_lens

    def compute_objectives(self, predictions, batch, stage):
        """Joint loss (per-term figures kept for logging); evaluation stages also decode and score."""
        out, wav_lens = predictions
        losses = joint_ctc_attention_loss(
            out.ctc_log_probs, out.seq_log_probs, wav_lens, *batch.tokens, *batch.tokens_eos,
            dec_weight=self.hparams.dec_weight, label_smoothing=self.hparams.label_smoothing,
            ignore_prefix_tokens=len(self.prefix_ids))
        for term in LOSS_TERMS:
            self.term_sums[term] += float(losses[term])
        self.term_count += 1
        if stage != sb.Stage.TRAIN:
            self.score(out, wav_lens, batch, stage)
        return losses["loss"]

    def score(self, out, wav_lens, batch, stage):
        """Decode the batch with the stage's search and CTC greedy; add both to the metrics."""
        greedy = ids_to_text(self.tokenizer.processor, ctc_greedy(out.ctc_log_probs, wav_lens))
        self.metrics["ctc_greedy"].append(batch.id, greedy, batch.text)
        search = self.hparams.valid_search if stage == sb.Stage.VALID else self.hparams.test_search
        if search == "beam":
            hyps = ids_to_text(self.tokenizer.processor, beam_search(self.searcher, out.enc_states, wav_lens))
            self.metrics["beam"].append(batch.id, hyps, batch.text)

    def on_fit_batch_start(self, batch, should_step):
        """The learning rate of the coming update."""
        if should_step:
            before_update(self)

    def on_fit_batch_end(self, batch, outputs, loss, should_step):
        """Batch log line; per-term losses to TensorBoard every
        log_interval_steps."""
        record_batch(self, batch, loss)
        if should_step:
            after_update(self, loss, self.term_averages)

    def on_stage_start(self, stage, epoch=None):
        """Start the loader's epoch (resume-aware); fresh term sums and metrics."""
        if stage == sb.Stage.TRAIN and self.train_loader is not None:
            self.train_loader.set_epoch(epoch)
        start_stage_clock(self)
        self.term_sums, self.term_count = defaultdict(float), 0
        bleu = self.hparams.compute_bleu
        self.metrics = {"ctc_greedy": TranscriptMetrics(bleu=bleu), "beam": TranscriptMetrics(bleu=bleu)}

    def term_averages(self):
        """Stage averages of the per-term losses and the token accuracy."""
        return {term: total / max(self.term_count, 1) for term, total in self.term_sums.items()}

    def on_stage_end(self, stage, stage_loss, epoch=None):
        """Log the epoch's figures; checkpoint after validation; write results after a test split."""
        stats = {"loss": stage_loss, **self.term_averages()}
        if stage == sb.Stage.TRAIN:
            self.train_stats = {**stats, "data_wait": round(data_wait_share(self), 4)}
            return
        primary = self.primary_metrics(stage)
        stats.update({key.upper(): value for key, value in primary.summary().items()})
        if stage == sb.Stage.VALID:
            self.end_validation(epoch, stats)
        else:
            self.end_test(primary)

    def primary_metrics(self, stage):
        """The metrics of the stage's configured search."""
        search = self.hparams.valid_search if stage == sb.Stage.VALID else self.hparams.test_search
        return self.metrics[search]

    def end_validation(self, epoch, stats):
        """Log train + valid figures and keep the best checkpoints by ``best_checkpoint_key``."""
        meta = {"epoch": epoch, "lr": self.optimizer.param_groups[0]["lr"], "steps": self.optimizer_step}
        for logger_name in ("train_logger", "tensorboard_logger"):
            getattr(self.hparams, logger_name).log_stats(meta, train_stats=self.train_stats, valid_stats=stats)
        key = self.hparams.best_checkpoint_key
        self.checkpointer.save_and_keep_only(
            meta={key: stats[key], "epoch": epoch}, num_to_keep=self.hparams.keep_checkpoints,
            **{f"{name}s": [value] for name, value in ranking(key).items()})

    def end_test(self, primary):
        """Alignment files, results.json / results.txt and the test line of the train log (the main
        process writes them; under torchrun every rank scores the whole split)."""
        if not sb.utils.distributed.if_main_process():
            return
        folder = self.hparams.output_folder
        primary.write(folder, self.split)
        self.metrics["ctc_greedy"].write(folder, f"{self.split}_ctc_greedy")
        line = record_results(
            folder, self.split, primary.summary(), search=self.hparams.test_search,
            ctc_greedy=self.metrics["ctc_greedy"].summary(), config=self.hparams.config_file,
            checkpoint=os.path.join(folder, "averaged.ckpt"), averaged=self.averaged)
        logger.info("%s", line)
        self.hparams.train_logger.log_stats({"split": self.split}, test_stats=primary.summary())

    def on_fit_start(self):
        super().on_fit_start()
        log_effective_batch(self, {"speech": (self.hparams.max_batch_seconds, "padded seconds")})
        self.build_searcher()

    def on_evaluate_start(self, max_key=None, min_key=None):
        """Restore the best checkpoint, then average the best ``average_checkpoints`` into the model."""
        super().on_evaluate_start(max_key=max_key, min_key=min_key)
        self.averaged = average_best_checkpoints(
            self.checkpointer, self.modules.model, self.hparams.average_checkpoints,
            save_path=os.path.join(self.hparams.output_folder, "averaged.ckpt"),
            normalize=self.hparams.graph["normalize"], **ranking(self.hparams.best_checkpoint_key))
        self.build_searcher()

    def build_searcher(self):
        """The joint CTC/attention beam searcher over the model, configured from the yaml."""
        model = self.modules.model.module if hasattr(self.modules.model, "module") else self.modules.model
        self.searcher = build_beam_searcher(
            model, beam_size=self.hparams.beam_size, ctc_weight=self.hparams.ctc_weight,
            length_normalization=self.hparams.length_normalization, length_bonus=self.hparams.length_bonus,
            max_decode_ratio=self.hparams.max_decode_ratio, prefix_tokens=self.prefix_ids)


def ranking(key):
    """Checkpointer keyword for ``key``: BLEU is better higher, error rates lower."""
    if key not in ("WER", "CER", "BLEU"):
        raise ValueError(f"best_checkpoint_key={key!r}: use WER, CER or BLEU (with compute_bleu: True)")
    return {"max_key": key} if key == "BLEU" else {"min_key": key}


def speech_loader(hparams, parquet, training, rank=0, world_size=1):
    """A loader over ``parquet``: training with filters, speed perturbation and this rank's share;
    evaluation with every utterance, in one process (results are written by the main process)."""
    common = dict(tokenizer=hparams["tokenizer_file"], seed=hparams["seed"], text_field=hparams["text_field"],
                  prefix_tokens=hparams["prefix_tokens"])
    if training:
        loader = make_speech_loader(parquet, max_batch_seconds=hparams["max_batch_seconds"],
                                    max_batch_size=hparams["max_batch_size"], num_workers=hparams["num_workers"],
                                    buffer_size=hparams["batch_buffer"], rank=rank, world_size=world_size,
                                    filters=hparams["filters"], speed_perturb=hparams["speed_perturb"],
                                    cache_audio=hparams["cache_audio"],
                                    features=loader_features(hparams), **common)
    else:
        loader = make_speech_loader(parquet, max_batch_seconds=hparams["eval_max_batch_seconds"],
                                    max_batch_size=hparams["max_batch_size"], num_workers=0, **common)
    loader.name = "train" if training else split_name(parquet)  # labels its end-of-pass log line
    return loader


def split_name(parquet):
    """A test split's name: its shard folder's name (data/shards/test/metadata_pool.parquet -> test)."""
    return os.path.basename(os.path.dirname(os.path.abspath(parquet)))


def init_from_pretrained(hparams):
    """Load the pretrained graph and feature statistics by name (a resumed run's own checkpoint,
    recovered when fit starts, overrides them)."""
    check_same_tokenizer(hparams["pretrained"], hparams["tokenizer_file"])
    load_pretrained(hparams["pretrained"], {"model": hparams["model"], "normalize": hparams["graph"]["normalize"]},
                    collect_in=os.path.join(hparams["save_folder"], "pretrained"))


def input_keys(hparams):
    """The config keys naming files this run reads (checked before any work)."""
    return (["tokenizer_file", "pretrained"] + (["train_parquet", "valid_parquet"] if hparams["do_train"] else [])
            + (["test_parquets"] if hparams["do_test"] else []))


def build_brain(argv, brain_class=ASR):
    """``(brain, hparams)`` of ``train.py`` arguments: the checked config, the experiment folder and
    a ``brain_class`` Brain with its tokenizer and target prefix."""
    hparams, run_opts = prepare_experiment(argv, input_keys)
    hparams["config_file"] = argv[0]
    brain = brain_class(modules={"model": hparams["model"]}, opt_class=hparams["optimizer"], hparams=hparams,
                        run_opts=run_opts, checkpointer=hparams["checkpointer"])
    brain.tokenizer = Tokenizer(hparams["tokenizer_file"])
    brain.prefix_ids = [brain.tokenizer.piece_id(token) for token in hparams["prefix_tokens"]]
    return brain, hparams


def main(argv):
    brain, hparams = build_brain(argv)
    if hparams["do_train"] and hparams["pretrained"]:
        init_from_pretrained(hparams)
    if hparams["do_train"]:
        brain.train_loader = speech_loader(hparams, hparams["train_parquet"], True, *rank_and_world_size())
        hparams["checkpointer"].add_recoverable("train_loader", brain.train_loader)
        brain.fit(hparams["epoch_counter"], brain.train_loader,
                  speech_loader(hparams, hparams["valid_parquet"], False))
    if hparams["do_test"]:
        for parquet in hparams["test_parquets"]:
            brain.split = split_name(parquet)
            brain.evaluate(speech_loader(hparams, parquet, False), **ranking(hparams["best_checkpoint_key"]))


if __name__ == "__main__":
    main(sys.argv[1:])
