"""recipes/finetune: run.sh stages on tiny espeak-ng shards, config errors, exact resume."""

import json
import os
import re

import pytest

from common.recipe import ConfigError, load_checked_hparams
from local import train_tokenizer
from recipes.finetune import train
from tests.recipes.finetune_args import CONFIGS, TINY, batch_log_lines, data_options, epoch_losses, run_sh, train_argv


def test_run_sh_trains_decodes_and_scores_with_every_output(speech_shards, tmp_path):
    """Stages 1-3 on shard folders: the training loss goes down over 4 epochs, and the experiment
    folder holds the resolved config, the command, train_log, TensorBoard events, alignments,
    the averaged checkpoint, results.txt and results.json, the learning curves and their history;
    the results table is printed."""
    exp = tmp_path / "exp"
    result = run_sh("--stage", "1", "--data", str(tmp_path / "data"), "--vocab_size", "60",
                    "--config", "hparams/demo.yaml", "--exp", str(exp), *data_options(speech_shards), "--",
                    "--number_of_epochs=4", *TINY)
    for stage in ("Stage 1: tokenizer", "Stage 2: train", "Stage 3: decode + score"):
        assert stage in result.stderr
    assert "Stage 0" not in result.stderr
    losses = epoch_losses(exp / "train_log.txt")
    assert len(losses) == 4 and losses[-1] < 0.95 * losses[0], losses  # seeded: 3.63 -> 3.38
    results = json.loads((exp / "results.json").read_text())["test"]
    assert results["num_utterances"] == 8 and 0 <= results["cer"] and "wer" in results["ctc_greedy"]
    assert results["config"].endswith("demo.yaml") and os.path.isfile(results["checkpoint"])
    for name in ("hyperparams.yaml", "command.txt", "wer_test.txt", "wer_test_ctc_greedy.txt",
                 "averaged.ckpt", "results.txt", "curves.png", "history.json"):
        assert (exp / name).is_file(), name
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(exp / "tensorboard"))
    assert "number_of_epochs: 4" in (exp / "hyperparams.yaml").read_text()
    history = json.loads((exp / "history.json").read_text())  # redrawn with curves.png every epoch
    assert [r["epoch"] for r in history] == [1, 2, 3, 4] and all("CER" in r["valid"] for r in history)
    table = result.stdout[result.stdout.rindex("experiment "):].splitlines()  # printed last
    assert table[0].split()[:4] == ["experiment", "split", "WER", "%"] and table[2].split()[:2] == ["exp", "test"]


def test_interrupted_training_resumes_at_the_next_batch(speech_shards, tokenizer_file, tmp_path, monkeypatch):
    """Killed during update 5 with checkpoints every 2 updates, a rerun restarts after update 4 with
    exactly the planned 5th batch of the same epoch, and goes on to the end of the epoch."""
    seen, planned = [], []

    def record(brain, batch, should_step):
        planned[:] = planned or brain.train_loader.planned_keys(brain.train_loader.epoch)
        seen.append((brain.optimizer_step, list(batch.id)))
        if len(seen) == 5 and not getattr(brain, "resumed", False):
            raise KeyboardInterrupt

    monkeypatch.setattr(train.ASR, "on_fit_batch_start", record)
    argv = train_argv(speech_shards, tokenizer_file, tmp_path / "exp", "--number_of_epochs=1",
                      "--ckpt_interval_steps=2", "--ckpt_interval_minutes=0", "--do_test=False")
    with pytest.raises(KeyboardInterrupt):
        train.main(argv)
    interrupted, seen[:] = list(seen), []
    monkeypatch.setattr(train.ASR, "resumed", True, raising=False)
    train.main(argv)
    assert [step for step, _ in interrupted] == [0, 1, 2, 3, 4]
    assert seen[0] == (4, interrupted[4][1])
    assert [keys for _, keys in interrupted[:4] + seen] == planned


def test_fbank_in_loader_trains_on_features_made_by_a_loader_worker(speech_shards, tokenizer_file, tmp_path,
                                                                   monkeypatch):
    """train_loader[fbank_in_loader]: True with a loader worker: every training batch arrives with Fbank features
    of the config's n_mels, and the epoch trains to a finite loss."""
    feature_sizes = []

    def record(brain, batch, should_step):
        feature_sizes.append(None if getattr(batch, "feats", None) is None else batch.feats.data.shape[-1])

    monkeypatch.setattr(train.ASR, "on_fit_batch_start", record)
    exp = tmp_path / "exp"
    train.main(train_argv(speech_shards, tokenizer_file, exp, "--number_of_epochs=1", "--do_test=False",
                          "--train_loader={fbank_in_loader: True, cache_audio: False}", "--num_workers=1"))
    assert feature_sizes and set(feature_sizes) == {72}  # demo.yaml's n_mels
    assert all(loss == loss for loss in epoch_losses(exp / "train_log.txt"))  # not NaN


def test_speech_translation_config_targets_the_translation_and_scores_bleu(speech_shards, tmp_path):
    """demo_st.yaml: the targets are the Pig Latin translations led by the <pig> tag (fed, never
    predicted); results.json holds BLEU and the alignments compare against translations."""
    texts = train_tokenizer.read_texts([str(speech_shards["train"])], text_field="translation")
    tokenizer = train_tokenizer.train_tokenizer(texts, str(tmp_path / "tok"), 60, "bpe", ["<pig>"])
    argv = train_argv(speech_shards, tokenizer, tmp_path / "exp", "--number_of_epochs=1")
    train.main([os.path.join(CONFIGS, "demo_st.yaml")] + argv[1:])
    results = json.loads((tmp_path / "exp" / "results.json").read_text())["test"]
    assert "bleu" in results and results["num_utterances"] == 8
    alignments = (tmp_path / "exp" / "wer_test.txt").read_text()
    assert "ethay" in alignments and "<pig>" not in alignments  # "the" in Pig Latin; no tag


def test_config_errors_are_caught_before_any_work(speech_shards, tokenizer_file, tmp_path):
    """A mistyped override names the closest key; an unset !PLACEHOLDER names the key to set."""
    argv = train_argv(speech_shards, tokenizer_file, tmp_path / "exp")
    with pytest.raises(ConfigError, match='"max_batch_secnds".*Did you mean "max_batch_seconds"'):
        train.main(argv + ["--max_batch_secnds=10"])
    without_tokenizer = [a for a in argv if not a.startswith("--tokenizer_file")]
    with pytest.raises(ConfigError, match="tokenizer_file is a !PLACEHOLDER.*--tokenizer_file="):
        train.main(without_tokenizer)
    assert not (tmp_path / "exp").exists()


def test_training_stops_when_its_minutes_are_spent(speech_shards, tokenizer_file, tmp_path):
    """train_minutes: training ends at the update that spends the budget (here the first of an epoch
    of several: not the epoch's end, not number_of_epochs), that epoch is validated and recorded in
    history.json with its minutes, and a rerun of the spent experiment trains no further update."""
    argv = train_argv(speech_shards, tokenizer_file, tmp_path / "exp", "--number_of_epochs=3",
                      "--train_minutes=0.000001", "--do_test=False")
    full_epoch = train_argv(speech_shards, tokenizer_file, tmp_path / "full", "--number_of_epochs=1", "--do_test=False")
    train.main(full_epoch)
    assert json.loads((tmp_path / "full" / "history.json").read_text())[0]["steps"] > 1
    train.main(argv)
    history = json.loads((tmp_path / "exp" / "history.json").read_text())
    assert [(r["epoch"], r["steps"]) for r in history] == [(1, 1)] and history[0]["minutes"] > 0
    assert history[0]["valid"] is not None
    train.main(argv)
    assert len(json.loads((tmp_path / "exp" / "history.json").read_text())) == 1


@pytest.mark.parametrize("config", sorted(os.listdir(CONFIGS)))
def test_every_config_builds_its_model(config, tokenizer_file):
    """Each shipped config (derived ones through their base) loads and builds its model."""
    hparams = load_checked_hparams(os.path.join(CONFIGS, config), {
        "train_parquet": "x", "valid_parquet": "x", "test_parquets": ["x"], "tokenizer_file": tokenizer_file})
    assert hparams["model"].seq_lin.w.out_features == 60


def test_spec_augment_strength_set_in_the_recipe_config_reaches_the_model(tokenizer_file):
    """time/freq_drop_count and _width, given as overrides of small.yaml (as on the command line)
    through its base conformer.yaml, size the model's masks (a key the model graph ignored would
    silently leave SpecAugment at its defaults)."""
    hparams = load_checked_hparams(os.path.join(CONFIGS, "small.yaml"), {
        "train_parquet": "x", "valid_parquet": "x", "test_parquets": ["x"], "tokenizer_file": tokenizer_file,
        "time_drop_count": 5, "time_drop_width": 41, "freq_drop_count": 3, "freq_drop_width": 17})
    time_warp, time_drop, freq_drop = hparams["model"].augment.augmentations.values()
    assert (time_drop.drop_count_high, time_drop.drop_length_high, time_drop.dim) == (5, 41, 1)
    assert (freq_drop.drop_count_high, freq_drop.drop_length_high, freq_drop.dim) == (3, 17, 2)


def test_run_sh_rejects_unknown_options_and_runs_only_the_chosen_stages(speech_shards, tmp_path):
    """--bogus exits 2 with the usage; --stage 1 --stop_stage 1 trains the tokenizer and nothing else,
    and with --train but no --config that is small.yaml's: characters, sized from the text."""
    bogus = run_sh("--bogus", "1", check=False)
    assert bogus.returncode == 2 and "unknown option --bogus" in bogus.stderr and "Usage:" in bogus.stderr
    result = run_sh("--stage", "1", "--stop_stage", "1", "--data", str(tmp_path / "data"),
                    "--exp", str(tmp_path / "exp"), *data_options(speech_shards))
    assert re.findall(r"Stage \d", result.stderr) == ["Stage 1"]
    assert sorted(os.listdir(tmp_path / "data" / "tokenizer")) == ["char.inputs.sha256", "char.model", "char.vocab"]
    assert not (tmp_path / "exp").exists()


def test_a_dry_run_writes_the_data_report_and_trains_nothing(speech_shards, tokenizer_file, tmp_path):
    """--dry_run=True: data_report/ holds report.md (with the largest batch's memory against 80 GB and
    24 GB cards) and its histograms for the config's loader, and no epoch is trained (no checkpoint, no
    epoch line)."""
    exp = tmp_path / "exp"
    train.main(train_argv(speech_shards, tokenizer_file, exp, "--dry_run=True"))
    assert (exp / "data_report" / "report.md").is_file() and (exp / "data_report" / "durations.png").is_file()
    report = (exp / "data_report" / "report.md").read_text()
    assert "| a 80 GB card | fits;" in report and "| a 24 GB card | fits;" in report  # a tiny model
    assert not (exp / "save").exists() or not any((exp / "save").iterdir())
    assert not (exp / "train_log.txt").exists() or "epoch:" not in (exp / "train_log.txt").read_text()


def test_a_frozen_encoder_keeps_its_weights_while_the_heads_and_decoder_learn(speech_shards, tokenizer_file,
                                                                               tmp_path):
    """freeze_encoder_steps beyond the run: every front-end and encoder weight equals its initial
    value after an epoch of updates, while the decoder's and the CTC head's have moved."""
    import glob

    import torch

    argv = train_argv(speech_shards, tokenizer_file, tmp_path / "exp", "--number_of_epochs=1", "--do_test=False",
                      "--freeze_encoder_steps=1000")
    train.main(argv)
    trained = torch.load(sorted(glob.glob(str(tmp_path / "exp" / "save" / "CKPT+*" / "model.ckpt")))[-1])
    _, hparams = train.build_brain(train_argv(speech_shards, tokenizer_file, tmp_path / "fresh"))
    initial = hparams["model"].state_dict()
    encoder = [name for name in initial if name.startswith(("frontend.", "transformer.encoder.",
                                                             "transformer.custom_src_module."))]
    assert encoder and all(torch.equal(initial[name], trained[name]) for name in encoder)
    for head in ("ctc_lin.w.weight", "seq_lin.w.weight"):
        assert not torch.equal(initial[head], trained[head]), head


def test_lr_scales_give_each_group_its_rate_and_zero_holds_a_group(speech_shards, tokenizer_file, tmp_path):
    """--lr_scales: the language model at 0 keeps every weight while the cross-attention, the encoder and
    the CTC head move; the batch log's rate is the schedule's (the unscaled group's); an unknown group
    or a negative factor is refused, naming the groups."""
    import glob

    import torch

    argv = train_argv(speech_shards, tokenizer_file, tmp_path / "exp", "--number_of_epochs=1", "--do_test=False",
                      "--lr_scales={language_model: 0.0, encoder: 0.5}", "--batch_log=True")
    train.main(argv)
    trained = torch.load(sorted(glob.glob(str(tmp_path / "exp" / "save" / "CKPT+*" / "model.ckpt")))[-1])
    _, hparams = train.build_brain(train_argv(speech_shards, tokenizer_file, tmp_path / "fresh"))
    initial = hparams["model"].state_dict()
    moved = {name for name in initial if not torch.equal(initial[name], trained[name])}
    language_model = [name for name in initial if name.startswith(("seq_lin.", "transformer.custom_tgt_module."))
                      or (name.startswith("transformer.decoder.") and ".multihead_attn." not in name
                          and ".norm2." not in name)]
    assert language_model and not moved & set(language_model)
    for name in ("transformer.decoder.layers.0.multihead_attn.att.in_proj_weight", "ctc_lin.w.weight"):
        assert name in moved, name
    assert any(name.startswith("transformer.encoder.") for name in moved)
    first = batch_log_lines(tmp_path / "exp")[0]
    assert first["lr"] == pytest.approx(0.003 / 4)  # TINY: Noam at step 1 of 4 warmup steps, lr_peak 0.003
    for scales, message in (("{decoder: 0.1}", "each key must be one of"), ("{ctc: -1}", "a number >= 0")):
        with pytest.raises(ValueError, match=message):
            train.main(train_argv(speech_shards, tokenizer_file, tmp_path / "bad", "--number_of_epochs=1",
                                  "--do_test=False", f"--lr_scales={scales}"))


def test_intermediate_ctc_is_trained_and_logged_beside_the_last_layers_ctc(speech_shards, tokenizer_file, tmp_path):
    """--inter_ctc_layers=[1] --inter_ctc_weight=0.5 on a 2-layer encoder: each epoch's history has the
    intermediate layer's CTC beside the last layer's, and the train loss is their documented mix with the
    decoder's NLL; a weight without layers is refused before training."""
    exp = tmp_path / "exp"
    train.main(train_argv(speech_shards, tokenizer_file, exp, "--number_of_epochs=1", "--do_test=False",
                          "--num_encoder_layers=2", "--inter_ctc_layers=[1]", "--inter_ctc_weight=0.5"))
    epoch = json.loads((exp / "history.json").read_text())[0]
    dec_weight = train.build_brain(train_argv(speech_shards, tokenizer_file, tmp_path / "h"))[1]["dec_weight"]
    figures = epoch["train"]
    assert "inter_ctc_loss" in figures and "inter_ctc_loss" in epoch["valid"]
    assert figures["inter_ctc_loss"] != pytest.approx(figures["ctc_loss"])
    mixed = (1 - dec_weight) * (0.5 * figures["ctc_loss"] + 0.5 * figures["inter_ctc_loss"]) \
        + dec_weight * figures["nll_loss"]
    assert figures["loss"] == pytest.approx(mixed, rel=1e-3)
    with pytest.raises(ValueError, match="set both"):
        train.main(train_argv(speech_shards, tokenizer_file, tmp_path / "bad", "--inter_ctc_weight=0.3"))


def test_step_two_trains_translation_pairs_beside_the_speech_one_task_per_batch(speech_corpus, speech_shards,
                                                                                tokenizer_file, tmp_path, monkeypatch):
    """mt_parquets (YiTrans step 2): each training batch is speech or translation pairs, never both; the
    MT batches go through the text path, their NLL has a gradient in the shared encoder and token
    embedding, and their share is the task_mixing_alpha target to one batch; mt_nll_loss and
    mt_accuracy are logged; a target prefix without tagged MT targets is refused."""
    import torch

    from local import make_text_shards

    pairs = tmp_path / "pairs.parquet"
    make_text_shards.main([str(speech_corpus / "train.jsonl"), str(pairs), "--paired", "--src-field", "translation",
                           "--tgt-field", "text"])
    batches, mt_gradients = [], []
    original_start, original_loss = train.ASR.on_fit_batch_start, train.ASR.translation_loss

    def record_batch(brain, batch, should_step):
        batches.append((batch.stream, hasattr(batch, "sig"), hasattr(batch, "src_tokens")))
        return original_start(brain, batch, should_step)

    def record_gradient(brain, seq_log_probs, batch):
        loss = original_loss(brain, seq_log_probs, batch)
        shared = {name: p for name, p in brain.modules.model.named_parameters()
                  if name.startswith(("transformer.encoder.", "transformer.custom_tgt_module."))}
        grads = torch.autograd.grad(loss, list(shared.values()), retain_graph=True, allow_unused=True)
        mt_gradients.append({name.split(".")[1]: float(g.abs().sum()) for name, g in zip(shared, grads)
                             if g is not None and g.abs().sum() > 0})
        return loss

    monkeypatch.setattr(train.ASR, "on_fit_batch_start", record_batch)
    monkeypatch.setattr(train.ASR, "translation_loss", record_gradient)
    exp = tmp_path / "step2"
    argv = train_argv(speech_shards, tokenizer_file, exp, "--number_of_epochs=1", "--do_test=False",
                      f"--mt_parquets=[{pairs}]", "--mt_loader={max_batch_tokens: 800, max_batch_size: 32}",
                      "--task_mixing_alpha=0.0")
    train.main(argv)
    assert set(batches) == {("asr", True, False), ("mt", False, True)}  # one modality a batch
    mt_batches = sum(stream == "mt" for stream, *_ in batches)
    assert abs(mt_batches / len(batches) - 0.5) <= 1.0 / len(batches) + 1e-9  # alpha 0: half the batches
    assert len(mt_gradients) == mt_batches and all(set(g) == {"encoder", "custom_tgt_module"} for g in mt_gradients)
    log = open(exp / "train_log.txt").read()
    for name in ("mt_nll_loss", "mt_accuracy", "ctc_loss"):
        value = re.search(rf"train {name}: ([-+.\de]+)", log)
        assert value and float(value.group(1)) == float(value.group(1)), name  # logged, not NaN
    with pytest.raises(ValueError, match="target_lang_column"):
        train.main(argv[:1] + [f"--output_folder={tmp_path / 'bad'}"] + argv[2:] + ["--prefix_tokens=[<unk>]"])


def test_without_mt_parquets_the_training_batches_are_the_speech_loaders(speech_shards, tokenizer_file):
    """mt_parquets: [] (the default) leaves training as it was: the training loader is the speech
    loader alone, with the same planned batches, and no batch carries a task tag."""
    parquet = f"{speech_shards['train']}/metadata_pool.parquet"
    hparams = load_checked_hparams(os.path.join(CONFIGS, "demo.yaml"), {
        "train_parquet": parquet, "valid_parquet": parquet, "test_parquets": [parquet],
        "tokenizer_file": str(tokenizer_file), "num_workers": 0})
    assert hparams["mt_parquets"] == []
    loader = train.training_loader(hparams)
    assert type(loader) is type(train.speech_loader(hparams, parquet, True))
    assert loader.planned_keys(0) == train.speech_loader(hparams, parquet, True).planned_keys(0)
    loader.set_epoch(0)
    assert not hasattr(next(iter(loader)), "stream")
