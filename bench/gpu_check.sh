#!/usr/bin/env bash
# GPU check: a few hundred bf16 training steps of recipes/finetune/hparams/conformer.yaml with the
# real loader on generated shards; prints step time, utterances/s, audio s/s, GPU utilisation, peak
# GPU memory and the share of time spent waiting for data (bench/gpu_check.py does the work).
#
#   bash bench/gpu_check.sh                               # 300 steps on cuda:0, ~5 minutes
#   bash bench/gpu_check.sh --steps 200 --out /scratch/gpu_check --json
#   bash bench/gpu_check.sh -- --num_workers=12           # config overrides after --
#   bash bench/gpu_check.sh --device cpu --steps 5        # smoke run of the path with a tiny model
#
# Installs nothing but requirements.txt, and only when no interpreter that imports them is found:
# $PYTHON if set, else .venv/bin/python, else python3. No system packages (no espeak-ng):
# the audio is synthesized in numpy. `bench/gpu_check.py --help` lists every option.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "$(date '+%Y-%m-%d %H:%M:%S') $*" >&2; }
# has_requirements PYTHON: whether PYTHON imports what the check uses (requirements.txt).
has_requirements() {
  "$1" -c 'import torch, torchaudio, speechbrain, sentencepiece, webdataset, pyarrow, soundfile' 2>/dev/null
}

if [ -n "${PYTHON:-}" ]; then
  python=$PYTHON
  has_requirements "$python" || { echo "Error: PYTHON=$python cannot import the requirements:" \
    "install requirements.txt into it, or unset PYTHON to use .venv" >&2; exit 2; }
elif has_requirements .venv/bin/python; then
  python=.venv/bin/python
elif command -v python3 >/dev/null && has_requirements python3; then
  python=python3
else
  log "Setup: no interpreter with the requirements: python3 -m venv .venv + requirements.txt"
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet -r requirements.txt
  python=.venv/bin/python
fi
"$python" -c 'import common' 2>/dev/null || "$python" -m pip install --quiet --no-deps --no-build-isolation -e .  # the project
versions=$("$python" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)')
log "Using $python ($versions)"
exec "$python" bench/gpu_check.py "$@"
