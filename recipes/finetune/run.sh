#!/usr/bin/env bash
# Finetune recipe: data -> tokenizer -> train -> decode + score.
#
#   bash recipes/finetune/run.sh                          # the built-in demo corpus, end to end
#   bash recipes/finetune/run.sh --train my/train.jsonl --valid my/dev.jsonl --test "my/test.jsonl"
#   bash recipes/finetune/run.sh --stage 2 --stop_stage 2 -- --max_batch_seconds=100
#
# Data options take anything local/make_shards.py reads (a .jsonl/.tsv manifest, a Kaldi folder, a
# folder of audio) or a shard folder made by it. Each stage is safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/../.."

stage=0             # first stage to run
stop_stage=1        # last stage to run
data=data/demo      # working folder: generated corpus, shards, tokenizer
train=""            # training corpus or shard folder (default: the synthesized demo corpus)
valid=""            # validation corpus or shard folder
test=""             # space-separated test corpora or shard folders
vocab_size=64       # SentencePiece pieces, special ones included
token_type=unigram  # unigram | bpe | char
jobs=$(nproc)       # processes for synthesis and shard encoding
python=${PYTHON:-.venv/bin/python}
usage="Usage: $0 [--stage N] [--stop_stage N] [--data DIR] [--train PATH] [--valid PATH]
       [--test \"PATH ...\"] [--vocab_size N] [--token_type unigram|bpe|char] [--jobs N] [-- overrides]"
. local/parse_options.sh

# shard_dir NAME PATH: where the shards of a corpus live (PATH itself when it is a shard folder).
shard_dir() {
  if [ -f "$2/metadata_pool.parquet" ]; then echo "$2"; else echo "$data/shards/$1"; fi
}
# split_name PATH: a short name for a corpus, from its file or folder name.
split_name() { local base; base=$(basename "$1"); echo "${base%.*}"; }

if [ -z "$train" ]; then
  train=$data/corpus/train.jsonl; valid=$data/corpus/dev.jsonl; test=$data/corpus/test.jsonl
  demo=true
else
  demo=false
  [ -n "$valid" ] || { echo "Error: --valid is required with --train" >&2; exit 2; }
  [ -n "$test" ] || { echo "Error: --test is required with --train" >&2; exit 2; }
fi
declare -A corpora=([train]=$train [valid]=$valid)
for path in $test; do corpora[$(split_name "$path")]=$path; done

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  if $demo; then
    log "Stage 0: data: synthesize the demo corpus -> $data/corpus"
    $python local/synth_corpus.py "$data/corpus" --jobs "$jobs"
  fi
  for name in "${!corpora[@]}"; do
    path=${corpora[$name]}
    out=$(shard_dir "$name" "$path")
    if [ "$out" != "$path" ]; then
      log "Stage 0: data: shard $name: $path -> $out"
      $python local/make_shards.py "$path" "$out" --jobs "$jobs" --prefix "$name" --shard-size 64
    fi
    $python local/check_shards.py "$out" --jobs "$jobs"
  done
fi

tokenizer=$data/tokenizer/${token_type}_${vocab_size}.model
if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  log "Stage 1: tokenizer: $(shard_dir train "$train") -> $tokenizer"
  $python local/train_tokenizer.py "$(shard_dir train "$train")" "$data/tokenizer" \
    --vocab-size "$vocab_size" --model-type "$token_type"
fi
