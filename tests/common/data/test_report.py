"""common/data/report.py and local/data_report.py: the report is the loader's own plan."""

import os

import pytest

from common.data import SpeechLoaderConfig, Tokenizer, make_speech_loader
from common.data.report import card_fit, report_markdown, speech_loader_report, write_report
from local import data_report


def test_the_report_counts_the_loaders_plan_and_draws_its_histograms(speech_shards, tokenizer_file, tmp_path):
    """Utterances used, batches per epoch and the largest batch are those of the loader's epoch plan;
    a max_duration filter shows as filtered-out utterances; report.md and both PNGs are written."""
    parquet = os.path.join(speech_shards["train"], "metadata_pool.parquet")
    tokenizer = Tokenizer(tokenizer_file)
    loader = make_speech_loader(parquet, tokenizer, SpeechLoaderConfig(max_batch_seconds=20.0,
                                                                       filters={"max_duration": 3.0}))
    report = speech_loader_report(loader, tokenizer, frames_per_second=25.0)
    used = len(loader.used_keys())
    assert report["used"] == used and report["filtered_out"] == report["utterances"] - used > 0
    assert report["batches_per_epoch"] == loader.batches_in_epoch(1)
    assert report["largest_batch_padded_s"] <= 20.0 and 0.0 <= report["padding_percent"] < 100.0
    assert report["duration_s"]["max"] <= 3.0
    path = write_report(report, str(tmp_path / "report"))
    assert "| batches per epoch (rank 0 of 1) |" in open(path).read()
    for name in ("durations.png", "tokens_per_second.png"):
        assert (tmp_path / "report" / name).stat().st_size > 1000, name


def test_the_command_line_reports_shard_folders(speech_shards, tokenizer_file, tmp_path, capsys):
    assert data_report.main([str(speech_shards["train"]), "--tokenizer", str(tokenizer_file),
                             "--out", str(tmp_path / "r"), "--budget", "20"]) == 0
    assert "CTC alignment" in capsys.readouterr().out and (tmp_path / "r" / "report.md").is_file()


def test_the_largest_batch_is_the_loaders_own_under_speed_perturbation(speech_shards, tokenizer_file):
    """With speeds 0.9 / 1.0 / 1.1 the plan batches each utterance at its epoch's speed: the report's largest
    batch, padding and audio are those perturbed seconds (the loader's plan), and so stay within the budget."""
    parquet = os.path.join(speech_shards["train"], "metadata_pool.parquet")
    tokenizer = Tokenizer(tokenizer_file)
    config = SpeechLoaderConfig(max_batch_seconds=6.0, speed_perturb=[0.9, 1.0, 1.1], filters={"max_duration": 5.0})
    loader = make_speech_loader(parquet, tokenizer, config)
    report = speech_loader_report(loader, tokenizer, frames_per_second=25.0)
    slots, speeds = loader.plan(1)
    assert len(set(speeds[loader.used_rows()].tolist())) == 3
    seconds = loader.metadata.durations / speeds
    padded = [len(rows) * seconds[rows].max() for slot in slots for rows in slot.batches]
    assert report["largest_batch_padded_s"] == max(padded) <= 6.0
    assert report["largest_batch_longest_s"] == max(seconds[rows].max() for slot in slots for rows in slot.batches
                                                     if len(rows) * seconds[rows].max() == max(padded))


def test_a_card_fits_the_largest_batch_when_its_memory_is_within_the_cards_bytes():
    """card_fit: 10 GiB of activations for a 100 s batch plus 4 GiB of states fit an 80 GB card (74.5 GiB)
    and not a 12 GB one (11.2 GiB); the largest batch a card takes puts its activations exactly into
    the room the states leave, and a card the states alone fill takes none."""
    memory = {"activations_gib": 10.0, "states_gib": 4.0, "total_gib": 14.0}
    big, small, full = (card_fit(memory, 100.0, gb) for gb in (80, 12, 4))
    assert big["fits"] and not small["fits"]
    for card in (big, small):
        room = card["card_gb"] * 1e9 / 2**30 - memory["states_gib"]
        assert card["largest_budget_s"] / 100.0 * memory["activations_gib"] == pytest.approx(room)
    assert small["largest_budget_s"] < 100.0 < big["largest_budget_s"]
    assert full == {"card_gb": 4, "fits": False, "largest_budget_s": 0.0}
    assert "| a 80 GB card | fits;" in report_markdown_of(memory, [big])


def report_markdown_of(memory, cards):
    """report_markdown of a report holding only ``memory`` and ``cards`` beside placeholder figures."""
    quantiles = {"min": 0.0, "median": 0.0, "p95": 0.0, "max": 0.0}
    report = {"used": 1, "utterances": 1, "filtered_out": 0, "hours": 0.0, "duration_s": quantiles,
              "tokens_per_second": quantiles, "frames_per_second": 25.0, "ctc": "ok", "rank": 0, "world_size": 1,
              "batches_per_epoch": 1, "budget_s": 100.0, "mean_batch_size": 1.0, "padding_percent": 0.0,
              "largest_batch_padded_s": 100.0, "largest_batch_utterances": 1, "largest_batch_longest_s": 1.0,
              "most_utterances_per_batch": 1, "memory": memory, "cards": cards}
    return report_markdown(report)
