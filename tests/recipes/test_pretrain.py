"""recipes/pretrain: a few steps of all three tasks on espeak-ng shards; finetuning loads the result."""

import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch

from common.recipe import load_checked_hparams
from local import extract_units, make_text_shards, train_tokenizer
from recipes.finetune import train as finetune_train
from recipes.pretrain import train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(REPO, "recipes", "pretrain", "hparams")
FINETUNE_DEMO = os.path.join(REPO, "recipes", "finetune", "hparams", "demo.yaml")
TINY_MODEL = ["--d_model=32", "--nhead=2", "--num_encoder_layers=1", "--num_decoder_layers=1", "--d_ffn=64"]
TINY = TINY_MODEL + ["--max_batch_seconds=40.0", "--max_batch_tokens=800", "--num_workers=0",
                     "--warmup_steps=4", "--noprogressbar"]


@pytest.fixture(scope="module")
def pretrain_data(speech_corpus, speech_shards, tmp_path_factory):
    """Tokenizer with <mask>, units of train and dev (12 clusters), mono and paired text parquets."""
    out = tmp_path_factory.mktemp("pretrain_data")
    texts = train_tokenizer.read_texts([str(speech_shards["train"])])
    texts += train_tokenizer.read_texts([str(speech_shards["train"])], text_field="translation")
    tokenizer = train_tokenizer.train_tokenizer(texts, str(out / "tokenizer"), 60, "bpe", ["<mask>"])
    fast = ["--n-units", "12", "--fit-fraction", "0.25", "--min-fit-utterances", "8", "--jobs", "1"]
    extract_units.main([str(speech_shards["train"]), str(out / "units_train"), *fast])
    extract_units.main([str(speech_shards["dev"]), str(out / "units_dev"), *fast,
                        "--kmeans", str(out / "units_train" / "kmeans.json")])
    manifest = str(speech_corpus / "train.jsonl")
    make_text_shards.main([manifest, str(out / "mono.parquet"), "--lang", "en"])
    make_text_shards.main([manifest, str(out / "pairs.parquet"), "--paired", "--src-field", "translation",
                           "--tgt-field", "text"])
    return {"tokenizer": tokenizer, "units": out / "units_train", "valid_units": out / "units_dev",
            "mono": out / "mono.parquet", "pairs": out / "pairs.parquet"}


@pytest.fixture(scope="module")
def pretrained(pretrain_data, speech_shards, tmp_path_factory):
    """One epoch of the demo config with a tiny model; returns the experiment folder."""
    exp = tmp_path_factory.mktemp("exp") / "pretrain"
    d = pretrain_data
    train.main([os.path.join(CONFIGS, "demo.yaml"), f"--output_folder={exp}", f"--tokenizer_file={d['tokenizer']}",
                f"--speech_parquets=[{speech_shards['train']}/metadata_pool.parquet]",
                f"--units_dirs=[{d['units']}]", f"--text_parquets=[{d['mono']}]",
                f"--paired_parquets=[{d['pairs']}]",
                f"--valid_parquet={speech_shards['dev']}/metadata_pool.parquet",
                f"--valid_units_dir={d['valid_units']}", *TINY, "--number_of_epochs=1"])
    return exp


def test_one_epoch_trains_every_task_and_checkpoints_the_loader(pretrained):
    """The train log has finite losses and accuracies of speech, text and paired batches (each task
    got batches); the checkpoint holds the graph, heads, statistics and the loader's position."""
    log = open(pretrained / "train_log.txt").read()
    for name in ("speech_masked_loss", "speech_masked_accuracy", "text_loss", "text_accuracy",
                 "paired_loss", "paired_accuracy", "speech_share", "text_share", "paired_share"):
        value = re.search(rf"{name}: ([-+.\de]+)", log)
        assert value and math.isfinite(float(value.group(1))), name
    assert float(re.search(r"text_share: ([-+.\de]+)", log).group(1)) > 0
    checkpoint = glob.glob(str(pretrained / "save" / "CKPT+*"))[-1]
    for name in ("model", "normalize", "heads", "train_loader"):
        assert os.path.isfile(os.path.join(checkpoint, f"{name}.ckpt")), name
    state = json.load(open(os.path.join(checkpoint, "train_loader.ckpt")))
    assert set(state["streams"]) == {"speech", "text", "paired"}
    assert (state["epoch"], state["position"]) == (2, 0)  # epoch 1 done: the next starts afresh
    assert (pretrained / "tokenizer.model").is_file()


def finetune_hparams(pretrained, speech_shards, tmp_path, tokenizer=None):
    """The finetune demo config with the tiny sizes, starting from ``pretrained``."""
    parquet = f"{speech_shards['train']}/metadata_pool.parquet"
    return load_checked_hparams(FINETUNE_DEMO, {
        "output_folder": str(tmp_path / "ft"), "tokenizer_file": str(tokenizer or pretrained / "tokenizer.model"),
        "train_parquet": parquet, "valid_parquet": parquet, "test_parquets": [parquet],
        "pretrained": str(pretrained), **{arg[2:].split("=")[0]: int(arg.split("=")[1]) for arg in TINY_MODEL}})


def test_finetuning_with_another_tokenizer_is_refused(pretrained, speech_shards, tmp_path):
    """Token ids of another tokenizer mean other pieces: the error names the tokenizer to use."""
    texts = train_tokenizer.read_texts([str(speech_shards["train"])])
    other = train_tokenizer.train_tokenizer(texts, str(tmp_path / "other"), 60, "unigram", ["<mask>"])
    with pytest.raises(ValueError, match="tokenizer.model"):
        finetune_train.init_from_pretrained(finetune_hparams(pretrained, speech_shards, tmp_path, other))


def test_finetune_graph_loads_the_pretrained_encoder_embedding_and_decoder_by_name(pretrained,
                                                                                   speech_shards, tmp_path):
    """The finetune recipe's --pretrained loading (demo config, same tiny sizes) gives its model every
    tensor of the pretrained model.ckpt, encoder, token embedding and decoder included, and the
    feature statistics."""
    hparams = finetune_hparams(pretrained, speech_shards, tmp_path)
    model, normalize = hparams["model"], hparams["graph"]["normalize"]
    checkpoint = glob.glob(str(pretrained / "save" / "CKPT+*"))[-1]
    source = torch.load(os.path.join(checkpoint, "model.ckpt"))
    encoder_key = next(k for k in source if k.startswith("transformer.encoder."))
    assert not torch.equal(model.state_dict()[encoder_key], source[encoder_key])
    finetune_train.init_from_pretrained(hparams)
    loaded = model.state_dict()
    assert set(loaded) == set(source)
    for name, tensor in source.items():
        assert torch.equal(loaded[name], tensor), name
    for prefix in ("transformer.encoder.", "transformer.custom_tgt_module.", "transformer.decoder."):
        assert any(k.startswith(prefix) for k in source), prefix
    statistics = torch.load(os.path.join(checkpoint, "normalize.ckpt"))
    assert torch.equal(normalize.glob_mean, statistics["glob_mean"])


def test_pretrained_parts_load_the_decoder_alone_and_leave_the_encoder_fresh(pretrained, speech_shards, tmp_path):
    """pretrained_parts=[cross_attention, language_model]: every decoder tensor (and the token
    embedding) is the pretrained one, every encoder and CTC tensor (buffers included) and the feature
    statistics stay as initialised; a group name that does not exist is refused, naming the groups."""
    hparams = finetune_hparams(pretrained, speech_shards, tmp_path)
    hparams["pretrained_parts"] = ["cross_attention", "language_model"]
    model, normalize = hparams["model"], hparams["graph"]["normalize"]
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    statistics_before = normalize.glob_mean.clone() if torch.is_tensor(normalize.glob_mean) else normalize.glob_mean
    source = torch.load(os.path.join(glob.glob(str(pretrained / "save" / "CKPT+*"))[-1], "model.ckpt"))
    finetune_train.init_from_pretrained(hparams)
    loaded = model.state_dict()
    fresh = ("frontend.", "transformer.custom_src_module.", "transformer.encoder.", "ctc_lin.")
    assert any(name.startswith("transformer.encoder.") for name in loaded)
    for name, tensor in loaded.items():
        expected = before[name] if name.startswith(fresh) else source[name]
        assert torch.equal(tensor, expected), name
    assert any(not torch.equal(before[n], source[n]) for n in loaded if n.startswith("transformer.decoder."))
    assert (torch.equal(normalize.glob_mean, statistics_before) if torch.is_tensor(statistics_before)
            else normalize.glob_mean == statistics_before)
    hparams["pretrained_parts"] = ["decoder"]
    with pytest.raises(ValueError, match="language_model"):
        finetune_train.init_from_pretrained(hparams)


def test_pretrained_encoder_layers_keep_the_lower_layers_and_leave_the_top_fresh(pretrained, speech_shards,
                                                                                 tmp_path):
    """pretrained_encoder_layers=L-1: the conformer layers below the top one (and the front-end, input
    projection, CTC head and decoder) are the pretrained ones, the top layer and the encoder's final norm
    stay as initialised; a count above the encoder's layers, or without the encoder among the parts, is
    refused."""
    hparams = finetune_hparams(pretrained, speech_shards, tmp_path)
    keep = hparams["num_encoder_layers"] - 1
    hparams["pretrained_encoder_layers"] = keep
    model = hparams["model"]
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    source = torch.load(os.path.join(glob.glob(str(pretrained / "save" / "CKPT+*"))[-1], "model.ckpt"))
    finetune_train.init_from_pretrained(hparams)
    loaded = model.state_dict()
    fresh = [name for name in loaded if name.startswith(("transformer.encoder.norm.",
                                                          f"transformer.encoder.layers.{keep}."))]
    assert fresh and any(name.startswith("transformer.custom_src_module.") for name in loaded)
    for name, tensor in loaded.items():
        assert torch.equal(tensor, before[name] if name in fresh else source[name]), name
    assert any(not torch.equal(before[name], source[name]) for name in fresh)
    for count, parts in ((hparams["num_encoder_layers"] + 1, ["encoder"]), (0, ["language_model"])):
        hparams["pretrained_encoder_layers"], hparams["pretrained_parts"] = count, parts
        with pytest.raises(ValueError, match="pretrained_encoder_layers"):
            finetune_train.init_from_pretrained(hparams)


def test_run_sh_refuses_speech_that_is_not_a_shard_folder(tmp_path):
    """--train must be a shard folder: run.sh exits 2 naming the tool that makes one."""
    env = dict(os.environ, PYTHON=sys.executable)
    result = subprocess.run(["bash", os.path.join(REPO, "recipes", "pretrain", "run.sh"), "--train",
                             str(tmp_path), "--stop_stage", "0"], capture_output=True, text=True, env=env)
    assert result.returncode == 2 and "make_shards.py" in result.stderr


def test_a_second_run_resumes_from_the_checkpoint_and_trains_the_next_epoch(pretrained, pretrain_data,
                                                                            speech_shards, tmp_path):
    """Rerunning with number_of_epochs=2 in a copy of the folder recovers epoch 1 (model, heads,
    loader) and trains only epoch 2: the log gains one epoch line, the loader state moves to epoch 3."""
    exp = tmp_path / "resumed"
    shutil.copytree(pretrained, exp)
    d = pretrain_data
    train.main([os.path.join(CONFIGS, "demo.yaml"), f"--output_folder={exp}", f"--tokenizer_file={d['tokenizer']}",
                f"--speech_parquets=[{speech_shards['train']}/metadata_pool.parquet]",
                f"--units_dirs=[{d['units']}]", f"--text_parquets=[{d['mono']}]",
                f"--paired_parquets=[{d['pairs']}]", *TINY, "--number_of_epochs=2"])
    epochs = re.findall(r"^epoch: (\d+)", open(exp / "train_log.txt").read(), flags=re.M)
    assert epochs == ["1", "2"]
    newest = max(glob.glob(str(exp / "save" / "CKPT+*")), key=os.path.getmtime)
    assert json.load(open(os.path.join(newest, "train_loader.ckpt")))["epoch"] == 3


def test_two_ranks_under_torchrun_pretrain_every_task_in_equal_steps(pretrain_data, speech_shards, tmp_path):
    """torchrun --nproc_per_node=2 on the CPU (gloo) with all three tasks: no hang (a text batch on
    one rank beside a speech batch on the other leaves different parameters unused), both ranks take
    the same number of steps and each task appears among them."""
    exp, d = tmp_path / "ddp", pretrain_data
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               os.path.join(REPO, "recipes", "pretrain", "train.py"), os.path.join(CONFIGS, "demo.yaml"),
               f"--output_folder={exp}", f"--tokenizer_file={d['tokenizer']}",
               f"--speech_parquets=[{speech_shards['train']}/metadata_pool.parquet]", f"--units_dirs=[{d['units']}]",
               f"--text_parquets=[{d['mono']}]", f"--paired_parquets=[{d['pairs']}]", *TINY,
               "--number_of_epochs=1", "--batch_log=True"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]
    ranks = [[json.loads(line) for line in open(exp / "batches" / f"rank{rank}.jsonl")] for rank in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) > 0
    assert [line["update"] for line in ranks[0]] == [line["update"] for line in ranks[1]]
    log = open(exp / "train_log.txt").read()
    for task in ("speech", "text", "paired"):
        assert float(re.search(rf"{task}_share: ([-+.\de]+)", log).group(1)) > 0, task


def test_bestrq_pretraining_reads_untranscribed_shards_without_a_units_stage(speech_corpus, pretrain_data, tmp_path):
    """speech_targets=bestrq on shards made with --unlabelled (null texts) and no units folder: the
    speech task trains (finite masked loss), the unit head has one output per code, and the codes saved
    with the heads are the seed's."""
    from common.models.pretraining import BestRqTargets
    from local import make_shards

    records = [json.loads(line) for line in open(speech_corpus / "train.jsonl")]
    manifest = tmp_path / "audio_only.jsonl"
    manifest.write_text("".join(json.dumps({"id": r["id"], "audio": os.path.join(speech_corpus, r["audio"])}) + "\n"
                                for r in records))
    make_shards.main([str(manifest), str(tmp_path / "shards"), "--jobs", "1", "--unlabelled"])
    exp = tmp_path / "bestrq"
    train.main([os.path.join(CONFIGS, "demo.yaml"), f"--output_folder={exp}",
                f"--tokenizer_file={pretrain_data['tokenizer']}", "--speech_targets=bestrq",
                "--bestrq_codebook_size=32", f"--speech_parquets=[{tmp_path / 'shards'}/metadata_pool.parquet]",
                f"--text_parquets=[{pretrain_data['mono']}]", *TINY, "--number_of_epochs=1"])
    log = open(exp / "train_log.txt").read()
    assert math.isfinite(float(re.search(r"speech_masked_loss: ([-+.\de]+)", log).group(1)))
    heads = torch.load(glob.glob(str(exp / "save" / "CKPT+*" / "heads.ckpt"))[-1])
    assert heads["unit_head.weight"].shape[0] == 32
    expected = BestRqTargets(72, 9, 32, 16, seed=1234).quantiser
    assert torch.equal(heads["bestrq.quantiser.CB"], expected.CB)


def test_text_as_a_language_model_trains_the_decoder_alone(pretrain_data, speech_shards, tmp_path, monkeypatch):
    """text_task=lm: every mono text batch goes through the decoder-only pass (no source, no noise) and
    its loss is logged; an unknown text_task is refused naming the choices."""
    from common.models.pretraining import JointPretrainModel

    calls = []
    original = JointPretrainModel.language_model
    monkeypatch.setattr(JointPretrainModel, "language_model",
                        lambda self, tokens_bos: calls.append(tokens_bos.shape) or original(self, tokens_bos))
    d, exp = pretrain_data, tmp_path / "lm"
    args = [os.path.join(CONFIGS, "demo.yaml"), f"--output_folder={exp}", f"--tokenizer_file={d['tokenizer']}",
            f"--speech_parquets=[{speech_shards['train']}/metadata_pool.parquet]", f"--units_dirs=[{d['units']}]",
            f"--text_parquets=[{d['mono']}]", *TINY, "--number_of_epochs=1"]
    train.main(args + ["--text_task=lm"])
    log = open(exp / "train_log.txt").read()
    steps = int(re.search(r"steps: (\d+)", log).group(1))
    text_batches = float(re.search(r"text_share: ([-+.\de]+)", log).group(1)) * steps
    assert len(calls) > 0 and abs(len(calls) - text_batches) < 0.5
    assert math.isfinite(float(re.search(r"text_loss: ([-+.\de]+)", log).group(1)))
    with pytest.raises(ValueError, match="text_task: 'bart'.*denoise"):
        train.main(args + ["--text_task=bart", f"--output_folder={tmp_path / 'bad'}"])


def test_corpora_of_a_modality_are_mixed_to_their_targets_within_a_batch(pretrain_data, speech_shards, tmp_path,
                                                                          capfd):
    """Two speech corpora weighted 3:1 beside mono text: each epoch's logged share of each corpus is its
    target (the modality's share times the corpus's) to within one batch of the epoch."""
    d = pretrain_data
    exp = tmp_path / "corpora"
    train.main([os.path.join(CONFIGS, "demo.yaml"), f"--output_folder={exp}", f"--tokenizer_file={d['tokenizer']}",
                f"--speech_parquets=[{speech_shards['train']}/metadata_pool.parquet, "
                f"{speech_shards['dev']}/metadata_pool.parquet]", "--corpus_weights={train: 3, dev: 1}",
                f"--units_dirs=[{d['units']}, {d['valid_units']}]", f"--text_parquets=[{d['mono']}]",
                *TINY, "--number_of_epochs=1"])
    logged = re.search(r"training mix targets: (.*)", "".join(capfd.readouterr())).group(1)
    targets = dict(re.findall(r"(\w+) ([.\d]+)", logged))
    assert float(targets["speech_train"]) == pytest.approx(3 * float(targets["speech_dev"]), abs=0.002)
    log = open(exp / "train_log.txt").read()
    steps = int(re.search(r"steps: (\d+)", log).group(1))
    for name in ("speech", "text", "speech_train", "speech_dev"):
        achieved = float(re.search(rf"train {name}_share: ([-+.\de]+)", log).group(1))
        assert abs(achieved - float(targets[name])) <= 1.0 / steps + 1e-9, name
    report = (exp / "data_report" / "report.md").read_text()
    for name in ("speech", "speech_train", "speech_dev", "text"):
        assert re.search(rf"\| {name} \| \d+ \| {targets[name]} \|", report), name


def test_a_dry_run_writes_the_planned_mix_and_trains_nothing(pretrain_data, speech_shards, tmp_path):
    d, exp = pretrain_data, tmp_path / "dry"
    train.main([os.path.join(CONFIGS, "demo.yaml"), f"--output_folder={exp}", f"--tokenizer_file={d['tokenizer']}",
                f"--speech_parquets=[{speech_shards['train']}/metadata_pool.parquet]", f"--units_dirs=[{d['units']}]",
                f"--text_parquets=[{d['mono']}]", *TINY, "--dry_run=True"])
    assert "| speech |" in (exp / "data_report" / "report.md").read_text()
    assert not glob.glob(str(exp / "save" / "CKPT+*")) and not (exp / "train_log.txt").exists()


def test_mixing_weights_from_the_command_line_set_the_task_shares(pretrain_data, speech_shards, tmp_path):
    """--mixing_weights={"speech":0,"text":1} plans no speech batches (text alone); a task without a
    weight is refused naming it."""
    d = pretrain_data
    args = [os.path.join(CONFIGS, "demo.yaml"), f"--tokenizer_file={d['tokenizer']}",
            f"--speech_parquets=[{speech_shards['train']}/metadata_pool.parquet]", f"--units_dirs=[{d['units']}]",
            f"--text_parquets=[{d['mono']}]", *TINY, "--dry_run=True"]
    train.main(args + [f"--output_folder={tmp_path / 'text'}", '--mixing_weights={"speech":0,"text":1}'])
    report = (tmp_path / "text" / "data_report" / "report.md").read_text()
    assert re.search(r"\| speech \| \d+ \| 0.000 \|", report) and re.search(r"\| text \| \d+ \| 1.000 \|", report)
    with pytest.raises(ValueError, match=r"mixing_weights has no weight for \['text'\]"):
        train.main(args + [f"--output_folder={tmp_path / 'bad'}", '--mixing_weights={"speech":1}'])


def test_a_second_iteration_clusters_an_encoder_layer_of_the_pretrained_model(pretrained, speech_shards, tmp_path):
    """extract_units.py --features EXP:1: one unit per encoder frame of that model (its frame rate), the
    hash names the checkpoint's weights; a layer the encoder lacks is a usage error."""
    from common.data.units import read_units

    out = tmp_path / "units_it2"
    extract_units.main([str(speech_shards["dev"]), str(out), "--features", f"{pretrained}:1", "--n-units", "6",
                        "--fit-fraction", "1.0", "--min-fit-utterances", "4", "--jobs", "1"])
    units = read_units(str(out))
    info = json.load(open(out / "kmeans.json"))
    assert info["features"]["name"] == "encoder_layer" and info["features"]["layer"] == 1
    assert units.frame_rate_hz == pytest.approx(100 / 9, rel=0.01)  # the demo's 90 ms encoder frames
    durations = dict(zip(*pq.read_table(speech_shards["dev"] / "metadata_pool.parquet",
                                        columns=["sample_key", "duration"]).to_pydict().values()))
    for key, sample_units in units.units_by_key.items():
        assert abs(len(sample_units) - durations[key] * units.frame_rate_hz) <= 2
    with pytest.raises(SystemExit) as exit_info:
        extract_units.main([str(speech_shards["dev"]), str(tmp_path / "bad"), "--features", f"{pretrained}:9"])
    assert exit_info.value.code == 2


def test_encoder_layer_features_come_from_a_finetunings_averaged_weights(pretrained, tmp_path):
    """An experiment with ``averaged.ckpt`` (a finetuning's test stage writes it) is read through those
    weights, not its newest checkpoint: the same weights saved there give the same features, halved ones
    other features, and the k-means record names the file whose weights it hashed."""
    from common.models.encoder_features import EncoderLayerFeatures

    wave = torch.randn(16000, generator=torch.Generator().manual_seed(0)).numpy() * 0.1
    newest = EncoderLayerFeatures(str(pretrained), 1)
    copy = tmp_path / "finetuned"
    shutil.copytree(pretrained, copy)
    weights = newest.model.state_dict()
    statistics = torch.load(os.path.join(sorted(glob.glob(str(pretrained / "save" / "CKPT+*")))[-1],
                                         "normalize.ckpt"))
    torch.save({"model": weights, "normalize": statistics}, copy / "averaged.ckpt")
    same = EncoderLayerFeatures(str(copy), 1)
    assert same.describe()["weights"] == "averaged.ckpt" and newest.describe()["weights"] == "model.ckpt"
    assert same(wave) == pytest.approx(newest(wave), abs=1e-5)
    halved = {name: value * 0.5 if value.is_floating_point() else value for name, value in weights.items()}
    torch.save({"model": halved, "normalize": statistics}, copy / "averaged.ckpt")
    assert abs(EncoderLayerFeatures(str(copy), 1)(wave) - newest(wave)).max() > 1e-3


def test_speech_and_text_corpora_take_their_own_temperature(pretrain_data, speech_shards, tmp_path):
    """speech_alpha 0 shares the two speech corpora equally; text_alpha 1 shares the two text corpora
    in proportion to their batches per epoch (natural sizes), corpus_mixing_alpha 0.5 left unused: each
    corpus's planned share of its modality is size ** alpha / sum within 0.002."""
    from common.data.units import read_units

    d = pretrain_data
    hparams = load_checked_hparams(os.path.join(CONFIGS, "demo.yaml"), {
        "output_folder": str(tmp_path / "alphas"), "tokenizer_file": str(d["tokenizer"]),
        "speech_parquets": [f"{speech_shards[split]}/metadata_pool.parquet" for split in ("train", "dev")],
        "units_dirs": [str(d["units"]), str(d["valid_units"])], "text_parquets": [str(d["mono"]), str(d["pairs"])],
        "speech_alpha": 0.0, "text_alpha": 1.0, "corpus_mixing_alpha": 0.5, "num_workers": 0,
        **{arg[2:].split("=")[0]: int(arg.split("=")[1]) for arg in TINY_MODEL}})
    mix = train.training_mix(hparams, 0, 1, units=read_units([str(d["units"]), str(d["valid_units"])]))
    for modality, alpha in (("speech", 0.0), ("text", 1.0)):
        corpora = mix.streams[modality]
        sizes = {name: corpora.streams[name].batches_in_epoch(0) ** alpha for name in corpora.names}
        for name, share in corpora.targets().items():
            assert share == pytest.approx(sizes[name] / sum(sizes.values()), abs=0.002), name
    speech = mix.streams["speech"].streams
    assert speech["train"].batches_in_epoch(0) != speech["dev"].batches_in_epoch(0)  # unequal sizes, equal shares


def test_unit_decoder_masked_paired_text_and_transcribed_speech_train_together(pretrain_data, speech_shards, tmp_path,
                                                                              monkeypatch):
    """add_decoder, whole-word text masking, mask_text_ratio and transcribed speech in one epoch: the log
    has finite unit-decoder, voiced masked-accuracy and transcribed CTC figures and a transcribed share;
    paired sources reach the model with <mask> in them (mask_text_ratio 0.5), and without it never (mono
    text as a language model, so every source seen is a paired one)."""
    from common.data import Tokenizer
    from common.models.pretraining import JointPretrainModel

    d = pretrain_data
    mask_id = Tokenizer(d["tokenizer"]).piece_id("<mask>")
    sources = []
    original = JointPretrainModel.text_to_text
    monkeypatch.setattr(JointPretrainModel, "text_to_text",
                        lambda self, src, *rest: sources.append(src) or original(self, src, *rest))
    args = [os.path.join(CONFIGS, "demo.yaml"), f"--tokenizer_file={d['tokenizer']}",
            f"--speech_parquets=[{speech_shards['train']}/metadata_pool.parquet]", f"--units_dirs=[{d['units']}]",
            f"--text_parquets=[{d['mono']}]", f"--paired_parquets=[{d['pairs']}]", *TINY, "--number_of_epochs=1"]
    exp = tmp_path / "seed_parts"
    train.main(args + [f"--output_folder={exp}", "--add_decoder=True", "--mask_text_ratio=0.5", "--text_task=lm",
                       "--text_noising={mask_ratio: 0.3, poisson_lambda: 3.5, replace_length: 1, random_ratio: 0.0, "
                       "insert_ratio: 0.0, rotate_prob: 0.0, permute_ratio: 0.0, whole_word_mask: True}",
                       f"--transcribed_parquets=[{speech_shards['dev']}/metadata_pool.parquet]"])
    log = open(exp / "train_log.txt").read()
    for name in ("speech_unit_decoder_loss", "speech_unit_decoder_accuracy", "speech_masked_voiced_accuracy",
                 "transcribed_ctc_loss", "transcribed_share"):
        value = re.search(rf"{name}: ([-+.\de]+)", log)
        assert value and math.isfinite(float(value.group(1))), name
    assert sources and all(bool((src == mask_id).any()) for src in sources)  # (text_task lm: paired only)
    heads = torch.load(glob.glob(str(exp / "save" / "CKPT+*" / "heads.ckpt"))[-1])
    assert "unit_decoder_head.weight" in heads
    sources.clear()
    train.main(args + [f"--output_folder={tmp_path / 'plain'}", "--text_task=lm"])
    assert sources and not any(bool((src == mask_id).any()) for src in sources)  # paired sources unmasked


def test_the_probe_bench_reports_every_layer_of_the_trained_and_the_scratch_encoder(pretrained, speech_shards,
                                                                                    capsys):
    """bench/probe.py on the pretrained demo experiment: one CER row per layer (input projection + each
    encoder layer) for the trained and the scratch encoder, in the table and the JSON line."""
    from bench import probe

    dev = f"{speech_shards['dev']}/metadata_pool.parquet"
    probe.main(["--exp", str(pretrained), "--train", dev, "--dev", dev, "--scratch", "--updates", "3",
                "--max-utterances", "6", "--json"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(row["encoder"], row["layer"]) for row in figures["layers"]] == [
        (name, layer) for name in ("trained", "scratch") for layer in (0, 1)]  # the tiny model: 1 layer
    assert all(0.0 <= row["cer"] and row["cer_ci"][0] <= row["cer"] <= row["cer_ci"][1] for row in figures["layers"])


def test_the_unit_quality_bench_scores_kmeans_units_against_aligned_characters(trained, pretrain_data,
                                                                               speech_shards, capsys):
    """bench/unit_quality.py with a finetuned aligner and the dev split's k-means units: one row of
    purities and PNMI in [0, 1] over the aligned frames, in the table and the JSON line."""
    from bench import unit_quality

    unit_quality.main(["--aligner", str(trained), "--parquet", f"{speech_shards['dev']}/metadata_pool.parquet",
                       "--units", str(pretrain_data["valid_units"]), "--json"])
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["codes"]["kmeans"]
    assert figures["frames"] > 0
    assert all(0.0 <= figures[name] <= 1.0 + 1e-9 for name in ("label_purity", "code_purity", "pnmi"))


def test_the_unit_quality_bench_scores_the_codes_of_a_bestrq_experiment(trained, pretrain_data, speech_shards,
                                                                         tmp_path, capsys):
    """--bestrq EXP: the experiment's saved projection and codebook give its codes (the Fbank of its own
    config), brought to the aligner's frames and scored beside the k-means units."""
    from bench import unit_quality

    exp = tmp_path / "bestrq"
    train.main([os.path.join(CONFIGS, "demo.yaml"), f"--output_folder={exp}",
                f"--tokenizer_file={pretrain_data['tokenizer']}", "--speech_targets=bestrq",
                "--bestrq_codebook_size=32", f"--speech_parquets=[{speech_shards['train']}/metadata_pool.parquet]",
                *TINY, "--number_of_epochs=1"])
    capsys.readouterr()
    unit_quality.main(["--aligner", str(trained), "--parquet", f"{speech_shards['dev']}/metadata_pool.parquet",
                       "--units", str(pretrain_data["valid_units"]), "--bestrq", str(exp), "--max-utterances", "8",
                       "--json"])
    codes = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["codes"]
    assert set(codes) == {"kmeans", "bestrq"} and codes["bestrq"]["frames"] == codes["kmeans"]["frames"]
    assert 0.0 <= codes["bestrq"]["pnmi"] <= 1.0 + 1e-9
