"""Plain SpeechBrain conformer-small, the baseline of ``bench/learning.py``.

SpeechBrain's LibriSpeech recipe (``recipes/LibriSpeech/ASR/transformer``, ``conformer_small.yaml``)
as SpeechBrain writes it: ``DynamicItemDataset`` over the corpus manifest, ``DynamicBatchSampler``,
Fbank + global ``InputNormalization``, speed perturbation 95/100/105, SpecAugment (time warp, 4 time
and 4 frequency masks), the (64, 32) CNN front-end, ``TransformerASR`` (conformer, d_model 144,
12 encoder / 4 decoder layers, d_ffn 1024, RelPosMHAXL), CTC weight 0.3, Adam 1e-3 (0.9, 0.98) with
Noam warmup, checkpoints averaged before the test, joint CTC/attention beam (CTC weight 0.4).
Scaled to a CPU budget, and only there: the padded seconds per batch, the warmup (the same share of
the run as 25,000 of LibriSpeech's ~200,000 updates), the epochs (a wall-clock budget), the vocabulary
(a unigram SentencePiece model of the corpus, 5,000 pieces do not exist in 2 h of text), the test
beam (10, the recipe's validation beam; 66 with a Transformer LM is out of a CPU budget).

    python bench/speechbrain_conformer_small.py --data data/open --out exp/bench_learning/speechbrain \\
        --tokenizer data/open/tokenizer/unigram_500.model --minutes 30
"""

import argparse
import json
import logging
import os
import sys
import time

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
from speechbrain.utils.metric_stats import ErrorRateStats

logger = logging.getLogger(__name__)
RATE = 16000
BLANK, BOS, EOS = 0, 1, 2


def read_audio(path):
    """Mono float32 at 16 kHz of any file libsndfile reads."""
    audio, rate = soundfile.read(path, dtype="float32", always_2d=True)
    audio = torch.from_numpy(audio.mean(axis=1))
    return torchaudio.functional.resample(audio, rate, RATE) if rate != RATE else audio


def dataset(manifest, tokenizer):
    """A ``DynamicItemDataset`` of a jsonl manifest (audio paths relative to it), audio in memory."""
    root = os.path.dirname(os.path.abspath(manifest))
    with open(manifest) as f:
        rows = [json.loads(line) for line in f]
    data = {row["id"]: {"wav": os.path.join(root, row["audio"]), "text": row["text"],
                        "duration": row["duration"]} for row in rows}
    ds = sb.dataio.dataset.DynamicItemDataset(data)
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


def build_modules(vocab):
    """The conformer-small graph of SpeechBrain's yaml."""
    from speechbrain.lobes.models.convolution import ConvolutionFrontEnd
    from speechbrain.lobes.models.transformer.TransformerASR import TransformerASR
    cnn = ConvolutionFrontEnd(input_shape=(8, 10, 80), num_blocks=2, num_layers_per_block=1, out_channels=(64, 32),
                              kernel_sizes=(3, 3), strides=(2, 2), residuals=(False, False))
    transformer = TransformerASR(input_size=640, tgt_vocab=vocab, d_model=144, nhead=4, num_encoder_layers=12,
                                 num_decoder_layers=4, d_ffn=1024, dropout=0.1, activation=torch.nn.GELU,
                                 encoder_module="conformer", attention_type="RelPosMHAXL", normalize_before=True,
                                 causal=False)
    return {"CNN": cnn, "Transformer": transformer,
            "ctc_lin": sb.nnet.linear.Linear(input_size=144, n_neurons=vocab),
            "seq_lin": sb.nnet.linear.Linear(input_size=144, n_neurons=vocab),
            "normalize": sb.processing.features.InputNormalization(norm_type="global", update_until_epoch=4)}


def spec_augment():
    from speechbrain.augment.augmenter import Augmenter
    from speechbrain.augment.freq_domain import SpectrogramDrop, Warping
    return Augmenter(min_augmentations=3, max_augmentations=3, augment_prob=1.0, augmentations=[
        SpectrogramDrop(drop_length_low=15, drop_length_high=25, drop_count_low=4, drop_count_high=4, replace="mean"),
        SpectrogramDrop(drop_length_low=10, drop_length_high=20, drop_count_low=4, drop_count_high=4, replace="mean",
                        dim=2),
        Warping()])


class ASR(sb.Brain):
    """SpeechBrain's LibriSpeech transformer ``train.py``, without the LM and the per-epoch beam."""

    def compute_forward(self, batch, stage):
        batch = batch.to(self.device)
        wavs, wav_lens = batch.sig
        if stage == sb.Stage.TRAIN:
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
            hyps, _, _, _ = self.hparams.test_search(enc_out.detach(), wav_lens)
        return p_ctc, p_seq, wav_lens, hyps

    def compute_objectives(self, predictions, batch, stage):
        p_ctc, p_seq, wav_lens, hyps = predictions
        tokens_eos, tokens_eos_lens = batch.tokens_eos
        tokens, tokens_lens = batch.tokens
        loss_seq = sb.nnet.losses.kldiv_loss(p_seq, tokens_eos, length=tokens_eos_lens, label_smoothing=0.0,
                                             reduction="batchmean")
        loss_ctc = sb.nnet.losses.ctc_loss(p_ctc, tokens, wav_lens, tokens_lens, blank_index=BLANK,
                                           reduction="batchmean")
        loss = self.hparams.ctc_weight * loss_ctc + (1 - self.hparams.ctc_weight) * loss_seq
        if stage != sb.Stage.TRAIN:
            greedy = sb.decoders.ctc_greedy_decode(p_ctc, wav_lens, blank_id=BLANK)
            self.score("greedy", batch, greedy)
            if hyps is not None:
                self.score("beam", batch, hyps)
        return loss

    def score(self, search, batch, hyps):
        """Add the batch's hypotheses (token ids) to the WER and CER of ``search``."""
        words = [self.tokenizer.decode_ids([int(i) for i in h]) for h in hyps]
        self.metrics[search, "WER"].append(batch.id, [w.split() for w in words], [t.split() for t in batch.text])
        self.metrics[search, "CER"].append(batch.id, [list(w) for w in words], [list(t) for t in batch.text])

    def on_fit_batch_end(self, batch, outputs, loss, should_step):
        if should_step:
            self.hparams.noam_annealing(self.optimizer)

    def on_stage_start(self, stage, epoch=None):
        self.metrics = {(search, rate): ErrorRateStats() for search in ("greedy", "beam") for rate in ("WER", "CER")}

    def on_stage_end(self, stage, stage_loss, epoch=None):
        if stage == sb.Stage.TRAIN:
            self.train_loss = stage_loss
            return
        wer = self.metrics["greedy", "WER"].summarize("error_rate")
        if stage == sb.Stage.VALID:
            elapsed = (time.time() - self.hparams.started) / 60
            logger.info("epoch %d: train loss %.3f, valid loss %.3f, greedy WER %.2f, %.1f min", epoch,
                        self.train_loss, stage_loss, wer, elapsed)
            self.checkpointer.save_and_keep_only(meta={"loss": stage_loss, "epoch": epoch}, min_keys=["loss"],
                                                 num_to_keep=self.hparams.avg_checkpoints)
            if elapsed >= self.hparams.minutes:
                self.hparams.epoch_counter.limit = epoch  # the wall-clock budget is spent
        else:
            self.test_results = {f"{search}_{rate}": metric.summarize("error_rate")
                                 for (search, rate), metric in self.metrics.items()}

    def on_evaluate_start(self, max_key=None, min_key=None):
        """Recover the best checkpoint, then average the best ``avg_checkpoints`` models (validation
        loss) into the model, as SpeechBrain's recipe does."""
        super().on_evaluate_start(min_key="loss")
        checkpoints = self.checkpointer.find_checkpoints(min_key="loss",
                                                         max_num_checkpoints=self.hparams.avg_checkpoints)
        self.hparams.model.load_state_dict(
            sb.utils.checkpoints.average_checkpoints(checkpoints, recoverable_name="model"), strict=True)
        self.hparams.model.eval()


def batch_sampler(ds, max_seconds, shuffle):
    return DynamicBatchSampler(ds, max_batch_length=max_seconds, num_buckets=60, length_func=lambda x: x["duration"],
                               shuffle=shuffle, batch_ordering="random" if shuffle else "descending", max_batch_ex=128)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="data/open", help="folder with corpus/{train,dev,test_*}.jsonl")
    parser.add_argument("--tests", default="test_seen test_unseen", help="test manifests in corpus/")
    parser.add_argument("--tokenizer", default="data/open/tokenizer/unigram_500.model")
    parser.add_argument("--out", default="exp/bench_learning/speechbrain")
    parser.add_argument("--minutes", type=float, default=60.0, help="training wall-clock budget")
    parser.add_argument("--batch-seconds", type=float, default=60.0, help="padded seconds per batch (900 on GPUs)")
    parser.add_argument("--warmup", type=int, default=300, help="Noam warmup updates (12%% of the run)")
    parser.add_argument("--seed", type=int, default=7775)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sb.utils.seed_everything(args.seed)
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=args.tokenizer)
    corpus = os.path.join(args.data, "corpus")
    train, dev = (dataset(os.path.join(corpus, f"{name}.jsonl"), tokenizer) for name in ("train", "dev"))
    modules = build_modules(tokenizer.get_piece_size())
    model = torch.nn.ModuleList([modules["CNN"], modules["Transformer"], modules["seq_lin"], modules["ctc_lin"]])
    epoch_counter = sb.utils.epoch_loop.EpochCounter(limit=10_000)
    noam = sb.nnet.schedulers.NoamScheduler(lr_initial=1e-3, n_warmup_steps=args.warmup)
    checkpointer = sb.utils.checkpoints.Checkpointer(os.path.join(args.out, "save"), recoverables={
        "model": model, "noam_scheduler": noam, "normalizer": modules["normalize"], "counter": epoch_counter})
    test_search = S2STransformerBeamSearcher(
        modules=[modules["Transformer"], modules["seq_lin"]], bos_index=BOS, eos_index=EOS, min_decode_ratio=0.0,
        max_decode_ratio=1.0, beam_size=10, using_eos_threshold=False, length_normalization=True,
        scorer=ScorerBuilder(full_scorers=[CTCScorer(ctc_fc=modules["ctc_lin"], blank_index=BLANK, eos_index=EOS)],
                             weights={"ctc": 0.4}))
    hparams = {"model": model, "epoch_counter": epoch_counter, "noam_annealing": noam, "ctc_weight": 0.3,
               "avg_checkpoints": 10, "minutes": args.minutes, "started": time.time(), "test_search": test_search,
               "compute_features": sb.lobes.features.Fbank(sample_rate=RATE, n_fft=400, n_mels=80),
               "speed_perturb": sb.augment.time_domain.SpeedPerturb(orig_freq=RATE, speeds=[95, 100, 105]),
               "fea_augment": spec_augment()}
    brain = ASR(modules=modules, opt_class=lambda params: torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.98),
                                                                           eps=1e-9),
                hparams=hparams, run_opts={"device": "cpu", "max_grad_norm": 5.0, "noprogressbar": True},
                checkpointer=checkpointer)
    brain.tokenizer = tokenizer
    started = time.time()
    brain.fit(epoch_counter, train, dev,
              train_loader_kwargs={"batch_sampler": batch_sampler(train, args.batch_seconds, True)},
              valid_loader_kwargs={"batch_sampler": batch_sampler(dev, 100.0, False)})
    results = {"system": "speechbrain", "train_minutes": (time.time() - started) / 60,
               "epochs": epoch_counter.current, "updates": brain.optimizer_step, "splits": {}}
    for name in args.tests.split():
        test = dataset(os.path.join(corpus, f"{name}.jsonl"), tokenizer)
        brain.evaluate(test, test_loader_kwargs={"batch_sampler": batch_sampler(test, 100.0, False)})
        results["splits"][name] = brain.test_results
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
