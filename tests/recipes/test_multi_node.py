"""Two torchrun "nodes" on one host (c10d rendezvous on localhost, two gloo ranks each) train and decode
the tiny finetune model exactly as one node of 4 ranks does, and resume exactly after one node is killed.

The commands are recipes/finetune/run.sh's multi-node commands (its --torchrun_args), with localhost
as the rendezvous host:

    # one node, 4 ranks
    python -m torch.distributed.run --standalone --nproc_per_node=4 recipes/finetune/train.py CONFIG ...
    # two nodes of 2 ranks: the same command on each node (here both on this host)
    python -m torch.distributed.run --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d \\
        --rdzv_endpoint=localhost:PORT --rdzv_id=ID recipes/finetune/train.py CONFIG ...

Three launches of four ranks each (2 x 2 is the smallest layout where a node holds several ranks, as
real nodes do: local and global ranks differ on the second node): about 2 minutes on two CPU cores.
"""

import contextlib
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from local import make_shards
from tests.recipes.finetune_args import REPO, TRAIN_PY, batch_log_lines, train_argv

RANKS = 4  # two nodes of two ranks
# One epoch of ~15 batches per rank, a checkpoint every 2 updates; decode the test split at the end.
RUN = ["--batch_log=True", "--number_of_epochs=1", "--max_batch_seconds=6.0", "--ckpt_interval_steps=2",
       "--ckpt_interval_minutes=0", "--do_test=True"]


def free_port():
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def one_node(argv):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}", TRAIN_PY,
            *argv]


def node(port, rdzv_id, argv):
    """One node's command: the same on every node (c10d assigns the ranks)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--nproc_per_node={RANKS // 2}",
            "--rdzv_backend=c10d", f"--rdzv_endpoint=localhost:{port}", f"--rdzv_id={rdzv_id}", TRAIN_PY, *argv]


def kill_node(agent):
    """SIGKILL a node: its torchrun agent and every process under it (torchrun starts its ranks in
    sessions of their own, so killing the agent's process group would leave them running)."""
    parents = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            pid, ppid = int(stat.split("/")[2]), int(open(stat).read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
        parents.setdefault(ppid, []).append(pid)
    doomed, queue = [], [agent.pid]
    while queue:
        doomed.append(queue.pop())
        queue += parents.get(doomed[-1], [])
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start(command, log):
    """Start ``command`` in its own process group (a "node"), output to ``log``."""
    return subprocess.Popen(command, cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def finish(processes, logs, timeout=600):
    for process, log in zip(processes, logs):
        assert process.wait(timeout=timeout) == 0, open(log).read()[-5000:]


def two_nodes(argv, tmp_path, tag):
    """Start both nodes of a fresh rendezvous; returns their processes and logs."""
    port, logs = free_port(), [tmp_path / f"{tag}_node{k}.log" for k in (0, 1)]
    return [start(node(port, f"{tag}{port}", argv), logs[k]) for k in (0, 1)], logs


def by_batch(exp):
    """{(epoch, batch, rank): line} of every rank's batch log; a batch redone after a kill: its last line."""
    return {(line["epoch"], line["batch"], rank): line for rank in range(RANKS) for line in batch_log_lines(exp, rank)}


@pytest.fixture(scope="module")
def four_shards(speech_corpus, tmp_path_factory):
    """The tiny corpus's train split in many small shards (at least one per rank)."""
    out = tmp_path_factory.mktemp("four_shards") / "train"
    make_shards.main([str(speech_corpus / "train.jsonl"), str(out), "--jobs", "2", "--shard-size", "0.04",
                      "--prefix", "train"])
    assert len(list(out.glob("*.tar"))) >= RANKS
    return out


def test_two_nodes_equal_one_node_and_resume_exactly_after_one_node_is_killed(speech_shards, four_shards,
                                                                             tokenizer_file, tmp_path):
    """One node of 4 ranks against two nodes of 2 ranks whose second node is SIGKILLed mid-epoch (the
    first then fails on its own), both restarted with the same commands. The ranks' batches of the epoch
    hold every training sample exactly once; every rank's batches (keys, update step, learning rate) of
    the two-node run equal the one-node run's, the losses of each batch equal within float tolerance,
    the restart resumed from a checkpoint (not from scratch), and the test split decodes to the same
    hypotheses and WER."""
    shards = {**speech_shards, "train": four_shards}
    reference, exp = tmp_path / "one_node", tmp_path / "two_nodes"
    one = start(one_node(train_argv(shards, tokenizer_file, reference, *RUN)), tmp_path / "one_node.log")
    finish([one], [tmp_path / "one_node.log"])
    expected = by_batch(reference)
    assert len(expected) >= RANKS * 4
    seen = sorted(key for line in expected.values() for key in line["keys"])
    assert seen == sorted(pq.read_table(four_shards / "metadata_pool.parquet")["sample_key"].to_pylist())

    argv = train_argv(shards, tokenizer_file, exp, *RUN)
    nodes, logs = two_nodes(argv, tmp_path, "killed")
    deadline = time.monotonic() + 300
    while not (exp / "batches" / "rank0.jsonl").exists() or len(batch_log_lines(exp)) < 3:
        assert time.monotonic() < deadline and nodes[1].poll() is None, open(logs[1]).read()[-3000:]
        time.sleep(0.05)
    kill_node(nodes[1])
    try:  # the surviving node's ranks fail when their peers go
        nodes[0].wait(timeout=120)
    except subprocess.TimeoutExpired:
        kill_node(nodes[0])
    nodes[1].wait()
    before = len(batch_log_lines(exp))
    assert before < len(expected) // RANKS, "killed too late to test anything"

    finish(*two_nodes(argv, tmp_path, "restarted"))
    resumed = by_batch(exp)
    assert resumed.keys() == expected.keys()
    for batch, line in expected.items():
        assert resumed[batch]["keys"] == line["keys"], batch
        assert resumed[batch]["update"] == line["update"], batch
        assert resumed[batch]["lr"] == pytest.approx(line["lr"], rel=1e-9), batch
        assert resumed[batch]["loss"] == pytest.approx(line["loss"], rel=1e-4, abs=1e-5), batch
    redone = batch_log_lines(exp)[before]
    assert redone["update"] > 1  # restored from a checkpoint
    results = [json.loads((folder / "results.json").read_text())["test"] for folder in (reference, exp)]
    assert results[0]["wer"] == results[1]["wer"] and results[0]["num_utterances"] == results[1]["num_utterances"]
    hyps = [sorted((folder / "hyp_test.trn").read_text().splitlines()) for folder in (reference, exp)]
    assert hyps[0] == hyps[1]
