"""Can CTC align these transcripts with this encoder? A check made from metadata before training.

CTC emits at most one token per encoder frame and needs a blank between two equal tokens, so a
transcript of ``n`` tokens with ``r`` adjacent repeats needs at least ``n + r`` frames. SpeechBrain's
CTC loss silently zeroes the utterances that cannot meet this (``zero_infinity``): they then teach
the encoder nothing. Tight ones (most frames spent on tokens) learn slowly.

>>> report = ctc_feasibility([2.0, 1.0], [[5, 6, 6, 7], list(range(30))], frames_per_second=25.0)
>>> report.impossible, report.utterances
(1, 2)
"""

import dataclasses
import logging

import numpy as np

logger = logging.getLogger(__name__)

TIGHT_SHARE = 0.8  # an utterance whose tokens need more than this share of its frames is tight


def ctc_frames_needed(tokens):
    """Fewest encoder frames CTC needs for ``tokens``: one per token plus a blank between repeats."""
    tokens = np.asarray(tokens)
    return len(tokens) + int(np.sum(tokens[1:] == tokens[:-1])) if len(tokens) else 0


@dataclasses.dataclass
class FeasibilityReport:
    """CTC alignment margins of a set of utterances (see ``ctc_feasibility``)."""

    utterances: int
    impossible: int  # need more frames than the encoder gives: zero loss, nothing learned
    tight: int  # need more than TIGHT_SHARE of the frames
    frames_per_second: float
    tokens_per_second_median: float
    tokens_per_second_p95: float
    need_share_p95: float  # 95th percentile of frames needed / frames available

    def summary(self):
        """One line of the figures."""
        return (f"{self.utterances} utterances, encoder {self.frames_per_second:.1f} frames/s, tokens/s "
                f"median {self.tokens_per_second_median:.1f} (p95 {self.tokens_per_second_p95:.1f}); "
                f"CTC needs {self.need_share_p95:.0%} of the frames at p95; "
                f"{self.impossible} impossible ({self.impossible / max(self.utterances, 1):.1%}), "
                f"{self.tight} tight ({self.tight / max(self.utterances, 1):.1%})")


def ctc_feasibility(durations, token_lists, frames_per_second, fastest_speed=1.0):
    """Alignment margins of utterances of ``durations`` (s) with targets ``token_lists``, for an
    encoder producing ``frames_per_second``; ``fastest_speed`` (speed perturbation's largest factor)
    shortens the audio."""
    durations = np.asarray(durations, dtype=np.float64)
    needed = np.array([ctc_frames_needed(tokens) for tokens in token_lists], dtype=np.float64)
    available = np.floor(durations / fastest_speed * frames_per_second)
    share = needed / np.maximum(available, 1.0)
    rates = np.array([len(t) for t in token_lists]) / np.maximum(durations, 1e-6)
    return FeasibilityReport(
        utterances=len(durations), impossible=int(np.sum(needed > available)),
        tight=int(np.sum((share > TIGHT_SHARE) & (needed <= available))), frames_per_second=frames_per_second,
        tokens_per_second_median=float(np.median(rates)) if len(rates) else 0.0,
        tokens_per_second_p95=float(np.percentile(rates, 95)) if len(rates) else 0.0,
        need_share_p95=float(np.percentile(share, 95)) if len(share) else 0.0)


def warn_if_infeasible(report, where="training data", max_impossible_share=0.01, max_tight_share=0.1):
    """Log the report; warn, with what to change, when many utterances are impossible or tight.
    Returns True when it warned."""
    logger.info("CTC feasibility of the %s: %s", where, report.summary())
    impossible = report.impossible / max(report.utterances, 1)
    tight = report.tight / max(report.utterances, 1)
    if impossible <= max_impossible_share and tight <= max_tight_share:
        return False
    logger.warning(
        "CTC alignment is %s for the %s: %.1f%% of the utterances need more encoder frames than they "
        "have (their CTC loss is zeroed: they teach nothing) and %.1f%% need more than %d%% of them. "
        "The encoder gives %.1f frames/s for %.1f tokens/s (p95). Give CTC more frames per token: a "
        "smaller frontend_stride (more frames), a larger tokenizer (--vocab_size, fewer tokens than "
        "characters), or drop such utterances with filters: max_tokens_per_second: %.1f",
        "impossible" if impossible > max_impossible_share else "tight", where, 100 * impossible,
        100 * tight, round(100 * TIGHT_SHARE), report.frames_per_second, report.tokens_per_second_p95,
        TIGHT_SHARE * report.frames_per_second)
    return True
