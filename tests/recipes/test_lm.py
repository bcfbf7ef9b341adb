"""recipes/lm: run.sh trains a language model on the tokenizer's pieces; decoding fuses it."""

import json
import os
import re
import subprocess
import sys

import pytest

from common.decoding import build_beam_searcher
from common.inference import load_language_model, load_trained
from recipes.finetune import export, transcribe
from tests.recipes.finetune_args import REPO, TINY, data_options, run_sh

TINY_LM = ["--embedding_dim=16", "--rnn_layers=1", "--rnn_neurons=32", "--dnn_neurons=32", "--warmup_steps=2",
           "--lr_peak=0.01", "--noprogressbar"]


@pytest.fixture(scope="module")
def language_model(speech_corpus, tokenizer_file, tmp_path_factory):
    """run.sh stages 0-1 on the tiny corpus' transcripts (train manifest as text, dev as held-out)."""
    work = tmp_path_factory.mktemp("lm")
    exp = work / "exp"
    command = ["bash", f"{REPO}/recipes/lm/run.sh", "--tokenizer", str(tokenizer_file), "--data", str(work),
               "--text", str(speech_corpus / "train.jsonl"), "--valid", str(speech_corpus / "dev.jsonl"),
               "--exp", str(exp), "--", "--number_of_epochs=4", *TINY_LM]
    result = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PYTHON=sys.executable))
    assert result.returncode == 0, result.stderr[-4000:]
    return exp


def test_run_sh_trains_a_language_model_whose_validation_loss_falls(language_model):
    """Four epochs on 40 sentences: validation perplexity falls from the first epoch to the last, and
    the folder holds the averaged lm.ckpt, the tokenizer copy and the curves."""
    for name in ("lm.ckpt", "tokenizer.model", "hyperparams.yaml", "curves.png"):
        assert (language_model / name).is_file(), name
    log = (language_model / "train_log.txt").read_text()
    perplexities = [float(v) for v in re.findall(r"valid perplexity: ([-+.\de]+)", log)]
    assert len(perplexities) == 4 and perplexities[-1] < 0.8 * perplexities[0], perplexities


def test_the_language_model_joins_the_beam_search_and_transcribe_uses_it(language_model, trained, tokenizer_file,
                                                                         speech_corpus, capsys):
    """With --lm_dir the searcher scores with the RNNLM at the given weight (and --ctc_weight, when
    given, replaces the config's CTC share), and transcribe.py runs with it end to end; another
    tokenizer's LM is refused by name."""
    asr = load_trained(str(trained), lm_dir=str(language_model), lm_weight=0.5)
    searcher = asr.beam_searcher(None)
    assert searcher.scorer.weights["rnnlm"] == 0.5 and searcher.scorer.weights["ctc"] == asr.settings["ctc_weight"]
    assert asr.settings["ctc_weight"] != 0.6
    assert load_trained(str(trained), ctc_weight=0.6).beam_searcher(None).scorer.weights["ctc"] == 0.6
    assert set(searcher.scorer.full_scorers) == {"ctc", "rnnlm"}
    plain = build_beam_searcher(asr.model, beam_size=2, ctc_weight=0.4)
    assert set(plain.scorer.full_scorers) == {"ctc"}
    audio = sorted((speech_corpus / "wav" / "test").glob("*.wav"))[:2]
    assert transcribe.main([str(trained), *map(str, audio), "--lm_dir", str(language_model), "--lm_weight", "0.5",
                            "--ctc_weight", "0.6"]) == 0
    assert len([line for line in capsys.readouterr().out.splitlines() if "\t" in line]) == 2
    other = language_model.parent / "other_tokenizer.model"
    other.write_bytes(b"not the same model")
    with pytest.raises(ValueError, match="was not trained with"):
        load_language_model(str(language_model), str(other))


def test_the_exported_folder_carries_the_language_model(language_model, trained, speech_corpus, tmp_path, capsys):
    """export.py --lm_dir writes the LM into the SpeechBrain folder; EncoderDecoderASR decodes with it
    exactly as transcribe.py does with the same LM and weight."""
    from speechbrain.inference.ASR import EncoderDecoderASR

    out = tmp_path / "exported"
    assert export.main([str(trained), str(out), "--lm_dir", str(language_model), "--lm_weight", "0.5"]) == 0
    config = (out / "hyperparams.yaml").read_text()
    assert (out / "lm.ckpt").is_file() and "RNNLMScorer" in config and "rnnlm: 0.5" in config
    audio = [str(path) for path in sorted((speech_corpus / "wav" / "test").glob("*.wav"))[:3]]
    transcribe.main([str(trained), *audio, "--lm_dir", str(language_model), "--lm_weight", "0.5",
                     "--max_batch_size", "1", "--raw_audio"])
    ours = [line.split("\t")[1] for line in capsys.readouterr().out.splitlines() if "\t" in line]
    asr = EncoderDecoderASR.from_hparams(source=str(out), savedir=str(tmp_path / "loaded"))
    assert [asr.transcribe_file(path) for path in audio] == ours


def test_finetune_run_sh_trains_the_lm_beside_the_model_and_decodes_with_it(speech_shards, speech_corpus, tmp_path):
    """--lm_text: stage 2 trains recipes/lm on that text with the ASR tokenizer into <exp>_lm, and
    stage 3 loads it and decodes at --lm_weight with --lm_decode_args; with shard folders as --valid
    and no --lm_valid the run is refused before any work, naming the option."""
    exp = tmp_path / "exp"
    common = ["--stage", "1", "--data", str(tmp_path / "data"), "--vocab_size", "60", "--config",
              "hparams/demo.yaml", "--exp", str(exp), *data_options(speech_shards),
              "--lm_text", str(speech_corpus / "train.jsonl")]
    refused = run_sh(*common, check=False)
    assert refused.returncode == 2 and "--lm_valid" in refused.stderr and not (tmp_path / "data").exists()
    result = run_sh(*common, "--lm_valid", str(speech_corpus / "dev.jsonl"), "--lm_weight", "0.5",
                    "--lm_decode_args", "--beam_size=3 --ctc_weight=0.6",
                    "--lm_args", " ".join(["--number_of_epochs=2", *TINY_LM]), "--", "--number_of_epochs=2", *TINY)
    lm_exp = tmp_path / "exp_lm"
    assert "Stage 2: language model" in result.stderr and (lm_exp / "lm.ckpt").is_file()
    assert f"language model {lm_exp}" in (exp / "log.txt").read_text()
    decode = (exp / "command.txt").read_text().splitlines()[-1]
    assert "--do_train=False" in decode and f"--lm_dir={lm_exp}" in decode and "--lm_weight=0.5" in decode
    assert "--beam_size=3 --ctc_weight=0.6" in decode
    assert json.loads((exp / "results.json").read_text())["test"]["num_utterances"] == 8
