"""Mix several batch streams (corpora, or modalities) by weight or by temperature.

Each stream keeps its own epochs and resume state; a mixed epoch takes ``round(p_i * N)`` batches from
stream ``i`` (``N`` = the streams' batches per epoch summed), in an order shuffled from (seed, epoch).
A stream asked for more batches than one of its epochs holds continues into its next epoch; one asked
for fewer keeps its place for the next mixed epoch. Proportions are therefore exact to one batch per
epoch, identical on every rank (same seed), and logged at each epoch end.

Temperature (YiTrans / SpeechUT ``speech_sampling_alpha``): ``p_i ∝ size_i ** alpha``; alpha = 1
keeps natural proportions, alpha < 1 upsamples small corpora.
"""

import logging

import numpy as np

from common.data.stream import BatchStream

logger = logging.getLogger(__name__)


def mixing_probabilities(sizes, weights=None, alpha=None):
    """Target share of each stream: explicit ``weights`` or ``sizes ** alpha`` (normalised).

    >>> mixing_probabilities([100, 300], alpha=0.0).tolist()
    [0.5, 0.5]
    """
    if (weights is None) == (alpha is None):
        raise ValueError(f"give exactly one of weights={weights} or alpha={alpha}")
    raw = np.asarray(weights if weights is not None else np.asarray(sizes, dtype=np.float64) ** alpha,
                     dtype=np.float64)
    if len(raw) != len(sizes) or (raw < 0).any() or raw.sum() == 0:
        raise ValueError(f"mixing weights {raw.tolist()} must be one non-negative value per stream, not all 0")
    return raw / raw.sum()


def batch_counts(probabilities, total):
    """Integer batch counts per stream summing to ``total``, closest to ``probabilities * total``."""
    exact = probabilities * total
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(-(exact - counts), kind="stable")[: total - counts.sum()]] += 1
    return counts


class MixedLoader(BatchStream):
    """Batches drawn from named streams in fixed proportions; each batch comes from one stream.

    Arguments
    ---------
    streams : dict of name -> BatchStream
        E.g. ``{"librispeech": speech_a, "commonvoice": speech_b}`` or
        ``{"speech": mixed_speech, "text": mono_text, "paired": paired_text}`` (modalities).
    weights : dict of name -> float, optional
        Target shares (normalised). Give this or ``alpha``.
    alpha : float, optional
        Temperature: share ∝ (batches per epoch of the stream) ** alpha.
    seed : int
        Fixes the order of streams within each epoch (same on all ranks).
    tag : str
        The batch attribute that names its stream (``stream``; ``corpus`` for a mix of corpora nested
        inside a mix of modalities, whose own tag would overwrite it).
    """

    def __init__(self, streams, weights=None, alpha=None, seed=0, tag="stream"):
        super().__init__()
        self.tag = tag
        self.names = list(streams)
        self.streams = streams
        sizes = [streams[name].batches_in_epoch(streams[name].epoch) for name in self.names]
        self.probabilities = mixing_probabilities(
            sizes, None if weights is None else [weights[name] for name in self.names], alpha)
        self.total = int(sum(sizes))
        self.seed = seed
        self._live = {}

    def batches_in_epoch(self, epoch):
        return self.total

    def targets(self):
        """``{stream name: target share}``."""
        return dict(zip(self.names, self.probabilities.tolist()))

    def order(self, epoch):
        """Stream index of each batch of ``epoch``."""
        counts = batch_counts(self.probabilities, self.total)
        order = np.repeat(np.arange(len(self.names)), counts)
        return np.random.default_rng([self.seed, epoch, 3]).permutation(order)

    def next_batch(self, name):
        """Next batch of a stream, moving it into its next epoch when one ends."""
        while True:
            if name not in self._live:
                self._live[name] = iter(self.streams[name])
            batch = next(self._live[name], None)
            if batch is not None:
                return batch
            del self._live[name]

    def epoch_batches(self, epoch, start):
        for index in self.order(epoch)[start:]:
            batch = self.next_batch(self.names[index])
            setattr(batch, self.tag, self.names[index])
            yield batch

    def end_epoch(self, epoch):
        achieved = np.bincount(self.order(epoch), minlength=len(self.names)) / self.total
        logger.info("epoch %d mix of %ss: %s", epoch, self.tag, ", ".join(
            f"{n} {a:.3f} (target {p:.3f})" for n, a, p in zip(self.names, achieved, self.probabilities)))

    def state_dict(self):
        """Own (epoch, position) and every stream's state."""
        return {**super().state_dict(), "streams": {n: s.state_dict() for n, s in self.streams.items()}}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        for name, stream_state in state["streams"].items():
            self.streams[name].load_state_dict(stream_state)
        self._live = {}
