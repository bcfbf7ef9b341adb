"""Learning curves: every epoch's figures in ``history.json`` and drawn in ``curves.png``.

A recipe's Brain appends one record per epoch and redraws the picture, so a run can be watched while
it trains and read after it ends::

    history = EpochHistory(os.path.join(output_folder, "history.json"))
    history.add(epoch=3, lr=1e-3, steps=372, train={"loss": 2.1, "ctc_loss": 2.5},
                valid={"loss": 2.3, "CER": 41.0, "WER": 80.2})
    plot_curves(history.records, os.path.join(output_folder, "curves.png"))

Panels: each loss term (train solid, valid dashed), the error rates (and BLEU) of validation,
accuracies, and the learning rate at each epoch's end.
"""

import json
import os

from common.atomic import atomic_write_text

ERROR_RATES = ("WER", "CER", "BLEU")


class EpochHistory:
    """Per-epoch figures kept in a JSON file: a resumed run adds to it, a redone epoch replaces its
    record (a run killed mid-epoch logs that epoch again when it finishes it)."""

    def __init__(self, path):
        self.path = path
        self.records = []
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                self.records = json.load(f)

    def add(self, epoch, **figures):
        """Record ``epoch``'s figures (``lr``, ``steps``, ``train`` and ``valid`` dicts) and save."""
        self.records = [r for r in self.records if r["epoch"] != epoch] + [{"epoch": epoch, **figures}]
        self.records.sort(key=lambda record: record["epoch"])
        atomic_write_text(self.path, json.dumps(self.records, indent=1) + "\n")


def series(records, stage, name):
    """(epochs, values) of one figure of one stage, skipping epochs without it."""
    points = [(r["epoch"], r[stage][name]) for r in records if name in (r.get(stage) or {})]
    return [p[0] for p in points], [p[1] for p in points]


def figure_names(records, predicate):
    """Figure names of any stage that satisfy ``predicate``, in first-seen order."""
    names = []
    for record in records:
        for stage in ("train", "valid"):
            for name in record.get(stage) or {}:
                if predicate(name) and name not in names:
                    names.append(name)
    return names


def plot_curves(records, path, title=None):
    """Draw the four panels of ``records`` into the PNG ``path`` (written atomically)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(12, 8))
    panels = [
        (axes[0, 0], "loss (nats per token or frame)", figure_names(records, lambda n: n.endswith("loss"))),
        (axes[0, 1], "validation error rate %", figure_names(records, lambda n: n in ERROR_RATES)),
        (axes[1, 0], "accuracy", figure_names(records, lambda n: "accuracy" in n)),
    ]
    for axis, label, names in panels:
        for index, name in enumerate(names):
            color = f"C{index % 10}"
            for stage, style in (("train", "-"), ("valid", "--")):
                epochs, values = series(records, stage, name)
                if epochs:
                    axis.plot(epochs, values, style, color=color, marker=".", label=f"{stage} {name}")
        _finish(axis, label)
    epochs = [r["epoch"] for r in records if "lr" in r]
    axes[1, 1].plot(epochs, [r["lr"] for r in records if "lr" in r], marker=".", color="C3")
    _finish(axes[1, 1], "learning rate at the epoch's end")
    figure.suptitle(title or os.path.basename(os.path.dirname(os.path.abspath(path))))
    figure.tight_layout()
    temporary = f"{path}.tmp.png"
    figure.savefig(temporary, dpi=80)
    plt.close(figure)
    os.replace(temporary, path)


def _finish(axis, label):
    axis.set_xlabel("epoch")
    axis.set_ylabel(label)
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=7)
