"""What every recipe does after training: average the best checkpoints, record and print results.

A recipe's test stage::

    used = average_best_checkpoints(checkpointer, model, num=5, min_key="WER",
                                    save_path=f"{output_folder}/averaged.ckpt", normalize=normalize)
    ...decode a split into a ``common.metrics.TranscriptMetrics``...
    record_results(output_folder, "test", metrics.summary(), config=..., checkpoint=...)

``results.json`` maps each split to its figures, so scripts read results without parsing logs;
``results.txt`` holds one line per split; ``format_results_table`` prints them side by side.
"""

import json
import logging
import os

import torch
from speechbrain.utils.checkpoints import average_checkpoints
from speechbrain.utils.distributed import if_main_process

from common.atomic import atomic_write_text

logger = logging.getLogger(__name__)

RESULTS_JSON, RESULTS_TXT = "results.json", "results.txt"


def average_best_checkpoints(checkpointer, model, num, min_key=None, max_key=None, save_path=None,
                             normalize=None):
    """Load into ``model`` the average of the ``num`` best end-of-epoch checkpoints.

    Arguments
    ---------
    checkpointer : speechbrain.utils.checkpoints.Checkpointer
        Holds ``model`` under the recoverable name ``"model"``.
    num : int
        How many of the best checkpoints to average (fewer when fewer exist).
    min_key, max_key : str
        Checkpoint meta key that ranks them (e.g. ``min_key="WER"``, ``max_key="BLEU"``).
    save_path : str, optional
        Where to save the averaged weights (with ``normalize``'s statistics): a standalone model.
    normalize : speechbrain.processing.features.InputNormalization, optional
        Its global statistics are saved beside the weights.

    Returns
    -------
    list of str
        The checkpoint folders averaged.
    """
    checkpoints = checkpointer.find_checkpoints(min_key=min_key, max_key=max_key, max_num_checkpoints=num)
    if not checkpoints:
        raise FileNotFoundError(f"no end-of-epoch checkpoint with {min_key or max_key} in "
                                f"{checkpointer.checkpoints_dir}: train first (do_train: True)")
    averaged = average_checkpoints(checkpoints, "model")  # loads on the CPU
    model.load_state_dict(averaged, strict=True)
    used = [str(c.path) for c in checkpoints]
    logger.info("averaged %d checkpoint(s) by %s: %s", len(used), min_key or max_key, used)
    if save_path is not None and if_main_process():  # every rank loads the average, one writes it
        stats = normalize._statistics_dict() if normalize is not None else None
        torch.save({"model": averaged, "normalize": stats, "averaged": used}, save_path)
    return used


def record_results(output_folder, split, summary, **details):
    """Add ``split``'s figures (``summary`` + ``details`` such as config and checkpoint) to
    ``results.json`` and its one-line summary to ``results.txt``; returns the line."""
    path = os.path.join(output_folder, RESULTS_JSON)
    results = read_results(path) if os.path.exists(path) else {}
    results[split] = {**summary, **details}
    atomic_write_text(path, json.dumps(results, indent=2, sort_keys=True) + "\n")
    lines = [summary_line(name, figures) for name, figures in sorted(results.items())]
    atomic_write_text(os.path.join(output_folder, RESULTS_TXT), "".join(line + "\n" for line in lines))
    return summary_line(split, results[split])


def read_results(path):
    """The ``{split: figures}`` mapping of a ``results.json``."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def summary_line(split, figures):
    """'test: WER 12.50 % | CER 4.10 % | BLEU 30.2 | 100 utterances'."""
    parts = [f"{name.upper()} {figures[name]:.2f} %" for name in ("wer", "cer") if name in figures]
    if "bleu" in figures:
        parts.append(f"BLEU {figures['bleu']:.1f}")
    return f"{split}: " + " | ".join(parts + [f"{figures.get('num_utterances', '?')} utterances"])


def format_results_table(results_paths):
    """A plain-text table of every split of the given ``results.json`` files: experiment, split,
    WER, CER, BLEU, greedy-CTC WER, utterances."""
    header = ("experiment", "split", "WER %", "CER %", "BLEU", "CTC-greedy WER %", "utterances")
    rows = [header]
    for path in results_paths:
        experiment = os.path.basename(os.path.dirname(os.path.abspath(path)))
        for split, figures in sorted(read_results(path).items()):
            greedy = figures.get("ctc_greedy", {})
            rows.append((experiment, split, _cell(figures.get("wer")), _cell(figures.get("cer")),
                         _cell(figures.get("bleu")), _cell(greedy.get("wer")),
                         str(figures.get("num_utterances", ""))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join([lines[0], "-" * len(lines[0])] + lines[1:])


def _cell(value):
    return "-" if value is None else f"{value:.2f}"
