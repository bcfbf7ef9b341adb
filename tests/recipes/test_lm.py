"""recipes/lm: run.sh trains a language model on the tokenizer's pieces; decoding fuses it."""

import os
import re
import subprocess
import sys

import pytest

from common.decoding import build_beam_searcher
from common.inference import load_language_model, load_trained
from recipes.finetune import export, transcribe
from tests.recipes.finetune_args import REPO

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
    """With --lm_dir the searcher scores with the RNNLM at the given weight, and transcribe.py runs
    with it end to end; another tokenizer's LM is refused by name."""
    asr = load_trained(str(trained), lm_dir=str(language_model), lm_weight=0.5)
    searcher = asr.beam_searcher(None)
    assert searcher.scorer.weights["rnnlm"] == 0.5 and searcher.scorer.weights["ctc"] == asr.settings["ctc_weight"]
    assert set(searcher.scorer.full_scorers) == {"ctc", "rnnlm"}
    plain = build_beam_searcher(asr.model, beam_size=2, ctc_weight=0.4)
    assert set(plain.scorer.full_scorers) == {"ctc"}
    audio = sorted((speech_corpus / "wav" / "test").glob("*.wav"))[:2]
    assert transcribe.main([str(trained), *map(str, audio), "--lm_dir", str(language_model), "--lm_weight", "0.5"]) == 0
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
