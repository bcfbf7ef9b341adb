#!/usr/bin/env bash
# Pretrain recipe: data -> tokenizer -> k-means units -> joint speech-text pretraining.
#
#   bash recipes/pretrain/run.sh                          # the built-in demo corpus
#   bash recipes/pretrain/run.sh --train shards/train --valid shards/dev \
#       --text lm.en.txt --text_options "--lang en" --pairs en_fr.tsv --pairs_options "--lang en --tgt-lang fr" \
#       --user_symbols "<mask>,<en>,<fr>" --config hparams/conformer.yaml
#   bash recipes/pretrain/run.sh --stage 3 -- --number_of_epochs=5
#   bash recipes/pretrain/run.sh --stage 3 --nproc_per_node 8 ...  # torchrun DDP over 8 GPUs
#
# Then finetune from it: bash recipes/finetune/run.sh --pretrained exp/pretrain_demo
# Speech options take shard folders (local/make_shards.py); the demo's are made by stage 0
# (local/prepare_speech.sh, as the finetune recipe's). Text options take anything local/make_text_shards.py reads, or its parquet.
# Each stage is safe to rerun: units and training resume. Arguments after `--` go to train.py.
set -euo pipefail
cd "$(dirname "$0")/../.."

stage=0             # first stage to run
stop_stage=3        # last stage to run
data=data/demo      # working folder: corpus, shards, text, tokenizer, units
train=""            # unlabelled training speech: a shard folder (default: the demo's)
valid=""            # held-out speech shard folder (masked unit accuracy per epoch)
text=""             # mono text for denoising (.txt/.jsonl or a make_text_shards.py parquet)
text_options=""     # make_text_shards.py options for --text, e.g. "--lang en"
pairs=""            # paired text for translation (.tsv/.jsonl or parquet)
pairs_options=""    # make_text_shards.py options for --pairs, e.g. "--lang en --tgt-lang fr"
vocab_size=300      # SentencePiece pieces (as the finetune recipe: finetuning reuses this tokenizer; not for char)
token_type=bpe      # unigram | bpe | char
user_symbols="<mask>"  # tokenizer symbols: <mask> for denoising, plus the language tags used
speech_targets=kmeans  # kmeans (stage 2 makes units) | bestrq (random-projection codes: no stage 2)
n_units=100         # k-means clusters (HuBERT iteration 1: 100)
config=hparams/demo.yaml  # train.py config, relative to recipes/pretrain/ or to the repository
exp=""              # experiment folder (default: exp/pretrain_<config name>)
jobs=$(nproc)       # processes for data preparation
nproc_per_node=1    # training processes (GPUs) on this node: more than 1 trains under torchrun
torchrun_args=""    # several nodes: e.g. "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=node0:29500 --rdzv_id=x"
python=${PYTHON:-.venv/bin/python}
usage="Usage: $0 [--stage N] [--stop_stage N] [--data DIR] [--train SHARDS] [--valid SHARDS]
       [--text PATH] [--text_options OPTS] [--pairs PATH] [--pairs_options OPTS] [--vocab_size N]
       [--token_type T] [--user_symbols LIST] [--speech_targets kmeans|bestrq] [--n_units N] [--config YAML] [--exp DIR] [--jobs N]
       [--nproc_per_node N] [--torchrun_args \"...\"] [-- train.py overrides]"
. local/parse_options.sh
. local/launch_training.sh
. local/shard_paths.sh

if [ -z "$train" ]; then
  train=$data/shards/train; valid=$data/shards/valid; demo=true
  text=$data/corpus/train.jsonl; text_options=""
  pairs=$data/corpus/train.jsonl; pairs_options="--src-field translation --tgt-field text"
else
  demo=false
fi
[ -f "$config" ] || config=recipes/pretrain/$config
[ -f "$config" ] || { echo "Error: no config $config" >&2; echo "$usage" >&2; exit 2; }
[ -n "$exp" ] || exp=exp/pretrain_$(basename "${config%.*}")

# text_parquet NAME PATH: the parquet of a text corpus (PATH itself when it is one).
text_parquet() { case "$2" in *.parquet) echo "$2" ;; *) echo "$data/text/$1.parquet" ;; esac; }

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  if $demo; then  # the finetune recipe's demo corpus, its training and validation splits
    bash local/prepare_speech.sh --data "$data" --demo true --jobs "$jobs" -- \
      "train=$data/corpus/train.jsonl" "valid=$data/corpus/dev.jsonl"
  fi
  for split in "$train" $valid; do
    is_shard_dir "$split" || { echo "Error: $split is not a shard folder: make it with" \
      "local/make_shards.py (or local/prepare_speech.sh)" >&2; exit 2; }
  done
  if [ -n "$text" ] && [ "$(text_parquet mono "$text")" != "$text" ]; then
    log "Stage 0: data: mono text $text -> $(text_parquet mono "$text")"
    $python local/make_text_shards.py "$text" "$(text_parquet mono "$text")" $text_options
  fi
  if [ -n "$pairs" ] && [ "$(text_parquet pairs "$pairs")" != "$pairs" ]; then
    log "Stage 0: data: paired text $pairs -> $(text_parquet pairs "$pairs")"
    $python local/make_text_shards.py "$pairs" "$(text_parquet pairs "$pairs")" --paired $pairs_options
  fi
fi

if [ "$token_type" = char ]; then  # every character of the text: the size is the text's
  tokenizer=$data/tokenizer_pretrain/char.model; size_args=()
else
  tokenizer=$data/tokenizer_pretrain/${token_type}_${vocab_size}.model; size_args=(--vocab-size "$vocab_size")
fi
if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  # every text the model will see: the speech's transcripts (none when untranscribed), mono text, both
  # sides of the pairs; their language names become tags
  sources=("$train")
  [ -z "$text" ] || sources+=("$(text_parquet mono "$text")")
  [ -z "$pairs" ] || sources+=("$(text_parquet pairs "$pairs")")
  log "Stage 1: tokenizer: ${sources[*]} (+ symbols $user_symbols) -> $tokenizer"
  $python local/train_tokenizer.py "${sources[@]}" "$data/tokenizer_pretrain" "${size_args[@]}" \
    --model-type "$token_type" --user-symbols "$user_symbols"
fi

units=$data/units/$(basename "$train")
if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ] && [ "$speech_targets" = kmeans ]; then
  log "Stage 2: units: $train -> $units (k-means, $n_units units)"
  $python local/extract_units.py "$train" "$units" --n-units "$n_units" --jobs "$jobs"
  if [ -n "$valid" ]; then
    log "Stage 2: units: $valid -> $data/units/$(basename "$valid") (the same k-means)"
    $python local/extract_units.py "$valid" "$data/units/$(basename "$valid")" \
      --kmeans "$units/kmeans.json" --jobs "$jobs"
  fi
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  train_args=("$config" "--output_folder=$exp" "--tokenizer_file=$tokenizer"
    "--speech_parquets=[$(pool_parquet "$train")]" "--speech_targets=$speech_targets")
  [ "$speech_targets" != kmeans ] || train_args+=("--units_dirs=[$units]")
  [ -z "$text" ] || train_args+=("--text_parquets=[$(text_parquet mono "$text")]")
  [ -z "$pairs" ] || train_args+=("--paired_parquets=[$(text_parquet pairs "$pairs")]")
  [ -z "$valid" ] || train_args+=("--valid_parquet=$(pool_parquet "$valid")")
  [ -z "$valid" ] || [ "$speech_targets" != kmeans ] || train_args+=("--valid_units_dir=$data/units/$(basename "$valid")")
  log "Stage 3: pretrain: $train + ${text:-no text} + ${pairs:-no pairs} -> $exp"
  launch_training recipes/pretrain/train.py "${train_args[@]}" "${passthrough[@]}"
fi
