"""Command lines of the finetune recipe on the test session's tiny shards (shared by its tests)."""

import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(REPO, "recipes", "finetune", "hparams")
TRAIN_PY = os.path.join(REPO, "recipes", "finetune", "train.py")
RUN_SH = os.path.join(REPO, "recipes", "finetune", "run.sh")
CHUNK_WARMUP = 2  # updates of the chunk-trained fixture with full context before chunking (conftest.py)
# A model small enough to train a few epochs in seconds; the demo config's design otherwise (one encoder
# layer: no layer below it for small.yaml's intermediate CTC).
TINY = ["--d_model=32", "--nhead=2", "--num_encoder_layers=1", "--num_decoder_layers=1", "--d_ffn=64",
        "--max_batch_seconds=20.0", "--num_workers=0", "--warmup_steps=4", "--lr_peak=0.003",
        "--beam_size=2", "--inter_ctc_layers=[]", "--inter_ctc_weight=0.0", "--noprogressbar"]


def run_sh(*args, check=True):
    """Run recipes/finetune/run.sh with this interpreter; returns the CompletedProcess."""
    env = dict(os.environ, PYTHON=sys.executable)
    result = subprocess.run(["bash", RUN_SH, *args], capture_output=True, text=True, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"run.sh {args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result


def data_options(speech_shards):
    """run.sh options pointing at the session's shard folders (no synthesis, no sharding)."""
    return ["--train", str(speech_shards["train"]), "--valid", str(speech_shards["dev"]),
            "--test", str(speech_shards["test"])]


def train_argv(speech_shards, tokenizer_file, exp, *extra):
    """train.py arguments for the demo config on the tiny shards with the TINY model."""
    parquet = {split: f"{folder}/metadata_pool.parquet" for split, folder in speech_shards.items()}
    return [os.path.join(CONFIGS, "demo.yaml"), f"--output_folder={exp}", f"--tokenizer_file={tokenizer_file}",
            f"--train_parquet={parquet['train']}", f"--valid_parquet={parquet['dev']}",
            f"--test_parquets=[{parquet['test']}]", *TINY, *extra]


def epoch_losses(train_log):
    """Train loss per epoch from a SpeechBrain train_log.txt."""
    return [float(v) for v in re.findall(r"epoch: \d+.*?train loss: ([-+.\de]+)", open(train_log).read())]


def batch_log_lines(exp, rank=0):
    """The lines of a run's batch log (``batch_log: True``), in the order they were written."""
    with open(os.path.join(exp, "batches", f"rank{rank}.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def trained_batches(exp, rank=0):
    """{(epoch, batch index): line} of a batch log; a batch redone after a kill counts once (last line)."""
    return {(line["epoch"], line["batch"]): line for line in batch_log_lines(exp, rank)}
