"""common/curves.py: per-epoch history kept across a resume, and the picture drawn from it."""

from common.curves import EpochHistory, plot_curves, series


def test_history_adds_epochs_replaces_a_redone_one_and_survives_a_restart(tmp_path):
    """A record per epoch in epoch order; an epoch logged twice (redone after a kill) keeps its
    last figures; a new EpochHistory on the same file continues it."""
    path = tmp_path / "history.json"
    history = EpochHistory(path)
    history.add(1, lr=1e-3, steps=10, train={"loss": 3.0}, valid={"loss": 3.5, "WER": 90.0})
    history.add(2, lr=2e-3, steps=20, train={"loss": 2.5}, valid={"loss": 3.0, "WER": 70.0})
    history.add(2, lr=2e-3, steps=20, train={"loss": 2.4}, valid={"loss": 2.9, "WER": 65.0})
    resumed = EpochHistory(path)
    resumed.add(3, lr=1.5e-3, steps=30, train={"loss": 2.0}, valid=None)
    assert [r["epoch"] for r in resumed.records] == [1, 2, 3]
    assert series(resumed.records, "valid", "WER") == ([1, 2], [90.0, 65.0])
    assert series(resumed.records, "train", "loss") == ([1, 2, 3], [3.0, 2.4, 2.0])


def test_curves_are_a_png_of_the_history(tmp_path):
    """plot_curves writes a PNG (and no temporary file) for a history with losses, rates and lr."""
    history = EpochHistory(tmp_path / "history.json")
    for epoch in range(1, 4):
        history.add(epoch, lr=1e-3 * epoch, steps=epoch * 10,
                    train={"loss": 4.0 / epoch, "ctc_loss": 5.0 / epoch, "accuracy": 0.2 * epoch},
                    valid={"loss": 4.5 / epoch, "CER": 60.0 / epoch, "WER": 90.0 / epoch})
    path = tmp_path / "curves.png"
    plot_curves(history.records, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png", "history.json"]
