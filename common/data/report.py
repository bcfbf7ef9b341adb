"""What an epoch will look like, before any training: a data report from a speech loader's own plan.

    report = speech_loader_report(loader, tokenizer, frames_per_second=25.0)
    write_report(report, "exp/x/data_report")   # report.md, durations.png, tokens_per_second.png

Everything comes from the loader a run would train with (its filters, its tokenizer, its epoch plan for
this rank), so the figures are the run's: utterances and hours used and filtered out, duration and
tokens-per-second distributions, the CTC alignment check against the encoder's frame rate, batches
per epoch, padding, the largest batch and (with a model, ``add_memory_estimate``) the memory a training
step on it takes. ``recipes/finetune/train.py --dry_run=True`` writes it and stops;
``local/data_report.py`` writes it for shard folders without a config.
"""

import logging
import os

import numpy as np

from common.atomic import atomic_write_text
from common.feasibility import ctc_feasibility

logger = logging.getLogger(__name__)

REPORT_FILE = "report.md"


def speech_loader_report(loader, tokenizer, frames_per_second, epoch=1):
    """Figures of the utterances ``loader`` uses and of its plan for ``epoch`` (a dict). Batches, padding
    and the largest batch count each utterance at its speed of that epoch, as the plan does; the duration
    quantiles are the recordings'. The arrays under ``_durations`` / ``_tokens_per_second`` feed the
    histograms, ``_feasibility`` is the ``common.feasibility`` report for ``warn_if_infeasible``."""
    metadata = loader.metadata
    durations, texts = loader.used_utterances()
    tokens = tokenizer.encode(list(texts))
    rates = np.array([len(t) for t in tokens]) / np.maximum(durations, 1e-6)
    slots, _ = loader.plan(epoch)
    planned = loader.planned_durations(epoch)  # after speed perturbation, as the plan batched them
    batches = [rows for slot in slots for rows in slot.batches]
    padded = [len(rows) * planned[rows].max() for rows in batches]
    audio = sum(planned[rows].sum() for rows in batches)
    feasibility = ctc_feasibility(durations, tokens, frames_per_second,
                                  fastest_speed=loader.config.fastest_speed)
    return {
        "utterances": int(len(metadata)), "used": int(len(durations)),
        "filtered_out": int(len(metadata) - len(durations)),
        "hours": float(durations.sum() / 3600),
        "duration_s": _quantiles(durations), "tokens_per_second": _quantiles(rates),
        "frames_per_second": float(frames_per_second), "ctc": feasibility.summary(),
        "rank": loader.rank, "world_size": loader.world_size, "budget_s": loader.config.max_batch_seconds,
        "batches_per_epoch": len(batches), "mean_batch_size": float(np.mean([len(b) for b in batches])),
        "padding_percent": float(100 * (1 - audio / max(sum(padded), 1e-9))),
        **_largest_batch(batches, padded, planned),
        "most_utterances_per_batch": int(max(len(b) for b in batches)),
        "longest_target_tokens": int(max((len(t) for t in tokens), default=0)),
        "_durations": durations, "_tokens_per_second": rates, "_feasibility": feasibility,
    }


def _largest_batch(batches, padded, durations):
    """Padded seconds, utterances and padded length (s) of the batch with the most padded seconds."""
    largest = int(np.argmax(padded))
    return {"largest_batch_padded_s": float(padded[largest]), "largest_batch_utterances": len(batches[largest]),
            "largest_batch_longest_s": float(durations[batches[largest]].max())}


CARDS_GB = (80, 24)  # the GPU sizes the report checks the largest batch against (A100/H100 80 GB, a 24 GB card)


def add_memory_estimate(report, model):
    """Add ``memory`` (``common.memory.training_memory`` of the largest batch) to ``report``, and
    ``cards``: whether it fits each of ``CARDS_GB`` (``card_fit``)."""
    from common.memory import training_memory

    report["memory"] = training_memory(model, report["largest_batch_padded_s"], report["largest_batch_utterances"],
                                       report["longest_target_tokens"])
    report["cards"] = [card_fit(report["memory"], report["largest_batch_padded_s"], gb) for gb in CARDS_GB]
    return report


def card_fit(memory, padded_s, card_gb):
    """Whether a training step of ``memory`` (``training_memory``'s GiB figures for a batch of ``padded_s``
    padded seconds) fits a card of ``card_gb`` GB (10^9 bytes), and the largest batch (padded seconds: a
    ``max_batch_seconds``) that would: activations grow with the padded seconds, the weights, gradients
    and Adam states do not. ``largest_budget_s`` is 0 when the states alone fill the card.
    Returns ``{"card_gb", "fits", "largest_budget_s"}``."""
    card_gib = card_gb * 1e9 / 2**30
    room = card_gib - memory["states_gib"]
    largest = padded_s * room / memory["activations_gib"] if memory["activations_gib"] > 0 else float("inf")
    return {"card_gb": card_gb, "fits": memory["total_gib"] <= card_gib, "largest_budget_s": max(0.0, largest)}


def _quantiles(values):
    values = np.asarray(values, dtype=np.float64)
    return {name: float(np.percentile(values, q)) for name, q in
            (("min", 0), ("median", 50), ("p95", 95), ("max", 100))} if len(values) else {}


def report_markdown(report, title="Data report"):
    """The report as Markdown: a table of the figures and the two histograms."""
    q = lambda key: "{min:.2f} / {median:.2f} / {p95:.2f} / {max:.2f}".format(**report[key])  # noqa: E731
    rows = [
        ("utterances used / in the parquet", f"{report['used']} / {report['utterances']} "
                                             f"({report['filtered_out']} filtered out)"),
        ("hours used", f"{report['hours']:.2f}"),
        ("duration s: min / median / p95 / max", q("duration_s")),
        ("tokens per second: min / median / p95 / max", q("tokens_per_second")),
        ("encoder frames per second", f"{report['frames_per_second']:.1f}"),
        ("CTC alignment", report["ctc"]),
        (f"batches per epoch (rank {report['rank']} of {report['world_size']})", str(report["batches_per_epoch"])),
        ("budget (padded seconds) / mean utterances per batch", f"{report['budget_s']:g} / "
                                                                 f"{report['mean_batch_size']:.1f}"),
        ("padding", f"{report['padding_percent']:.1f} %"),
        ("largest batch", f"{report['largest_batch_padded_s']:.1f} padded s: {report['largest_batch_utterances']} "
                          f"utterances of up to {report['largest_batch_longest_s']:.1f} s"),
        ("most utterances in a batch", str(report["most_utterances_per_batch"])),
    ]
    if "memory" in report:
        memory = report["memory"]
        rows.append(("training memory of the largest batch (estimate, fp32)",
                     f"{memory['total_gib']:.2f} GiB: activations {memory['activations_gib']:.2f} + weights, "
                     f"gradients and Adam {memory['states_gib']:.2f}"))
    for card in report.get("cards", []):
        verdict = "fits" if card["fits"] else "does not fit"
        rows.append((f"a {card['card_gb']} GB card", f"{verdict}; max_batch_seconds up to about "
                                                     f"{card['largest_budget_s']:.0f} would"))
    lines = [f"# {title}", "", "| figure | value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += ["", "![durations](durations.png) ![tokens per second](tokens_per_second.png)", ""]
    return "\n".join(lines)


def write_report(report, out_dir, title="Data report"):
    """``report.md`` and the histograms in ``out_dir``; returns the path of ``report.md``."""
    os.makedirs(out_dir, exist_ok=True)
    draw_histogram(report["_durations"], "utterance duration (s)", os.path.join(out_dir, "durations.png"))
    draw_histogram(report["_tokens_per_second"], "tokens per second", os.path.join(out_dir, "tokens_per_second.png"),
                   limit=(report["frames_per_second"], "encoder frames per second: CTC's ceiling"))
    path = os.path.join(out_dir, REPORT_FILE)
    atomic_write_text(path, report_markdown(report, title))
    logger.info("data report: %s", path)
    return path


def draw_histogram(values, label, path, limit=None):
    """A histogram PNG of ``values``; ``limit`` = (x, label) draws a vertical line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.hist(values, bins=50, color="#4878a8")
    if limit is not None:
        axis.axvline(limit[0], color="#c03030", linestyle="--", label=limit[1])
        axis.legend()
    axis.set_xlabel(label)
    axis.set_ylabel("utterances")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
