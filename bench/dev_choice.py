"""Decoding settings chosen on dev, then the test splits decoded once with the choice.

A bench never looks at a test split to choose how to decode it: every setting of a small grid (beam,
CTC weight, LM weight) decodes dev, the lowest dev WER wins (the earlier setting of the grid on a tie),
and only that setting decodes each test split. ``decode(setting, split)`` is the leg's own decoder:
it decodes ``split`` with ``setting`` and returns the path of the ``hyp_*.jsonl`` it wrote
(``{"key", "hyp", "ref"}`` lines, as ``common.metrics.TranscriptMetrics`` writes them).

    grid = decoding_grid(beams=[8, 16], ctc_weights=[0.4, 0.6])
    choice = choose_on_dev(grid, decode, dev="dev", tests=["test_seen", "test_unseen"])
    choice["chosen"], choice["dev"]      # the setting and every setting's dev WER
"""

import itertools
import logging

from bench import stats

logger = logging.getLogger(__name__)


def decoding_grid(beams, ctc_weights, lm_weights=(0.0,)):
    """Every combination as ``{"beam_size", "ctc_weight", "lm_weight"}`` dicts, beams varying slowest."""
    for weight in ctc_weights:
        if not 0.0 <= weight < 1.0:
            raise ValueError(f"CTC weight {weight} must lie in [0, 1): SpeechBrain's searcher drops the "
                             "attention decoder at 1")
    return [{"beam_size": int(beam), "ctc_weight": float(ctc), "lm_weight": float(lm)}
            for beam, ctc, lm in itertools.product(beams, ctc_weights, lm_weights)]


def setting_name(setting):
    """``beam8_ctc0.4`` (``_lm0.5`` added when the LM is fused): a file-name-safe label."""
    name = f"beam{setting['beam_size']}_ctc{setting['ctc_weight']:g}"
    return name + (f"_lm{setting['lm_weight']:g}" if setting["lm_weight"] > 0 else "")


def choose_on_dev(grid, decode, dev, tests):
    """Decode ``dev`` with every setting of ``grid``, choose the lowest dev WER, then decode each of
    ``tests`` once with it. Returns ``{"dev": [{"setting", "wer", "wer_ci"}...], "chosen": setting,
    "tests": {split: hyp path}}``."""
    rows = []
    for setting in grid:
        figure = stats.error_rate(stats.read_scored(decode(setting, dev)))
        rows.append({"setting": setting, "wer": round(figure.value, 2), "wer_ci": figure.as_list()})
        logger.info("dev %s: WER %s", setting_name(setting), figure.format())
    chosen = min(rows, key=lambda row: row["wer"])["setting"]  # min keeps the first of equal WERs
    logger.info("chosen on dev: %s", setting_name(chosen))
    return {"dev": rows, "chosen": chosen, "tests": {split: decode(chosen, split) for split in tests}}
