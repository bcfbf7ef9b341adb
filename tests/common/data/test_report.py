"""common/data/report.py and local/data_report.py: the report is the loader's own plan."""

import os

from common.data import SpeechLoaderConfig, Tokenizer, make_speech_loader
from common.data.report import speech_loader_report, write_report
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
