"""Finetune recipe under torchrun (2 CPU ranks, gloo) and after kill -9, on real espeak-ng shards."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter

import pyarrow.parquet as pq
import pytest

from tests.recipes.finetune_args import (
    REPO,
    TINY,
    TRAIN_PY,
    batch_log_lines,
    data_options,
    epoch_losses,
    run_sh,
    train_argv,
    trained_batches,
)

AUDIT = ["--batch_log=True", "--do_test=False"]


def run_to_the_end(command, timeout=600):
    """Run ``command`` from the repository root; fail with its output if it fails."""
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def wait_for_lines(path, count, process, timeout=300):
    """Wait until ``path`` holds ``count`` lines (the process still running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and sum(1 for _ in open(path)) >= count:
            return
        assert process.poll() is None, f"the run ended before writing {count} batch lines"
        time.sleep(0.05)
    raise AssertionError(f"no {count} lines in {path} after {timeout} s")


def training_command(speech_shards, tokenizer_file, exp):
    """Two epochs (~9 batches each) of the tiny model, a checkpoint every 2 updates, batches logged."""
    return [sys.executable, TRAIN_PY, *train_argv(speech_shards, tokenizer_file, exp, *AUDIT, "--number_of_epochs=2",
                                                  "--ckpt_interval_steps=2", "--ckpt_interval_minutes=0")]


@pytest.fixture(scope="module")
def uninterrupted(speech_shards, tokenizer_file, tmp_path_factory):
    """The batches of an uninterrupted run of ``training_command``."""
    exp = tmp_path_factory.mktemp("uninterrupted")
    run_to_the_end(training_command(speech_shards, tokenizer_file, exp))
    return trained_batches(exp)


@pytest.mark.parametrize("kill_after", [3, 12])  # in epoch 1; in epoch 2
def test_kill_9_then_the_same_command_continues_with_the_next_batch_and_lr_step(
        speech_shards, tokenizer_file, uninterrupted, tmp_path, kill_after):
    """Killed (SIGKILL) during training with checkpoints every 2 updates, the same command restarts
    from the last checkpoint: every batch of the run then has the keys, update step and learning
    rate of an uninterrupted run, and the rerun's first batch follows a checkpointed one."""
    command, exp = training_command(speech_shards, tokenizer_file, tmp_path / "killed"), tmp_path / "killed"
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_lines(exp / "batches" / "rank0.jsonl", kill_after, process)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    before_kill = len(batch_log_lines(exp))
    assert before_kill < len(uninterrupted), "killed too late to test anything"
    run_to_the_end(command)
    first_redone = batch_log_lines(exp)[before_kill]
    assert 2 <= first_redone["update"] - 1 <= before_kill  # restored from a checkpoint, not from scratch
    assert first_redone["batch"] % 2 == 0  # checkpoints: every 2 batches of an epoch, and at its end
    resumed = trained_batches(exp)
    assert resumed.keys() == uninterrupted.keys()
    for batch, line in uninterrupted.items():
        assert resumed[batch]["keys"] == line["keys"], batch
        assert resumed[batch]["update"] == line["update"], batch
        assert resumed[batch]["lr"] == pytest.approx(line["lr"], rel=1e-9), batch


def test_two_ranks_under_torchrun_see_every_sample_once_per_epoch_in_equal_steps(speech_shards, tmp_path):
    """run.sh --nproc_per_node 2 trains under torchrun on the CPU (gloo) over shards of uneven sizes:
    no hang, both ranks take the same number of steps, each epoch's batches of the two ranks hold
    every training sample exactly once, and the training loss goes down."""
    pool = pq.read_table(speech_shards["train"] / "metadata_pool.parquet")
    shard_sizes = Counter(pool["shard_name"].to_pylist())
    assert len(shard_sizes) >= 2 and len(set(shard_sizes.values())) > 1, shard_sizes  # uneven shards
    exp = tmp_path / "ddp"
    result = run_sh("--stage", "1", "--stop_stage", "2", "--data", str(tmp_path / "data"), "--vocab_size", "60",
                    "--config", "hparams/demo.yaml", "--exp", str(exp), "--nproc_per_node", "2",
                    *data_options(speech_shards),
                    "--", *TINY, "--batch_log=True", "--number_of_epochs=3")  # run.sh sets do_test
    assert "2 ranks x 1 accumulated x 20 padded seconds" in result.stdout + result.stderr
    ranks = [batch_log_lines(exp, rank) for rank in (0, 1)]
    for epoch in (1, 2, 3):
        per_rank = [[line for line in lines if line["epoch"] == epoch] for lines in ranks]
        assert len(per_rank[0]) == len(per_rank[1]) > 0, epoch
        seen = [key for lines in per_rank for line in lines for key in line["keys"]]
        assert sorted(seen) == sorted(pool["sample_key"].to_pylist()), epoch
    assert [line["update"] for line in ranks[0]] == [line["update"] for line in ranks[1]]
    losses = epoch_losses(exp / "train_log.txt")
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    num_dev = pq.read_table(speech_shards["dev"] / "metadata_pool.parquet").num_rows
    validated = re.findall(r"valid NUM_UTTERANCES: (\d+)", (exp / "train_log.txt").read_text())
    assert validated == [str(num_dev)] * 3  # each rank validated a share; the figures cover all of dev


def test_two_ranks_decode_a_share_each_and_score_the_same_as_one_process(speech_shards, tmp_path):
    """run.sh stage 3 with --nproc_per_node 2 splits the test batches between two ranks and reduces
    on the main process: the same WER, CER, utterance count and hypotheses as one process."""
    exp = tmp_path / "exp"
    common = ["--data", str(tmp_path / "data"), "--vocab_size", "60", "--config", "hparams/demo.yaml",
              *data_options(speech_shards)]
    run_sh("--stage", "1", "--stop_stage", "2", "--exp", str(exp), *common, "--", *TINY, "--number_of_epochs=2")
    shutil.copytree(exp, tmp_path / "one")
    run_sh("--stage", "3", "--exp", str(exp), "--nproc_per_node", "2", *common, "--", *TINY)
    run_sh("--stage", "3", "--exp", str(tmp_path / "one"), *common, "--", *TINY)
    figures = [json.loads((folder / "results.json").read_text())["test"] for folder in (exp, tmp_path / "one")]
    num_test = pq.read_table(speech_shards["test"] / "metadata_pool.parquet").num_rows
    assert figures[0]["num_utterances"] == num_test
    for key in ("wer", "cer", "num_utterances"):
        assert figures[0][key] == figures[1][key], key
    hyps = [sorted((folder / "hyp_test.trn").read_text().splitlines()) for folder in (exp, tmp_path / "one")]
    assert hyps[0] == hyps[1] and len(hyps[0]) == num_test
