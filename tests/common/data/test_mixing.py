"""common/data/mixing.py: proportions by weight and temperature, exact resume of a mix."""

import numpy as np
import pytest

from common.data.mixing import MixedLoader, batch_counts, mixing_probabilities
from common.data.stream import BatchStream


class CountingStream(BatchStream):
    """A stream of ``size`` numbered batches per epoch (strings ``name:epoch:index``)."""

    def __init__(self, name, size):
        super().__init__()
        self.name, self.size = name, size

    def batches_in_epoch(self, epoch):
        return self.size

    def epoch_batches(self, epoch, start):
        for index in range(start, self.size):
            yield Labelled(f"{self.name}:{epoch}:{index}")


class Labelled(str):
    """A str that accepts attributes (the mixer tags batches with ``stream``)."""


def streams():
    return {"big": CountingStream("big", 900), "mid": CountingStream("mid", 90), "small": CountingStream("small", 10)}


@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.0])
def test_achieved_proportions_match_temperature_targets(alpha):
    """Over an epoch each stream's share of batches is within 2 % of size**alpha / sum."""
    mixed = MixedLoader(streams(), alpha=alpha, seed=1)
    names = [batch.stream for batch in mixed]
    target = mixing_probabilities([900, 90, 10], alpha=alpha)
    achieved = np.array([names.count(n) for n in ("big", "mid", "small")]) / len(names)
    assert np.abs(achieved - target).max() <= 0.02


def test_weights_upsample_a_small_stream_into_its_next_epochs():
    """A 10-batch stream given half the mix is cycled through many of its epochs, batches in order."""
    mixed = MixedLoader({"big": CountingStream("big", 90), "small": CountingStream("small", 10)},
                        weights={"big": 1, "small": 1})
    small = [b for b in mixed if b.stream == "small"]
    assert len(small) == 50 and small[:11] == [f"small:0:{i}" for i in range(10)] + ["small:1:0"]


def test_mixed_resume_equals_uninterrupted_run():
    """Stop a mix at batch 137 of epoch 1, restore its state into fresh streams: the rest is identical."""
    reference = MixedLoader(streams(), alpha=0.5, seed=2)
    list(reference)
    expected = list(reference)
    interrupted = MixedLoader(streams(), alpha=0.5, seed=2)
    list(interrupted)
    for k, _ in enumerate(interrupted, start=1):
        if k == 137:
            break
    restored = MixedLoader(streams(), alpha=0.5, seed=2)
    restored.load_state_dict(interrupted.state_dict())
    assert list(restored) == expected[137:]


def test_batch_counts_sum_to_total_and_round_to_nearest():
    """Counts add up exactly and each is within one batch of its exact share."""
    counts = batch_counts(np.array([0.333, 0.333, 0.334]), 100)
    assert counts.sum() == 100 and (np.abs(counts - np.array([33.3, 33.3, 33.4])) < 1).all()
