"""The throughput benches (encode, batching, loader, gpu_check) run end to end at a tiny size and
print figures that obey what each one measures: the figures' relations, not their values (those are
the benches' own business, on a quiet machine)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_bench(args, timeout=600):
    """Runs a bench command from the repository root; returns its last stdout line parsed as JSON."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_batching_bench_never_exceeds_the_budget_nor_beats_the_oracle():
    """Every method's batches stay within the padded budget, and none needs fewer batches than the
    globally sorted greedy cut (the fewest possible)."""
    figures = run_bench([sys.executable, "bench/batching.py", "--count", "1500", "--buffers", "256", "--json"])
    assert {"tandem", "tandem_256", "speechbrain_1024", "oracle"} <= set(figures)
    for name, row in figures.items():
        assert row["over_budget_batches"] == 0, name
        assert row["batches"] >= row["oracle_batches"], name
        assert 0.0 <= row["padding_pct"] < 100.0, name


def test_encode_bench_encoding_phase_is_no_slower_than_the_whole_run(tmp_path):
    """make_shards.py's encoding phase is part of its run, so its audio rate is at least the run's."""
    figures = run_bench([sys.executable, "bench/encode.py", "--utterances", "6", "--jobs", "1", "--json"])
    assert figures["single_core"]["audio_s_per_s"] > 0
    assert figures["make_shards_jobs_1_encoding"]["audio_s_per_s"] >= figures["make_shards_jobs_1_run"]["audio_s_per_s"]


def test_loader_bench_measures_every_setting():
    """The loader bench reads every shard with 0, 1 and 2 workers and sets each against the limit
    measured in the same repeat."""
    figures = run_bench([sys.executable, "bench/loader.py", "--utterances-per-shard", "3", "--repeats", "1",
                         "--json"])
    settings = {"tandem_0_workers", "tandem_1_workers", "tandem_2_workers", "tandem_2_workers_fbank_in_main"}
    assert set(figures) == settings
    for name, row in figures.items():
        assert row["audio_s_per_s"] > 0 and row["limit_audio_s_per_s"] > 0, name
        assert row["median_ratio"] > 0, name


def test_gpu_check_runs_its_path_on_the_cpu(tmp_path):
    """The GPU check's CPU smoke run trains through the real loader: it times the steps it was asked to,
    and the throughput with data waits is at most the throughput without them."""
    figures = run_bench(["bash", "bench/gpu_check.sh", "--device", "cpu", "--steps", "3", "--untimed-steps", "1",
                         "--utterances", "16", "--vocab-size", "40", "--out", str(tmp_path / "check"), "--json"])
    assert figures["device"] == "cpu"
    assert figures["timed_steps"] == 2 and figures["untimed_steps"] == 1
    assert 0.0 <= figures["data_wait_pct"] <= 100.0
    assert figures["audio_s_per_s"] <= figures["compute_bound_audio_s_per_s"] * 1.0001
