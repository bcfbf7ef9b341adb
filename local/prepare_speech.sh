#!/usr/bin/env bash
# Stage 0 of the speech recipes (finetune, pretrain): corpora -> checked shard folders.
#
#   bash local/prepare_speech.sh --data data/demo --demo true -- \
#       train=data/demo/corpus/train.jsonl valid=data/demo/corpus/dev.jsonl
#
# --demo true first synthesizes the demo corpus (local/synth_corpus.py -> DATA/corpus). Each NAME=PATH
# after `--` is sharded (local/make_shards.py) into DATA/shards/NAME, unless PATH is a shard folder
# already; every shard folder is then checked (local/check_shards.py). Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."

data=data/demo      # working folder: generated corpus, shards
demo=false          # true: synthesize the demo corpus into $data/corpus first
jobs=$(nproc)       # processes for synthesis and shard encoding
python=${PYTHON:-.venv/bin/python}
usage="Usage: $0 [--data DIR] [--demo true|false] [--jobs N] -- NAME=PATH [NAME=PATH ...]"
. local/parse_options.sh
. local/shard_paths.sh

if [ "$demo" = true ]; then
  log "Stage 0: data: synthesize the demo corpus -> $data/corpus"
  $python local/synth_corpus.py "$data/corpus" --jobs "$jobs"
fi
for corpus in "${passthrough[@]}"; do
  name=${corpus%%=*}; path=${corpus#*=}
  [ "$name" != "$corpus" ] || { echo "Error: '$corpus' is not NAME=PATH" >&2; echo "$usage" >&2; exit 2; }
  out=$(shard_dir "$name" "$path")
  if [ "$out" != "$path" ]; then
    log "Stage 0: data: shard $name: $path -> $out"
    $python local/make_shards.py "$path" "$out" --jobs "$jobs" --prefix "$name" --shard-size 64 --rebuild
  fi
  $python local/check_shards.py "$out" --jobs "$jobs"
done
