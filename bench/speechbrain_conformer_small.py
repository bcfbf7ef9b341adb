"""SpeechBrain's own training loop and data pipeline: the baselines of ``bench/learning.py``.

Everything here is SpeechBrain's: ``DynamicItemDataset`` over the corpus manifests (audio decoded
once and kept in memory, as a 2 h corpus allows), ``DynamicBatchSampler``, ``Brain.fit`` with Noam
warmup, Fbank + ``InputNormalization``, its per-batch ``SpeedPerturb``, its SpecAugment
(``Warping`` + two ``SpectrogramDrop``), the (64, 32) CNN front-end (40 ms frames), ``TransformerASR``
(conformer), CTC + KL-divergence losses, per-epoch greedy-CTC validation, checkpoints ranked and the
best averaged (``average_checkpoints``), and the ``S2STransformerBeamSearcher`` with its
``CTCScorer`` and, with ``--lm-dir``, its ``RNNLMScorer`` (the LM trained by ``recipes/lm`` on the same
tokenizer's pieces: only its weights come from Tandem, the fusion is SpeechBrain's).

Two settings (``--settings``):

- ``same_model``: what a competent SpeechBrain user would configure for Tandem's 2 h task, i.e. the
  values of ``recipes/finetune/hparams/small.yaml`` (read from it, with the same ``--overrides`` Tandem
  gets): model sizes, dropout, sentence normalisation, the character tokenizer, speed perturbation,
  SpecAugment counts and widths, duration and characters-per-second filters, batch seconds and size,
  AdamW with its rate, warmup, betas and weight decay, gradient clipping, CTC weight, label smoothing,
  the checkpoints averaged and the key that ranks them. SpeechBrain perturbs the speed per batch
  (Tandem per utterance) and reads the original audio files (Tandem Opus-coded shards). Not copied:
  small.yaml's intermediate CTC (since recipes/finetune/RESULTS.md ic2), an objective SpeechBrain's
  LibriSpeech recipes do not have; the Tandem legs keep it, as shipped.
- ``librispeech``: SpeechBrain's LibriSpeech recipe (``recipes/LibriSpeech/ASR/transformer``,
  ``conformer_small.yaml``) as it is written (12 encoder / 4 decoder layers, d_ffn 1024, dropout 0.1,
  global normalisation, speed 95/100/105, 4 + 4 wide masks, CTC weight 0.3, Adam 1e-3, 10 checkpoints
  averaged by validation loss), scaled to the CPU budget only where it must be: the padded seconds per
  batch (60), the warmup (300 updates, the share of the run 25,000 of LibriSpeech's ~200,000 are) and a
  unigram tokenizer of the corpus (5,000 pieces do not exist in 2 h of text). ``--overrides`` reach the
  keys it has (model sizes, batch, warmup: the smoke test's tiny model); the rest are logged and unused.

Training ends at the update that spends ``--minutes`` and validates that epoch (as Tandem's
``train_minutes``). Then every decoding setting of the grid (``--beams`` x ``--ctc-weights`` x ``--lm-weights``)
decodes dev, the lowest dev WER is chosen (``bench/dev_choice.py``) and decodes each test split once.
The output folder holds ``save/`` (checkpoints), ``trained.json`` (the training figures: minutes,
epochs, updates, audio hours, data-wait share), ``hyp_<split>.jsonl`` per decoded split and
``results.json``. A folder with ``trained.json`` is not trained again; one without it (an interrupted
run) is trained from the start, since its wall clock cannot be resumed honestly. ``--trained FOLDER``
decodes the model trained there (the ``+lm`` leg of ``bench/learning.py``).

    python bench/speechbrain_conformer_small.py --settings same_model --data data/open \\
        --tokenizer data/open/tokenizer/char.model --out exp/sb_same --minutes 20
    python bench/speechbrain_conformer_small.py --settings same_model --data data/open \\
        --tokenizer data/open/tokenizer/char.model --out exp/sb_same_lm --trained exp/sb_same \\
        --lm-dir exp/bench_learning/lm --lm-weights 0.5 1.0
"""

import argparse
import json
import logging
import os
import shutil
import sys
import time

import ruamel.yaml
import sentencepiece
import soundfile
import speechbrain as sb
import speechbrain.augment.time_domain
import speechbrain.lobes.features
import speechbrain.nnet.schedulers
import speechbrain.processing.features
import torch
import torchaudio.functional
from speechbrain.dataio.sampler import DynamicBatchSampler
from speechbrain.decoders import S2STransformerBeamSearcher
from speechbrain.decoders.scorer import CTCScorer, ScorerBuilder

from bench import dev_choice, stats
from common.atomic import atomic_write_text
from common.decoding import lm_scorer
from common.inference import load_language_model
from common.metrics import TranscriptMetrics
from common.recipe import check_keys, preview_config, read_yaml_tree, resolve_derived_config

logger = logging.getLogger(__name__)
RATE = 16000
BLANK, BOS, EOS = 0, 1, 2  # the tokenizer contract of local/train_tokenizer.py
SMALL_YAML = "recipes/finetune/hparams/small.yaml"
TRAINED, RESULTS = "trained.json", "results.json"

# SpeechBrain's LibriSpeech conformer_small.yaml, with the CPU scalings the docstring names.
LIBRISPEECH = {
    "token_type": "unigram", "d_model": 144, "nhead": 4, "num_encoder_layers": 12, "num_decoder_layers": 4,
    "d_ffn": 1024, "dropout": 0.1, "attention_type": "RelPosMHAXL", "conformer_kernel_size": 31, "n_mels": 80,
    "frontend_stride": 2, "frontend_channels": 64, "frontend_out_channels": 32, "frontend_dropout": 0.1,
    "normalize_type": "global", "speed_perturb": [0.95, 1.0, 1.05], "spec_augment_prob": 1.0,
    "time_warp_window": 5, "time_drop_count": [4, 4], "time_drop_width": [15, 25], "freq_drop_count": [4, 4],
    "freq_drop_width": [10, 20], "drop_replace": "mean", "max_batch_seconds": 60.0, "max_batch_size": 128,
    "min_duration": 0.0, "max_duration": 1e9, "max_tokens_per_second": 1e9, "number_of_epochs": 10_000,
    "optimizer": "Adam", "lr_peak": 1e-3, "warmup_steps": 300, "adam_betas": [0.9, 0.98], "weight_decay": 0.0,
    "adam_eps": 1e-9, "max_grad_norm": 5.0, "dec_weight": 0.7, "label_smoothing": 0.0, "keep_checkpoints": 10,
    "average_checkpoints": 10, "best_checkpoint_key": "loss",
}
SETTINGS = ("same_model", "librispeech")
# small.yaml keys copied as they are into the same_model settings.
SAME_KEYS = ("token_type", "d_model", "nhead", "num_encoder_layers", "num_decoder_layers", "d_ffn", "dropout",
             "attention_type", "conformer_kernel_size", "n_mels", "frontend_stride", "frontend_channels",
             "frontend_out_channels", "frontend_dropout", "normalize_type", "spec_augment_prob", "number_of_epochs",
             "lr_peak", "warmup_steps", "adam_betas", "weight_decay", "max_grad_norm", "dec_weight",
             "label_smoothing", "keep_checkpoints", "average_checkpoints", "best_checkpoint_key")


def parse_overrides(overrides):
    """``{key: value}`` of ``--key=value`` words (train.py's command-line overrides)."""
    _, _, text = sb.parse_arguments([SMALL_YAML, *overrides])
    return dict(ruamel.yaml.YAML(typ="safe").load(text or "") or {})


def small_yaml_values(overrides, config=SMALL_YAML):
    """small.yaml's resolved values with ``overrides`` (``--key=value`` words) on top, as train.py reads
    them (its input paths are not needed here)."""
    base, values = resolve_derived_config(config, parse_overrides(overrides))
    check_keys(values, read_yaml_tree(base), f"{base} (the base of {config})")
    values.update({key: "unused" for key in ("train_parquet", "valid_parquet", "tokenizer_file")})
    values["test_parquets"] = []
    return preview_config(base, values)


def same_model_settings(overrides=()):
    """The ``same_model`` settings: small.yaml's values (with ``overrides``) in SpeechBrain's terms."""
    values = small_yaml_values(overrides)
    if values["pretrained"]:
        raise ValueError("the same_model leg has no pretrained start: leave pretrained unset in the overrides")
    loader = values["train_loader"]
    filters = loader.get("filters") or {}
    return plain({**{key: values[key] for key in SAME_KEYS},
            "speed_perturb": list(loader.get("speed_perturb") or [1.0]),
            "time_warp_window": 5,  # recipes/hparams/model/conformer.yaml's
            "time_drop_count": [0, values["time_drop_count"]], "time_drop_width": [0, values["time_drop_width"]],
            "freq_drop_count": [0, values["freq_drop_count"]], "freq_drop_width": [0, values["freq_drop_width"]],
            "drop_replace": "zeros", "max_batch_seconds": float(loader["max_batch_seconds"]),
            "max_batch_size": int(loader["max_batch_size"]), "optimizer": "AdamW", "adam_eps": 1e-8,  # torch's
            "min_duration": float(filters.get("min_duration") or 0.0),
            "max_duration": float(filters.get("max_duration") or 1e9),
            "max_tokens_per_second": float(filters.get("max_tokens_per_second") or 1e9)})


def plain(values):
    """``values`` as plain Python numbers, strings and lists (YAML's scalar types do not unpickle under
    torch.load's weights_only, and the optimizer's checkpoint holds its rates)."""
    return json.loads(json.dumps(values))


def leg_settings(name, overrides=()):
    """The settings of ``name`` (``same_model`` or ``librispeech``) with ``overrides`` applied."""
    if name == "same_model":
        return same_model_settings(overrides)
    settings, unused = dict(LIBRISPEECH), []
    for key, value in parse_overrides(overrides).items():
        if key in settings:
            settings[key] = value
        else:
            unused.append(key)
    if unused:
        logger.info("overrides the librispeech settings do not have, unused: %s", unused)
    return plain(settings)


def read_audio(path):
    """Mono float32 at 16 kHz of any file libsndfile reads."""
    audio, rate = soundfile.read(path, dtype="float32", always_2d=True)
    audio = torch.from_numpy(audio.mean(axis=1))
    return torchaudio.functional.resample(audio, rate, RATE) if rate != RATE else audio


def dataset(manifest, tokenizer, settings=None):
    """A ``DynamicItemDataset`` of a jsonl manifest (audio paths relative to it), audio kept in memory
    once decoded; with ``settings`` (training) the duration and tokens-per-second filters apply, the
    rate counted at the fastest speed perturbation (as Tandem's loader counts it)."""
    root = os.path.dirname(os.path.abspath(manifest))
    with open(manifest, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    fastest = max(settings["speed_perturb"]) if settings else 1.0
    data = {row["id"]: {"wav": os.path.join(root, row["audio"]), "text": row["text"], "duration": row["duration"],
                        "tokens_per_second": len(tokenizer.encode_as_ids(row["text"])) * fastest / row["duration"]}
            for row in rows}
    ds = sb.dataio.dataset.DynamicItemDataset(data)
    if settings:
        ds = ds.filtered_sorted(key_min_value={"duration": settings["min_duration"]},
                                key_max_value={"duration": settings["max_duration"],
                                               "tokens_per_second": settings["max_tokens_per_second"]})
    cache = {}

    @sb.utils.data_pipeline.takes("wav")
    @sb.utils.data_pipeline.provides("sig")
    def audio_pipeline(wav):
        if wav not in cache:
            cache[wav] = read_audio(wav)
        return cache[wav]

    @sb.utils.data_pipeline.takes("text")
    @sb.utils.data_pipeline.provides("text", "tokens_bos", "tokens_eos", "tokens")
    def text_pipeline(text):
        yield text
        ids = tokenizer.encode_as_ids(text)
        yield torch.LongTensor([BOS] + ids)
        yield torch.LongTensor(ids + [EOS])
        yield torch.LongTensor(ids)

    sb.dataio.dataset.add_dynamic_item([ds], audio_pipeline)
    sb.dataio.dataset.add_dynamic_item([ds], text_pipeline)
    sb.dataio.dataset.set_output_keys([ds], ["id", "sig", "text", "tokens_bos", "tokens_eos", "tokens"])
    return ds


def build_modules(vocab, s):
    """The conformer encoder-decoder of the settings ``s``, from SpeechBrain's lobes."""
    from speechbrain.lobes.models.convolution import ConvolutionFrontEnd
    from speechbrain.lobes.models.transformer.TransformerASR import TransformerASR
    stride = s["frontend_stride"]
    cnn = ConvolutionFrontEnd(input_shape=(8, 10, s["n_mels"]), num_blocks=2, num_layers_per_block=1,
                              out_channels=(s["frontend_channels"], s["frontend_out_channels"]), kernel_sizes=(3, 3),
                              strides=(stride, stride), residuals=(False, False), dropout=s["frontend_dropout"])
    transformer = TransformerASR(
        input_size=s["n_mels"] // (stride * stride) * s["frontend_out_channels"], tgt_vocab=vocab,
        d_model=s["d_model"], nhead=s["nhead"], num_encoder_layers=s["num_encoder_layers"],
        num_decoder_layers=s["num_decoder_layers"], d_ffn=s["d_ffn"], dropout=s["dropout"],
        activation=torch.nn.GELU, encoder_module="conformer", attention_type=s["attention_type"],
        kernel_size=s["conformer_kernel_size"], normalize_before=True, causal=False)
    return {"CNN": cnn, "Transformer": transformer,
            "ctc_lin": sb.nnet.linear.Linear(input_size=s["d_model"], n_neurons=vocab),
            "seq_lin": sb.nnet.linear.Linear(input_size=s["d_model"], n_neurons=vocab),
            "normalize": sb.processing.features.InputNormalization(norm_type=s["normalize_type"],
                                                                    update_until_epoch=4)}


def spec_augment(s):
    """SpeechBrain's SpecAugment: time warping, then time and frequency masks ([low, high] counts and widths)."""
    from speechbrain.augment.augmenter import Augmenter
    from speechbrain.augment.freq_domain import SpectrogramDrop, Warping

    def drop(count, width, dim):
        return SpectrogramDrop(drop_length_low=width[0], drop_length_high=width[1], drop_count_low=count[0],
                               drop_count_high=count[1], replace=s["drop_replace"], dim=dim)
    return Augmenter(min_augmentations=3, max_augmentations=3, augment_prob=s["spec_augment_prob"], augmentations=[
        Warping(warp_window=s["time_warp_window"], dim=1), drop(s["time_drop_count"], s["time_drop_width"], 1),
        drop(s["freq_drop_count"], s["freq_drop_width"], 2)])


def speed_perturbation(s):
    """SpeechBrain's ``SpeedPerturb`` over the settings' factors (None when the only one is 1.0)."""
    speeds = [int(round(100 * factor)) for factor in s["speed_perturb"]]
    return None if speeds == [100] else sb.augment.time_domain.SpeedPerturb(orig_freq=RATE, speeds=speeds)


def beam_searcher(modules, setting, lm=None):
    """SpeechBrain's joint CTC/attention searcher with ``setting`` (``dev_choice.decoding_grid``), the LM
    fused through SpeechBrain's scorer of its kind when ``setting["lm_weight"]`` > 0."""
    scorers, weights = [], {}
    if setting["ctc_weight"] > 0:
        scorers.append(CTCScorer(ctc_fc=modules["ctc_lin"], blank_index=BLANK, eos_index=EOS))
        weights["ctc"] = setting["ctc_weight"]
    if lm is not None and setting["lm_weight"] > 0:
        scorer, name = lm_scorer(lm)
        scorers.append(scorer)
        weights[name] = setting["lm_weight"]
    return S2STransformerBeamSearcher(
        modules=[modules["Transformer"], modules["seq_lin"]], bos_index=BOS, eos_index=EOS, min_decode_ratio=0.0,
        max_decode_ratio=1.0, beam_size=setting["beam_size"], using_eos_threshold=False, length_normalization=True,
        scorer=ScorerBuilder(full_scorers=scorers, weights=weights) if scorers else None)


class ASR(sb.Brain):
    """SpeechBrain's LibriSpeech transformer ``train.py``, with the wall-clock budget and the figures the
    bench reports (data wait, audio seen); ``test_search`` and ``split`` are set before each ``evaluate``."""

    test_search, split = None, "test"
    wait_seconds = train_seconds = audio_seconds = 0.0

    def compute_forward(self, batch, stage):
        batch = batch.to(self.device)
        wavs, wav_lens = batch.sig
        if stage == sb.Stage.TRAIN and self.hparams.speed_perturb is not None:
            wavs = self.hparams.speed_perturb(wavs)
        feats = self.hparams.compute_features(wavs)
        feats = self.modules.normalize(feats, wav_lens, epoch=self.hparams.epoch_counter.current)
        if stage == sb.Stage.TRAIN:
            feats, _ = self.hparams.fea_augment(feats, wav_lens)
        src = self.modules.CNN(feats)
        enc_out, pred = self.modules.Transformer(src, batch.tokens_bos[0], wav_lens, pad_idx=BLANK)
        p_ctc = torch.log_softmax(self.modules.ctc_lin(enc_out), dim=-1)
        p_seq = torch.log_softmax(self.modules.seq_lin(pred), dim=-1)
        hyps = None
        if stage == sb.Stage.TEST:
            hyps, _, _, _ = self.test_search(enc_out.detach(), wav_lens)
        return p_ctc, p_seq, wav_lens, hyps

    def compute_objectives(self, predictions, batch, stage):
        p_ctc, p_seq, wav_lens, hyps = predictions
        tokens_eos, tokens_eos_lens = batch.tokens_eos
        tokens, tokens_lens = batch.tokens
        loss_seq = sb.nnet.losses.kldiv_loss(p_seq, tokens_eos, length=tokens_eos_lens,
                                             label_smoothing=self.hparams.label_smoothing, reduction="batchmean")
        loss_ctc = sb.nnet.losses.ctc_loss(p_ctc, tokens, wav_lens, tokens_lens, blank_index=BLANK,
                                           reduction="batchmean")
        loss = (1 - self.hparams.dec_weight) * loss_ctc + self.hparams.dec_weight * loss_seq
        if stage != sb.Stage.TRAIN:
            self.score("greedy", batch, sb.decoders.ctc_greedy_decode(p_ctc, wav_lens, blank_id=BLANK))
            if hyps is not None:
                self.score("beam", batch, hyps)
        return loss

    def score(self, search, batch, hyps):
        """Add the batch's hypotheses (token ids) to the metrics of ``search``."""
        self.metrics[search].append(batch.id, [self.tokenizer.decode_ids([int(i) for i in h]) for h in hyps],
                                    batch.text)

    def fit_batch(self, batch):
        """One update, with the time waited for this batch and its audio seconds counted."""
        began = time.perf_counter()
        self.wait_seconds += began - self.last_batch_end
        wavs, wav_lens = batch.sig
        self.audio_seconds += float(wav_lens.sum()) * wavs.shape[1] / RATE
        loss = super().fit_batch(batch)
        self.last_batch_end = time.perf_counter()
        return loss

    def on_fit_batch_end(self, batch, outputs, loss, should_step):
        if should_step:
            self.hparams.noam_annealing(self.optimizer)
            if (time.time() - self.hparams.started) / 60 >= self.hparams.minutes:
                self.optimizer_step_limit = self.optimizer_step  # the budget's update ends the epoch

    def on_stage_start(self, stage, epoch=None):
        self.metrics = {"greedy": TranscriptMetrics(), "beam": TranscriptMetrics()}
        self.stage_began = self.last_batch_end = time.perf_counter()

    def on_stage_end(self, stage, stage_loss, epoch=None):
        if stage == sb.Stage.TRAIN:
            self.train_loss = stage_loss
            self.train_seconds += time.perf_counter() - self.stage_began
        elif stage == sb.Stage.VALID:
            self.end_epoch(epoch, stage_loss)
        else:
            self.metrics["beam"].write_hypotheses(self.hparams.output_folder, self.split)

    def end_epoch(self, epoch, stage_loss):
        """The epoch's line, its checkpoint ranked by the settings' key, and the budget check."""
        greedy = self.metrics["greedy"].summary()
        minutes = (time.time() - self.hparams.started) / 60
        logger.info("epoch %d: train loss %.3f, valid loss %.3f, greedy WER %.2f CER %.2f, %d updates, %.1f min",
                    epoch, self.train_loss, stage_loss, greedy["wer"], greedy["cer"], self.optimizer_step, minutes)
        key = self.hparams.best_checkpoint_key
        figures = {"loss": stage_loss, "WER": greedy["wer"], "CER": greedy["cer"]}
        self.checkpointer.save_and_keep_only(meta={key: figures[key], "epoch": epoch}, min_keys=[key],
                                             num_to_keep=self.hparams.keep_checkpoints)
        if minutes >= self.hparams.minutes:
            self.hparams.epoch_counter.limit = epoch  # the wall-clock budget is spent

    def on_evaluate_start(self, max_key=None, min_key=None):
        """Recover the best checkpoint, then average the best ``average_checkpoints`` into the model."""
        key = self.hparams.best_checkpoint_key
        super().on_evaluate_start(min_key=key)
        checkpoints = self.checkpointer.find_checkpoints(min_key=key,
                                                         max_num_checkpoints=self.hparams.average_checkpoints)
        self.hparams.model.load_state_dict(
            sb.utils.checkpoints.average_checkpoints(checkpoints, recoverable_name="model"), strict=True)
        self.hparams.model.eval()


def batch_sampler(ds, max_seconds, max_size, shuffle):
    return DynamicBatchSampler(ds, max_batch_length=max_seconds, num_buckets=60, length_func=lambda x: x["duration"],
                               shuffle=shuffle, batch_ordering="random" if shuffle else "descending",
                               max_batch_ex=max_size)


def build_brain(s, vocab, out, save, minutes):
    """``(brain, modules, epoch_counter)`` of the settings ``s``, checkpoints in ``save``."""
    modules = build_modules(vocab, s)
    model = torch.nn.ModuleList([modules["CNN"], modules["Transformer"], modules["seq_lin"], modules["ctc_lin"]])
    epoch_counter = sb.utils.epoch_loop.EpochCounter(limit=int(s["number_of_epochs"]))
    noam = sb.nnet.schedulers.NoamScheduler(lr_initial=s["lr_peak"], n_warmup_steps=s["warmup_steps"])
    checkpointer = sb.utils.checkpoints.Checkpointer(save, recoverables={
        "model": model, "noam_scheduler": noam, "normalizer": modules["normalize"], "counter": epoch_counter})
    hparams = {"model": model, "epoch_counter": epoch_counter, "noam_annealing": noam, "minutes": minutes,
               "started": time.time(), "output_folder": out,
               "compute_features": sb.lobes.features.Fbank(sample_rate=RATE, n_fft=400, n_mels=s["n_mels"]),
               "speed_perturb": speed_perturbation(s), "fea_augment": spec_augment(s),
               **{key: s[key] for key in ("dec_weight", "label_smoothing", "keep_checkpoints", "average_checkpoints",
                                          "best_checkpoint_key")}}
    optimizer = torch.optim.AdamW if s["optimizer"] == "AdamW" else torch.optim.Adam
    brain = ASR(modules=modules, hparams=hparams, checkpointer=checkpointer,
                opt_class=lambda params: optimizer(params, lr=s["lr_peak"], betas=tuple(s["adam_betas"]),
                                                   eps=s["adam_eps"], weight_decay=s["weight_decay"]),
                run_opts={"device": "cpu", "max_grad_norm": s["max_grad_norm"], "noprogressbar": True})
    return brain, modules, epoch_counter


def train(brain, epoch_counter, s, corpus, tokenizer, out):
    """Fit under the budget; writes and returns the training figures (``trained.json``)."""
    train_set = dataset(os.path.join(corpus, "train.jsonl"), tokenizer, s)
    dev = dataset(os.path.join(corpus, "dev.jsonl"), tokenizer)
    logger.info("training on %d utterances (%.2f h) after the filters", len(train_set),
                sum(train_set.data[key]["duration"] for key in train_set.data_ids) / 3600)
    started = time.time()
    brain.fit(epoch_counter, train_set, dev,
              train_loader_kwargs={"batch_sampler": batch_sampler(train_set, s["max_batch_seconds"],
                                                                  s["max_batch_size"], True)},
              valid_loader_kwargs={"batch_sampler": batch_sampler(dev, 100.0, 128, False)})
    figures = {"minutes": round((time.time() - started) / 60, 3), "epochs": epoch_counter.current,
               "updates": brain.optimizer_step, "audio_hours": round(brain.audio_seconds / 3600, 4),
               "data_wait": round(brain.wait_seconds / max(brain.train_seconds, 1e-9), 4)}
    atomic_write_text(os.path.join(out, TRAINED), json.dumps(figures, indent=1))
    return figures


def decode_with_choice(brain, modules, corpus, tokenizer, grid, tests, lm=None):
    """Decoding settings chosen on dev, then each test split decoded once (``dev_choice``)."""
    datasets = {}

    def decode(setting, split):
        if split not in datasets:
            datasets[split] = dataset(os.path.join(corpus, f"{split}.jsonl"), tokenizer)
        brain.test_search = beam_searcher(modules, setting, lm)
        brain.split = f"{split}_{dev_choice.setting_name(setting)}" if split == "dev" else split
        brain.evaluate(datasets[split], test_loader_kwargs={
            "batch_sampler": batch_sampler(datasets[split], 100.0, 128, False)})
        return os.path.join(brain.hparams.output_folder, f"hyp_{brain.split}.jsonl")
    return dev_choice.choose_on_dev(grid, decode, "dev", tests)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", choices=SETTINGS, default="librispeech")
    parser.add_argument("--data", default="data/open", help="folder with corpus/{train,dev,test_*}.jsonl")
    parser.add_argument("--tests", nargs="+", default=["test_seen", "test_unseen"], help="test manifests in corpus/")
    parser.add_argument("--tokenizer", required=True, help="SentencePiece model (local/train_tokenizer.py): "
                        "char.model for same_model, a unigram one for librispeech")
    parser.add_argument("--out", required=True)
    parser.add_argument("--minutes", type=float, default=20.0, help="training wall-clock budget")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--overrides", default="", help="small.yaml overrides as train.py takes them, "
                        "space-separated: --overrides='--d_model=32 --nhead=2'")
    parser.add_argument("--trained", help="decode the model trained in this folder (no training)")
    parser.add_argument("--lm-dir", help="a recipes/lm experiment on the same tokenizer, fused in decoding")
    parser.add_argument("--beams", nargs="+", type=int, default=[8, 16])
    parser.add_argument("--ctc-weights", nargs="+", type=float, default=[0.4, 0.6])
    parser.add_argument("--lm-weights", nargs="+", type=float, default=[0.0])
    return parser.parse_args(argv)


def main(argv=None):
    """Train (or reuse) and decode; returns and writes the results (``results.json``)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sb.utils.seed_everything(args.seed)
    s = leg_settings(args.settings, args.overrides.split())
    logger.info("the %s settings: %s", args.settings, json.dumps(s))
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=args.tokenizer)
    corpus, trained_in = os.path.join(args.data, "corpus"), args.trained or args.out
    os.makedirs(args.out, exist_ok=True)
    save = os.path.join(trained_in, "save")
    if args.trained is None and not os.path.isfile(os.path.join(args.out, TRAINED)) and os.path.isdir(save):
        logger.info("%s holds an unfinished training: it starts again from scratch", save)
        shutil.rmtree(save)
    brain, modules, epoch_counter = build_brain(s, tokenizer.get_piece_size(), args.out, save, args.minutes)
    brain.tokenizer = tokenizer
    if os.path.isfile(os.path.join(trained_in, TRAINED)):
        with open(os.path.join(trained_in, TRAINED)) as f:
            figures = json.load(f)
        logger.info("reusing the model trained in %s (%s)", trained_in, figures)
    else:
        figures = train(brain, epoch_counter, s, corpus, tokenizer, args.out)
    lm = load_language_model(args.lm_dir, args.tokenizer) if args.lm_dir else None
    grid = dev_choice.decoding_grid(args.beams, args.ctc_weights, args.lm_weights if lm is not None else [0.0])
    choice = decode_with_choice(brain, modules, corpus, tokenizer, grid, args.tests, lm)
    results = {"settings": args.settings, "values": s, **figures, "dev_choices": choice["dev"],
               "chosen": choice["chosen"], "splits": {}}
    for split, path in choice["tests"].items():
        wer = stats.error_rate(stats.read_scored(path))
        results["splits"][split] = {"wer": round(wer.value, 2), "wer_ci": wer.as_list(), "hyps": path}
    atomic_write_text(os.path.join(args.out, RESULTS), json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    print(json.dumps(main()))
    sys.exit(0)
