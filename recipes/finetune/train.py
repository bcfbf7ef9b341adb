#!/usr/bin/env python3
"""Finetune recipe: joint CTC/attention speech recognition (or translation) from shards.

    python recipes/finetune/train.py recipes/finetune/hparams/conformer.yaml \\
        --train_parquet=... --valid_parquet=... --test_parquets="[...]" --tokenizer_file=...

Trains the shared conformer encoder-decoder (recipes/hparams/model/conformer.yaml) with
(1 - dec_weight) * CTC + dec_weight * label-smoothed NLL, validates each epoch (greedy CTC by
default), then averages the best checkpoints and scores each test split with joint CTC/attention
beam search (WER/CER with alignments, BLEU for translation) into ``results.json``.
``do_train`` / ``do_test`` choose the phases (run.sh stages 2 and 3).

With ``mt_parquets`` (YiTrans' step 2) the finetune is multitask: machine translation pairs join the
speech, one task per batch, mixed with temperature ``task_mixing_alpha``; an ``mt`` batch goes through
the text path of the same graph (source tokens → shared embedding → encoder → decoder) and trains the
decoder's NLL times ``mt_loss_weight``. Validation and test stay speech.
"""

import logging
import os
import sys

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
from common.data.report import add_memory_estimate, report_markdown, speech_loader_report, write_report
from common.decoding import beam_search, build_beam_searcher, ctc_greedy, ids_to_text
from common.evaluation import average_best_checkpoints, record_results
from common.feasibility import warn_if_infeasible
from common.inference import load_language_model
from common.metrics import TranscriptMetrics
from common.models.encoder_decoder import parameter_group
from common.models.experiment import AVERAGED_FILE
from common.models.pretraining import text_to_text
from common.models.transfer import check_same_tokenizer, load_pretrained
from common.objectives import check_inter_ctc, check_reduction, drop_prefix, joint_ctc_attention_loss, sequence_loss
from common.recipe import end_distributed, prepare_experiment
from common.streaming import check_streamable
from common.user_errors import UserValueError, run_command

logger = logging.getLogger(__name__)

ASR_STREAM, MT = "asr", "mt"  # the tasks of a multitask finetune (batch.stream)


class ASR(RecipeBrain):
    """Joint CTC/attention training; decoding and scoring in the evaluation stages.

    Set ``tokenizer`` (``common.data.Tokenizer``), ``prefix_ids`` (target prefix token ids) and,
    for training, ``train_loader`` before ``fit``; ``split`` names the split ``evaluate`` scores.
    """

    tokenizer, prefix_ids, split = None, (), "test"

    @property
    def checkpoint_key(self):
        """The validation figure that ranks checkpoints (``best_checkpoint_key``); None for the last."""
        key = self.hparams.best_checkpoint_key
        return None if key == "last" else key

    @property
    def higher_is_better(self):
        return self.hparams.best_checkpoint_key == "BLEU"

    def on_fit_batch_start(self, batch, should_step):
        """The schedule's step (base class), and the encoder frozen for the first
        ``freeze_encoder_steps`` updates."""
        super().on_fit_batch_start(batch, should_step)
        self.freeze_encoder(self.optimizer_step < self.hparams.freeze_encoder_steps)

    def freeze_encoder(self, frozen):
        """Stop (or resume) training the encoder: its parameters get no gradients while ``frozen``."""
        if getattr(self, "encoder_frozen", False) == frozen:
            return
        for name, parameter in self.hparams.model.named_parameters():
            if parameter_group(name) == "encoder":
                parameter.requires_grad = not frozen
        self.encoder_frozen = frozen
        logger.info("encoder %s at update %d", "frozen" if frozen else "trained", self.optimizer_step)

    def parameter_group(self, name):
        """``encoder``, ``ctc``, ``cross_attention`` or ``language_model`` (``lr_scales`` keys)."""
        return parameter_group(name.removeprefix("model."))

    def compute_forward(self, batch, stage):
        """Teacher-forced pass of both heads; returns (``EncoderDecoderOutput``, wav lengths); an MT
        batch (multitask finetune) returns (decoder log-probabilities, None)."""
        batch = batch.to(self.device)
        if getattr(batch, "stream", None) == MT:
            return text_to_text(self.modules.model, *batch.src_tokens, batch.tokens_bos.data), None
        wavs, wav_lens = speech_input(batch)
        epoch = self.hparams.epoch_counter.current
        chunked = self.hparams.chunk_training and self.optimizer_step >= self.hparams.chunk_warmup_steps
        chunks = self.hparams.chunk_sampler(stage) if chunked else None  # the sampler gives None in evaluation
        return self.network(stage)(wavs, wav_lens, batch.tokens_bos.data, epoch=epoch,
                                   dynchunktrain_config=chunks), wav_lens

    def compute_objectives(self, predictions, batch, stage):
        """Joint loss (per-term figures kept for logging); evaluation stages also decode and score."""
        out, wav_lens = predictions
        if wav_lens is None:
            return self.translation_loss(out, batch)
        losses = joint_ctc_attention_loss(
            out.ctc_log_probs, out.seq_log_probs, wav_lens, *batch.tokens, *batch.tokens_eos,
            dec_weight=self.hparams.dec_weight, label_smoothing=self.hparams.label_smoothing,
            ignore_prefix_tokens=len(self.prefix_ids), inter_ctc_log_probs=out.inter_ctc_log_probs,
            inter_ctc_weight=self.hparams.inter_ctc_weight, loss_reduction=self.hparams.loss_reduction)
        self.add_figures({term: value for term, value in losses.items() if term != "loss"})
        if stage != sb.Stage.TRAIN:
            self.score(out, wav_lens, batch, stage)
        return losses["loss"]

    def translation_loss(self, seq_log_probs, batch):
        """An MT batch's label-smoothed decoder NLL (its target prefix, like speech's, not predicted) times
        ``mt_loss_weight``; ``mt_nll_loss`` and ``mt_accuracy`` logged."""
        seq_log_probs, lens = drop_prefix(seq_log_probs, batch.tokens_eos.lengths, len(self.prefix_ids))
        targets, _ = drop_prefix(batch.tokens_eos.data, batch.tokens_eos.lengths, len(self.prefix_ids))
        losses = sequence_loss(seq_log_probs, targets, lens, label_smoothing=self.hparams.label_smoothing,
                               loss_reduction=self.hparams.loss_reduction)
        self.add_figures({"mt_nll_loss": losses["per_token"], "mt_accuracy": losses["accuracy"]})
        return self.hparams.mt_loss_weight * losses["loss"]

    def score(self, out, wav_lens, batch, stage):
        """Decode the batch with the stage's search and CTC greedy; add both to the metrics."""
        greedy = ids_to_text(self.tokenizer.processor, ctc_greedy(out.ctc_log_probs, wav_lens))
        self.metrics["ctc_greedy"].append(batch.id, greedy, batch.text)
        if self.search(stage) == "beam":
            hyps = ids_to_text(self.tokenizer.processor, beam_search(self.searcher, out.enc_states, wav_lens))
            self.metrics["beam"].append(batch.id, hyps, batch.text)

    def search(self, stage):
        """The stage's configured search: ``ctc_greedy`` or ``beam``."""
        return self.hparams.valid_search if stage == sb.Stage.VALID else self.hparams.test_search

    def batch_budgets(self):
        budgets = {"speech": (speech_part(self.train_loader).config.max_batch_seconds, "padded seconds")}
        if isinstance(self.train_loader, MixedLoader):
            budgets["mt"] = (self.train_loader.streams[MT].config.max_batch_tokens, "padded tokens")
        return budgets

    def on_stage_start(self, stage, epoch=None):
        """Fresh metrics for each stage (the base class starts the loader's epoch)."""
        super().on_stage_start(stage, epoch)
        bleu = self.hparams.compute_bleu
        self.metrics = {"ctc_greedy": TranscriptMetrics(bleu=bleu), "beam": TranscriptMetrics(bleu=bleu)}

    def evaluation_state(self):
        """Each search's (ids, hypotheses, references) of this rank's share of the split."""
        return {name: metrics.state() for name, metrics in self.metrics.items()}

    def merge_evaluation_states(self, states):
        """Every rank's hypotheses in one set of metrics per search (rank order)."""
        bleu = self.hparams.compute_bleu
        self.metrics = {name: TranscriptMetrics.merged([state[name] for state in states], bleu=bleu)
                        for name in self.metrics}

    def evaluation_figures(self, stage):
        """WER / CER (and BLEU) of the stage's search, upper-case as the checkpoints rank them."""
        return {key.upper(): value for key, value in self.metrics[self.search(stage)].summary().items()}

    def end_test(self, stats):
        """Alignment and hypothesis files, results.json / results.txt and the test line of the train log
        (the main process writes them; under torchrun each rank decoded a share of the split)."""
        folder, primary = self.hparams.output_folder, self.metrics[self.hparams.test_search]
        if sb.utils.distributed.if_main_process():
            primary.write(folder, self.split)
            self.metrics["ctc_greedy"].write(folder, f"{self.split}_ctc_greedy")
            line = record_results(
                folder, self.split, primary.summary(), search=self.hparams.test_search,
                ctc_greedy=self.metrics["ctc_greedy"].summary(), config=self.hparams.config_file,
                checkpoint=os.path.join(folder, AVERAGED_FILE), averaged=self.averaged)
            logger.info("%s", line)
        # every rank calls it: SpeechBrain's logger writes on the main process and broadcasts
        self.hparams.train_logger.log_stats({"split": self.split}, test_stats=primary.summary())

    def on_fit_start(self):
        super().on_fit_start()
        self.build_searcher()

    def on_evaluate_start(self, max_key=None, min_key=None):
        """Restore the best checkpoint, then average the best ``average_checkpoints`` into the model."""
        super().on_evaluate_start(max_key=max_key, min_key=min_key)
        self.averaged = average_best_checkpoints(  # the checkpoints hold the model's own keys, not DDP's
            self.checkpointer, self.bare_model(), self.hparams.average_checkpoints,
            save_path=os.path.join(self.hparams.output_folder, AVERAGED_FILE),
            normalize=self.hparams.graph["normalize"], **self.ranking())
        self.build_searcher()

    def bare_model(self):
        """The model itself: under torchrun ``self.modules.model`` is its DDP wrapper."""
        model = self.modules.model
        return model.module if hasattr(model, "module") else model

    def ranking(self):
        """``min_key`` / ``max_key`` of the checkpoint figure, for ``evaluate`` and averaging
        (nothing: the most recent checkpoints)."""
        if self.checkpoint_key is None:
            return {}
        return {("max_key" if self.higher_is_better else "min_key"): self.checkpoint_key}

    def build_searcher(self):
        """The joint CTC/attention beam searcher over the model, configured from the yaml."""
        self.searcher = build_beam_searcher(
            self.bare_model(), beam_size=self.hparams.beam_size, ctc_weight=self.hparams.ctc_weight,
            length_normalization=self.hparams.length_normalization, length_bonus=self.hparams.length_bonus,
            max_decode_ratio=self.hparams.max_decode_ratio, prefix_tokens=self.prefix_ids,
            lm=self.language_model(), lm_weight=self.hparams.lm_weight)

    def language_model(self):
        """The ``lm_dir`` language model for shallow fusion (loaded once); None without one."""
        if not self.hparams.lm_dir or self.hparams.lm_weight <= 0.0:
            return None
        if getattr(self, "lm", None) is None:
            self.lm = load_language_model(self.hparams.lm_dir, self.hparams.tokenizer_file, self.device)
        return self.lm


def check_checkpoint_key(key):
    """Raises ValueError for a ``best_checkpoint_key`` the recipe cannot rank by."""
    if key not in ("WER", "CER", "BLEU", "last"):
        raise ValueError(f"best_checkpoint_key={key!r}: use WER or CER (lower is better), BLEU (with "
                         "compute_bleu: True) or last (the most recent epochs)")


def speech_loader(hparams, parquet, training, rank=0, world_size=1):
    """This rank's loader over ``parquet``: its shards as the ``train_loader`` block says, or its
    share of the batches as the ``eval_loader`` block says (decoding split across ranks; the
    figures are gathered and the results written by the main process)."""
    block = "train_loader" if training else "eval_loader"
    config = SpeechLoaderConfig.from_config(hparams[block], block)
    loader = make_speech_loader(parquet, hparams["tokenizer_file"], config,
                                seed=hparams["seed"], rank=rank, world_size=world_size,
                                fbank=hparams["graph"]["compute_features"], text_field=hparams["text_field"],
                                prefix_tokens=hparams["prefix_tokens"], share="shards" if training else "batches")
    loader.name = "train" if training else split_name(parquet)  # labels its end-of-pass log line
    return loader


def training_loader(hparams, rank=0, world_size=1):
    """The training batches: the speech of ``train_parquet``, or, with ``mt_parquets``, the speech and the
    translation pairs (``mt_columns``, batched as ``mt_loader`` says) mixed by ``task_mixing_alpha``."""
    speech = speech_loader(hparams, hparams["train_parquet"], True, rank, world_size)
    if not hparams["mt_parquets"]:
        return speech
    if world_size > 1:
        raise UserValueError("mt_parquets (multitask finetune) needs one process: its text pass runs beside the "
                         "DDP wrapper; train it without torchrun, or leave mt_parquets empty")
    if hparams["prefix_tokens"] and not hparams["mt_columns"].get("target_lang_column"):
        raise UserValueError(f"prefix_tokens={hparams['prefix_tokens']} but mt_columns has no target_lang_column: MT "
                         "targets would lack the tag the speech targets start with; set mt_columns.target_lang_column")
    config = TextLoaderConfig.from_config(hparams["mt_loader"], "mt_loader")
    mt = make_text_loader(hparams["mt_parquets"], hparams["tokenizer_file"], config, seed=hparams["seed"], rank=rank,
                          world_size=world_size, **hparams["mt_columns"])
    mix = MixedLoader({ASR_STREAM: speech, MT: mt}, alpha=hparams["task_mixing_alpha"], seed=hparams["seed"])
    logger.info("multitask finetune: %s", ", ".join(f"{name} {share:.3f}" for name, share in mix.targets().items()))
    return mix


def speech_part(loader):
    """The speech loader of the training batches (itself, or the speech stream of a task mix)."""
    return loader.streams[ASR_STREAM] if isinstance(loader, MixedLoader) else loader


def training_data_report(loader, tokenizer, model):
    """The training data's report (``common.data.report``); warns, with the numbers and the setting to
    change, when CTC cannot align (or barely aligns) the transcripts with the encoder's frame rate."""
    report = add_memory_estimate(speech_loader_report(loader, tokenizer, model.frames_per_second()), model)
    warn_if_infeasible(report["_feasibility"], "training data")
    return report


def write_data_report(report, hparams):
    """The report in ``data_report/`` of the experiment folder, and its histograms in TensorBoard
    (main process)."""
    if not sb.utils.distributed.if_main_process():
        return
    write_report(report, os.path.join(hparams["output_folder"], "data_report"), title="Training data")
    writer = hparams["tensorboard_logger"].writer
    writer.add_histogram("data/duration_s", report["_durations"], 0)
    writer.add_histogram("data/tokens_per_second", report["_tokens_per_second"], 0)
    writer.add_text("data/report", report_markdown(report, "Training data"), 0)


def split_name(parquet):
    """A test split's name: its shard folder's name (data/shards/test/metadata_pool.parquet -> test)."""
    return os.path.basename(os.path.dirname(os.path.abspath(parquet)))


def init_from_pretrained(hparams):
    """Load the pretrained graph's ``pretrained_parts`` and, with the encoder, the feature statistics,
    by name (a resumed run's own checkpoint, recovered when fit starts, overrides them)."""
    check_same_tokenizer(hparams["pretrained"], hparams["tokenizer_file"])
    model, parts = hparams["model"], set(hparams["pretrained_parts"])
    groups = {parameter_group(name) for name, _ in model.named_parameters()}
    if not parts or parts - groups:
        raise UserValueError(f"pretrained_parts={sorted(parts)}: name one or more of {sorted(groups)}, e.g. "
                             "--pretrained_parts='[cross_attention, language_model]'")
    above = fresh_encoder_layers(hparams, parts)
    fresh = {name: tensor.clone() for name, tensor in model.state_dict().items()  # buffers included
             if _group_of(name) not in (None, *parts) or name.removeprefix("module.").startswith(above)}
    loadables = {"model": model, **({"normalize": hparams["graph"]["normalize"]} if "encoder" in parts else {})}
    load_pretrained(hparams["pretrained"], loadables, collect_in=os.path.join(hparams["save_folder"], "pretrained"))
    if fresh:
        model.load_state_dict(fresh, strict=False)
        logger.info("pretrained parts %s loaded; %s keep their fresh initialisation", sorted(parts),
                    sorted(groups - parts) + list(above))


def fresh_encoder_layers(hparams, parts):
    """State-dict prefixes that ``pretrained_encoder_layers: N`` leaves fresh: the conformer layers from
    index N up and, when there are any, the encoder's final norm (none when the key is null)."""
    keep, layers = hparams.get("pretrained_encoder_layers"), hparams["num_encoder_layers"]
    if keep is None:
        return ()
    if "encoder" not in parts or not 0 <= keep <= layers:
        raise UserValueError(f"pretrained_encoder_layers={keep}: give 0 to {layers} (the encoder's layers) with "
                             f"encoder in pretrained_parts (now {sorted(parts)}), or null for every layer")
    fresh = tuple(f"transformer.encoder.layers.{index}." for index in range(keep, layers))
    return fresh + ("transformer.encoder.norm.",) if fresh else ()


def _group_of(name):
    """The parameter group of a state-dict entry; None for one of no group (e.g. a feature buffer)."""
    try:
        return parameter_group(name)
    except ValueError:
        return None


def input_keys(hparams):
    """The config keys naming files this run reads (checked before any work)."""
    return (["tokenizer_file", "pretrained"]
            + (["train_parquet", "valid_parquet", "mt_parquets"] if hparams["do_train"] else [])
            + (["test_parquets", "lm_dir"] if hparams["do_test"] else []))


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
    check_checkpoint_key(hparams["best_checkpoint_key"])
    check_inter_ctc(hparams["inter_ctc_weight"], len(hparams["inter_ctc_layers"]))
    check_reduction(hparams["loss_reduction"])
    if hparams["chunk_training"]:
        check_streamable(hparams["model"], "chunk_training: True")
    if hparams["freeze_encoder_steps"] and rank_and_world_size()[1] > 1:
        raise ValueError("freeze_encoder_steps needs one process: DDP expects every parameter's gradient "
                         "in every update; set it to 0 under torchrun")
    if hparams["do_train"] and hparams["pretrained"]:
        init_from_pretrained(hparams)
    if hparams["do_train"]:
        brain.train_loader = training_loader(hparams, *rank_and_world_size())
        report = training_data_report(speech_part(brain.train_loader), brain.tokenizer, hparams["model"])
        write_data_report(report, hparams)
        if hparams["dry_run"]:
            cards = ", ".join(f"{card['card_gb']} GB: {'fits' if card['fits'] else 'does not fit'}"
                              for card in report["cards"])
            logger.info("dry run: the data report is written; nothing was trained. Largest batch %.2f GiB "
                        "(estimate, fp32): %s", report["memory"]["total_gib"], cards)
            return
        hparams["checkpointer"].add_recoverable("train_loader", brain.train_loader)
        brain.fit(hparams["epoch_counter"], brain.train_loader,
                  speech_loader(hparams, hparams["valid_parquet"], False, *rank_and_world_size()))
    if hparams["do_test"]:
        for parquet in hparams["test_parquets"]:
            test_loader = speech_loader(hparams, parquet, False, *rank_and_world_size())
            brain.split = test_loader.name  # names its results, alignments and log line
            brain.evaluate(test_loader, **brain.ranking())


if __name__ == "__main__":
    run_command(main, sys.argv[1:], cleanup=end_distributed)
