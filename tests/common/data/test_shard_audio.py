"""common/data/shard_audio.py: speed perturbation length and per-epoch speed draws."""

import numpy as np
import torch

from common.data.shard_audio import choose_speeds, speed_perturb


def test_speed_changes_duration_by_its_inverse():
    """1 s at speed 1.1 lasts 1/1.1 s; speed 1.0 returns the same tensor."""
    wave = torch.randn(16000)
    assert abs(len(speed_perturb(wave, 1.1)) - 16000 / 1.1) <= 1
    assert speed_perturb(wave, 1.0) is wave


def test_speeds_are_drawn_from_the_choices_or_all_one():
    """Draws come from the given factors; without factors every speed is 1.0."""
    rng = np.random.default_rng(0)
    assert set(choose_speeds(100, [0.9, 1.1], rng)) == {0.9, 1.1}
    assert (choose_speeds(5, None, rng) == 1.0).all()
