"""Fixtures of the recipe tests (the espeak-ng corpus, its shards and tokenizer come from tests/conftest.py)."""

import pytest
import torch

from common.models import SpeechEncoderDecoder
from recipes.finetune import train
from tests.recipes.finetune_args import CHUNK_WARMUP, train_argv


@pytest.fixture(scope="session")
def trained(speech_shards, tokenizer_file, tmp_path_factory):
    """A tiny finetune experiment after its test stage (hyperparams.yaml and averaged.ckpt)."""
    exp = tmp_path_factory.mktemp("trained")
    train.main(train_argv(speech_shards, tokenizer_file, exp, "--number_of_epochs=6", "--lr_peak=0.005"))
    return exp


CHUNKED = ["--attention_type=RelPosMHAXL", "--chunk_training=True", "--chunk_prob=1.0", "--chunk_frames_min=2",
           "--chunk_frames_max=4", "--left_chunks_prob=0.5", "--left_chunks_min=1", "--left_chunks_max=2"]


@pytest.fixture(scope="session")
def chunk_trained(speech_shards, tokenizer_file, tmp_path_factory):
    """``(experiment, [(training?, chunk config) per forward pass])`` of a tiny model trained 3 epochs with
    every batch after the first ``CHUNK_WARMUP`` updates chunked; its CTC blank made 4 nats less likely
    afterwards, so that greedy CTC says something (equal empty hypotheses would prove nothing)."""
    exp = tmp_path_factory.mktemp("chunk_trained") / "exp"
    calls, forward = [], SpeechEncoderDecoder.forward

    def spy(self, *args, **kwargs):
        if "epoch" in kwargs:  # the Brain's passes (the data report's memory probe gives none)
            calls.append((self.training, kwargs.get("dynchunktrain_config")))
        return forward(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SpeechEncoderDecoder, "forward", spy)
        train.main(train_argv(speech_shards, tokenizer_file, exp, "--number_of_epochs=3", "--lr_peak=0.005",
                              *CHUNKED, f"--chunk_warmup_steps={CHUNK_WARMUP}"))
    state = torch.load(exp / "averaged.ckpt", map_location="cpu")
    state["model"]["ctc_lin.w.bias"][0] -= 4.0
    torch.save(state, exp / "averaged.ckpt")
    return exp, calls
