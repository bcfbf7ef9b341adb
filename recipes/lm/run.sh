#!/usr/bin/env bash
# Language model recipe: text -> text parquets -> LM training, for shallow fusion in recipes/finetune.
#
#   bash recipes/lm/run.sh --tokenizer data/open/tokenizer/char.model --data data/open \
#       --text data/open/corpus/lm_text.txt --valid data/open/corpus/dev.jsonl
#   bash recipes/finetune/run.sh --stage 3 ... -- --lm_dir=exp/lm_rnnlm --lm_weight=0.3
#
# --text: the training text: .txt files (a sentence a line) or .jsonl manifests (their "text"), several
# separated by spaces; --valid: held-out text the same way (the dev manifest, never test transcripts).
# The tokenizer is the ASR model's: the LM scores the pieces its decoder emits. Each stage is safe to
# rerun: stage 0 rewrites the parquets, training resumes from its last checkpoint.
# Arguments after `--` go to train.py as overrides (--key=value).
set -euo pipefail
cd "$(dirname "$0")/../.."

stage=0             # first stage to run
stop_stage=1        # last stage to run
data=data/lm        # working folder: the text parquets go to $data/lm_text/
text=""             # space-separated training text files (.txt or .jsonl)
valid=""            # held-out text file (.txt or .jsonl)
tokenizer=""        # the ASR model's SentencePiece model
config=hparams/rnnlm.yaml  # train.py config, relative to recipes/lm/ or to the repository
exp=""              # experiment folder (default: exp/lm_<config name>)
nproc_per_node=1    # training processes on this node: more than 1 trains under torchrun
torchrun_args=""    # several nodes (see recipes/finetune/run.sh)
python=${PYTHON:-.venv/bin/python}
usage="Usage: $0 --tokenizer MODEL --text \"FILE ...\" --valid FILE [--data DIR] [--config YAML] [--exp DIR]
       [--stage N] [--stop_stage N] [--nproc_per_node N] [--torchrun_args \"...\"] [-- train.py overrides]"
. local/parse_options.sh
. local/launch_training.sh

for option in tokenizer text valid; do
  [ -n "${!option}" ] || { echo "Error: --$option is required" >&2; echo "$usage" >&2; exit 2; }
done
[ -f "$config" ] || config=recipes/lm/$config
[ -f "$config" ] || { echo "Error: no config $config" >&2; echo "$usage" >&2; exit 2; }
[ -n "$exp" ] || { name=$(basename "$config"); exp=exp/lm_${name%.*}; }
text_dir=$data/lm_text
parquet_of() { local base; base=$(basename "$1"); echo "$text_dir/${base%.*}.parquet"; }

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  for path in $text $valid; do
    log "Stage 0: text: $path -> $(parquet_of "$path")"
    $python local/make_text_shards.py "$path" "$(parquet_of "$path")"
  done
fi

train_parquets=""
for path in $text; do train_parquets+="${train_parquets:+, }$(parquet_of "$path")"; done
if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  log "Stage 1: train: $train_parquets (valid $(parquet_of "$valid")) -> $exp"
  launch_training recipes/lm/train.py "$config" "--output_folder=$exp" "--tokenizer_file=$tokenizer" \
    "--train_parquets=[$train_parquets]" "--valid_parquet=$(parquet_of "$valid")" "${passthrough[@]}"
  log "Language model: $exp/lm.ckpt; decode with --lm_dir=$exp --lm_weight=W (recipes/finetune)"
fi
