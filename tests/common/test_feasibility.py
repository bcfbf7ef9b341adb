"""common/feasibility.py: CTC alignment margins from metadata, and the warning before training."""

import logging

import numpy as np

from common.data import SpeechLoaderConfig, make_speech_loader
from common.feasibility import ctc_feasibility, ctc_frames_needed, warn_if_infeasible
from local import train_tokenizer
from recipes.finetune.train import training_data_report


def test_frames_needed_counts_a_blank_between_repeated_tokens():
    """'l l' needs a blank between the two: 'hello' as characters needs 6 frames, not 5."""
    assert ctc_frames_needed([8, 5, 12, 12, 15]) == 6
    assert ctc_frames_needed([]) == 0 and ctc_frames_needed([3, 3, 3]) == 5


def test_report_counts_impossible_and_tight_utterances_at_the_encoder_rate():
    """At 10 frames/s a 1 s utterance has 10 frames: 11 tokens are impossible, 9 are tight, 4 fine;
    speed perturbation's fastest factor shortens the audio."""
    report = ctc_feasibility([1.0, 1.0, 1.0], [list(range(11)), list(range(9)), [1, 2, 3, 4]], 10.0)
    assert (report.impossible, report.tight, report.utterances) == (1, 1, 3)
    faster = ctc_feasibility([1.0], [list(range(9))], 10.0, fastest_speed=1.2)
    assert faster.impossible == 1


def test_warning_names_the_share_and_the_settings_to_change(caplog):
    """Characters (14/s) at 90 ms frames (11/s): the warning gives the shares, both rates and the
    options to change; at 40 ms frames (25/s) nothing is warned."""
    rng = np.random.default_rng(0)
    durations = rng.uniform(2, 6, 200)
    tokens = [list(rng.integers(4, 30, int(d * 14))) for d in durations]
    with caplog.at_level(logging.INFO):
        assert warn_if_infeasible(ctc_feasibility(durations, tokens, 100 / 9))
    warning = [r.message for r in caplog.records if r.levelno == logging.WARNING][0]
    assert "impossible" in warning and "100.0%" in warning and "11.1 frames/s" in warning
    assert "frontend_stride" in warning and "max_tokens_per_second" in warning
    assert not warn_if_infeasible(ctc_feasibility(durations, tokens, 25.0))


def test_finetune_checks_its_training_data_against_the_model(speech_shards, tmp_path, caplog):
    """The finetune recipe's check on real shards: characters at the demo's 90 ms frames warn,
    the same transcripts as 60 BPE pieces at 40 ms frames do not."""
    from hyperpyyaml import load_hyperpyyaml
    texts = train_tokenizer.read_texts([str(speech_shards["train"])])
    chars = train_tokenizer.train_tokenizer(texts, str(tmp_path), len(set("".join(texts))) + 4, "char")
    bpe = train_tokenizer.train_tokenizer(texts, str(tmp_path), 60, "bpe")
    graph = "recipes/hparams/model/conformer.yaml"
    for tokenizer, stride, n_mels, warns in ((chars, 3, 72, True), (bpe, 2, 80, False)):
        model = load_hyperpyyaml(open(graph), {"vocab_size": 60, "d_model": 32, "num_encoder_layers": 1,
                                               "num_decoder_layers": 1, "d_ffn": 32, "n_mels": n_mels,
                                               "frontend_stride": stride})["model"]
        loader = make_speech_loader(f"{speech_shards['train']}/metadata_pool.parquet", tokenizer,
                                    SpeechLoaderConfig(60.0))
        caplog.clear()
        with caplog.at_level(logging.INFO):
            report = training_data_report(loader, loader.dataset.tokenizer, model)["_feasibility"]
        assert report.utterances == 40
        assert any(r.levelno == logging.WARNING for r in caplog.records) == warns, report.summary()
