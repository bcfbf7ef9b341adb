"""bench/scale.py at small sizes: each point runs in its own process and ends with one JSON line."""

import json
import os
import subprocess
import sys

from bench import scale

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def point(*options):
    """The JSON line a ``bench/scale.py OPTIONS --json`` run ends with."""
    result = subprocess.run([sys.executable, "bench/scale.py", *options, "--json"], cwd=REPO, capture_output=True,
                            text=True, env=dict(os.environ, PYTHONPATH=REPO), check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_planning_point_reports_its_seconds_and_peak_memory():
    """10^4 utterances for 8 ranks: the plan's batches per rank, its seconds and the process's peak RSS."""
    figures = point("--utterances", "10000", "--ranks", "8")
    assert figures["utterances"] == 10_000 and figures["ranks"] == 8 and figures["shards"] == 100
    assert figures["batches_per_rank"] > 0 and figures["seconds"] >= 0
    assert figures["peak_rss_mb"] >= figures["baseline_rss_mb"] > 0


def test_a_text_point_streams_every_sentence_once_as_the_in_memory_loader_does():
    """3000 synthetic sentences in 3 shards through the streamed loader (2 workers) and the in-memory
    baseline: both yield every sentence and the same tokens, each with its seconds and peak RSS; so does a
    start after the first (--counted: the token ids kept beside the shards)."""
    streamed = point("--text-sentences", "3000", "--shard-sentences", "1000")
    in_memory = point("--text-sentences", "3000", "--shard-sentences", "1000", "--loader", "memory")
    assert streamed["sentences"] == in_memory["sentences"] == 3000
    assert streamed["tokens"] == in_memory["tokens"] > 0
    assert streamed["worker_peak_rss_mb"] > 0 and streamed["peak_rss_mb"] > 0 and streamed["seconds"] > 0
    counted = point("--text-sentences", "3000", "--shard-sentences", "1000", "--counted")  # a later start
    assert counted["counted"] and (counted["sentences"], counted["tokens"]) == (3000, streamed["tokens"])


def test_the_synthetic_shards_are_uneven_and_cover_every_utterance():
    """Every shard holds at least one utterance; shard sizes differ; rows are in shard order."""
    durations, shard_of_row = scale.synthetic_speech_metadata(5000, 50)
    sizes = [int((shard_of_row == s).sum()) for s in range(50)]
    assert len(durations) == len(shard_of_row) == 5000 and min(sizes) >= 1 and len(set(sizes)) > 5
    assert (durations >= 1.0).all() and (durations <= 30.0).all() and (shard_of_row[1:] >= shard_of_row[:-1]).all()


def test_the_curves_are_drawn_from_the_points(tmp_path):
    """Two PNGs from a planning and a text series."""
    planning = [{"utterances": n, "ranks": r, "seconds": 0.1 * n / 1e4, "peak_rss_mb": 600 + n / 1e4}
                for r in (1, 64) for n in (10_000, 100_000)]
    text = [{"sentences": n, "loader": loader, "peak_rss_mb": 700.0, "tokens_per_s": 4e5}
            for loader in ("stream", "memory") for n in (100_000, 1_000_000)]
    scale.plot(planning, text, tmp_path)
    assert (tmp_path / "scale_planning.png").stat().st_size > 1000 and (tmp_path / "scale_text.png").is_file()


def test_compare_runs_every_loader_each_round_and_reports_medians_against_the_in_memory_loader(monkeypatch, capsys):
    """--compare 3: each of the five loaders runs three times, one round after the other; a loader's figure
    is its median tokens/s, its ratio that over the in-memory loader's median, and each round's ratio."""
    calls = []
    rates = {("memory", 0, False): [100, 300, 200], ("stream", 0, False): [90, 170, 180],
             ("stream", 0, True): [400, 500, 600], ("stream", 2, False): [50, 60, 70], ("stream", 2, True): [1, 2, 3]}

    def fake_point(options):
        leg = (options.loader, options.workers, options.counted)
        calls.append(leg)
        return {"tokens_per_s": rates[leg][sum(call == leg for call in calls) - 1]}

    monkeypatch.setattr(scale, "text_point", fake_point)
    result = scale.compare_text_loaders(scale.parse_args(["--text-sentences", "100", "--compare", "3"]))
    assert calls == list(rates) * 3
    legs = {(leg["loader"], leg["workers"], leg["counted"]): leg for leg in result["legs"]}
    assert legs[("memory", 0, False)]["ratio"] == 1.0 and legs[("stream", 0, True)]["tokens_per_s"] == 500
    assert legs[("stream", 0, True)]["ratio"] == 2.5 and legs[("stream", 0, True)]["round_ratios"] == [4.0, 1.67, 3.0]
    assert legs[("stream", 0, False)]["tokens_per_s"] == 170 and "| stream | 2 | True | 2 |" in capsys.readouterr().out
