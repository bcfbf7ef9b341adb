"""Training steps the learning benches record and reuse: a step runs a command once, records the minutes
it took and a digest of its configs' settings in its folder (``bench_step.json``), and is reused by a
later run of the same command while those settings hold; the finetune command of a bench arm and its
dev figures.

    minutes = step(folder, finetune_command(config, folder, tokenizer, [train], valid, 9.0))
    row = dev_comparison(folder, baseline_folder)   # greedy dev CER / WER, paired gains
"""

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time

import ruamel.yaml

from bench import stats
from common.atomic import atomic_write_text
from common.recipe import BASE_KEY, SIZE_KEY

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP_RECORD = "bench_step.json"
DEV_HYPS = "hyp_valid_ctc_greedy.jsonl"  # a finetune's test stage over dev (greedy CTC, no LM)


def run(command):
    """Run a command from the repository root, echoing it; stop the bench if it fails. Returns minutes."""
    print("+ " + shlex.join(command), flush=True)
    began = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True)
    return (time.perf_counter() - began) / 60.0


def config_files(path):
    """The yaml config at ``path`` and the files it stands on (``base_config``, ``model_size``), in order."""
    with open(path, encoding="utf-8") as f:
        tree = ruamel.yaml.YAML().load(f)
    named = [tree[key] for key in (BASE_KEY, SIZE_KEY) if isinstance(tree, dict) and key in tree]
    return [path] + [part for name in named for part in config_files(os.path.join(os.path.dirname(path), str(name)))]


def config_digest(command):
    """A digest of the settings in the yaml configs ``command`` names (their bases and model sizes with
    them; comments and blank lines left out), so a step is not reused once its config has changed."""
    digest = hashlib.sha256()
    for word in command:
        path = os.path.join(REPO, word)  # an absolute word stays itself
        if word.endswith(".yaml") and os.path.isfile(path):
            for part in config_files(path):
                with open(part, encoding="utf-8") as f:
                    lines = (re.sub(r"(^|\s)#.*$", "", line).rstrip() for line in f)
                    digest.update("\n".join(line for line in lines if line).encode() + b"\0")
    return digest.hexdigest()[:16]


def step(folder, command):
    """Run ``command`` unless ``folder`` holds its finished record; returns the minutes it took (then). A
    record of another command (other overrides, budgets, inputs) or of the same command with other
    settings in its config files stops the bench rather than reuse it."""
    record = os.path.join(folder, STEP_RECORD)
    if os.path.isfile(record):
        with open(record, encoding="utf-8") as f:
            done = json.load(f)
        if shlex.split(done["command"])[1:] != command[1:]:  # the interpreter's path may differ
            raise SystemExit(f"error: {folder} was made by another command:\n  {done['command']}\nnot\n  "
                             f"{shlex.join(command)}\ngive --exp another folder, or remove {folder} to train it "
                             "again")
        if "configs" in done and done["configs"] != config_digest(command):
            raise SystemExit(f"error: {folder} was made by the same command when its config files held other "
                             f"settings ({', '.join(w for w in command if w.endswith('.yaml'))}): give --exp "
                             f"another folder, or remove {folder} to train it again")
        print(f"reused {folder} ({done['minutes']:.1f} min" + ("" if "configs" in done else
                                                               "; made before configs were recorded") + ")",
              flush=True)
        return done["minutes"]
    minutes = round(run(command), 3)  # what the record keeps: a later run that reuses it adds the same
    os.makedirs(folder, exist_ok=True)
    atomic_write_text(record, json.dumps({"minutes": minutes, "command": shlex.join(command),
                                          "configs": config_digest(command)}) + "\n")
    return minutes


def finetune_command(config, folder, tokenizer, train_parquets, valid, minutes, extra=()):
    """recipes/finetune/train.py's command for a bench finetune of ``minutes``: ``valid`` is its dev set and
    its test stage a greedy CTC pass over it (``DEV_HYPS``); the ``extra`` overrides come last."""
    return [sys.executable, "recipes/finetune/train.py", config, f"--output_folder={folder}",
            f"--tokenizer_file={tokenizer}", f"--train_parquet=[{', '.join(train_parquets)}]",
            f"--valid_parquet={valid}", f"--test_parquets=[{valid}]", "--test_search=ctc_greedy",
            "--number_of_epochs=1000", f"--train_minutes={minutes}", "--noprogressbar", *extra]


def dev_comparison(folder, base_folder):
    """The greedy dev CER and WER of the finetune in ``folder`` (``DEV_HYPS``) with their intervals, and
    their paired relative gains against the finetune in ``base_folder``: ``{"dev_cer", "dev_cer_ci",
    "cer_gain", "cer_gain_ci", and the same for wer}``."""
    row = {}
    for unit, name in (("char", "cer"), ("word", "wer")):
        ours, base = (stats.read_scored(os.path.join(f, DEV_HYPS), unit) for f in (folder, base_folder))
        rate, gain = stats.error_rate(ours), stats.relative_gain(ours, base)
        row |= {f"dev_{name}": round(rate.value, 2), f"dev_{name}_ci": [round(rate.low, 2), round(rate.high, 2)],
                f"{name}_gain": round(gain.value, 4), f"{name}_gain_ci": gain.as_list()}
    return row


def dev_figures(folder):
    """``{"wer", "cer"}`` of a finetune's test stage over dev (greedy CTC), from its results.json."""
    with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
        valid = json.load(f)["valid"]
    return {"wer": valid["wer"], "cer": valid["cer"]}
