#!/usr/bin/env bash
# Finetune recipe: data -> tokenizer -> train -> decode + score.
#
#   bash recipes/finetune/run.sh                          # the built-in demo corpus, end to end
#   bash recipes/finetune/run.sh --train my/train.jsonl --valid my/dev.jsonl --test "my/test.jsonl"
#                                                         # your corpus, with hparams/small.yaml
#   bash recipes/finetune/run.sh --stage 2 --stop_stage 2 -- --max_batch_seconds=100
#   bash recipes/finetune/run.sh --config hparams/demo_st.yaml   # speech translation of the demo
#   bash recipes/finetune/run.sh --pretrained exp/pretrain_demo  # from recipes/pretrain/run.sh
#   bash recipes/finetune/run.sh --train ... --lm_text my/text.txt  # + a language model fused at decoding
#   bash recipes/finetune/run.sh --train ... --lm_text my/text.txt --unlabelled my/untranscribed.jsonl
#                                                         # + stage 4: self-training on untranscribed speech
#   bash recipes/finetune/run.sh --stage 2 --nproc_per_node 8 ...  # torchrun DDP over 8 GPUs (stage 3:
#                                                         # the 8 processes decode a share each)
#   bash recipes/finetune/run.sh --stage 2 --nproc_per_node 8 \
#       --torchrun_args "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=node0:29500 --rdzv_id=asr1" ...
#                                                         # two nodes: the same command on each node, node0
#                                                         # the rendezvous host, a shared exp/ and data folder;
#                                                         # kill one node and rerun it on both to resume
#                                                         # (tests/recipes/test_multi_node.py runs it on one host)
#
# Data options take anything local/make_shards.py reads (a .jsonl/.tsv manifest, a Kaldi folder, a
# folder of audio) or a shard folder made by it. Each stage is safe to rerun: training resumes from
# its last checkpoint. Arguments after `--` go to train.py as overrides (--key=value).
# The target text (text_field) and its language tag (prefix_tokens) come from the config.
set -euo pipefail
cd "$(dirname "$0")/../.."

stage=0             # first stage to run
stop_stage=4        # last stage to run (4 runs only with --unlabelled)
data=data/demo      # working folder: generated corpus, shards, tokenizer
train=""            # training corpus or shard folder (default: the synthesized demo corpus)
valid=""            # validation corpus or shard folder
test=""             # space-separated test corpora or shard folders
vocab_size=""       # SentencePiece pieces, special ones included (default: the config's token_count)
token_type=""       # unigram | bpe | char (default: the config's token_type)
config=""           # train.py config, relative to recipes/finetune/ or to the repository (default:
                    # hparams/demo.yaml for the demo corpus, hparams/small.yaml with --train)
exp=""              # experiment folder (default: exp/finetune_<config name>)
pretrained=""       # a recipes/pretrain experiment folder: start from its weights, use its tokenizer
lm_text=""          # text of the domain (.txt / .jsonl, space-separated): stage 2 also trains recipes/lm
                    # on it (the same tokenizer) and stage 3 decodes with it (shallow fusion)
lm_valid=""         # held-out text for that LM (default: --valid when it is a .jsonl or .txt)
lm_minutes=8        # the LM's training budget (on the open corpus 8 min meet the goal, 16 gain 1-2 points)
lm_weight=1.0       # its fusion weight (1.0 measured best on the open corpus' dev; choose yours on dev)
lm_args=""          # more recipes/lm train.py overrides, space-separated
lm_decode_args="--beam_size=16 --ctc_weight=0.6"  # stage 3's search with the LM (open corpus' dev:
                    # WER 20.2 -> 17.8 % against the config's beam 8 and CTC weight 0.4, which stay best without it)
unlabelled=""        # space-separated untranscribed speech (corpora or shard folders): stage 4 self-trains on it:
                    # the model (with its LM) transcribes it, keeps the hypotheses above a threshold chosen on
                    # dev (recipes/finetune/pseudo_label.py) and finetuning goes on with labelled + pseudo-labelled
self_training_rounds=1  # rounds of stage 4: round r labels with round r-1's model, writes <exp>_st<r>
pseudo_label_args=""  # more pseudo_label.py options, e.g. "--wer_ratio 0.3"
jobs=$(nproc)       # processes for synthesis and shard encoding
nproc_per_node=1    # processes (GPUs) on this node: more than 1 trains and decodes under torchrun
torchrun_args=""    # several nodes: e.g. "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=node0:29500 --rdzv_id=x"
python=${PYTHON:-.venv/bin/python}
usage="Usage: $0 [--stage N] [--stop_stage N] [--data DIR] [--train PATH] [--valid PATH]
       [--test \"PATH ...\"] [--vocab_size N] [--token_type unigram|bpe|char] [--config YAML]
       [--exp DIR] [--pretrained DIR] [--lm_text \"FILE ...\"] [--lm_valid FILE] [--lm_minutes M]
       [--lm_weight W] [--lm_args \"...\"] [--lm_decode_args \"...\"] [--unlabelled \"PATH ...\"]
       [--self_training_rounds N] [--pseudo_label_args \"...\"] [--jobs N] [--nproc_per_node N]
       [--torchrun_args \"...\"]
       [-- train.py overrides]"
. local/parse_options.sh
. local/launch_training.sh
. local/shard_paths.sh
# On a CPU shared with other jobs, run with OMP_WAIT_POLICY=PASSIVE (or GOMP_SPINCOUNT=1000): the
# spinning OpenMP threads of two processes starve each other (a demo training step measured 3 instead
# of 135 audio-s/s beside another training job). Alone, spinning is ~2x faster, hence not the default.

# split_name PATH: a short name for a corpus, from its file or folder name.
split_name() { local base; base=$(basename "$1"); echo "${base%.*}"; }

if [ -z "$train" ]; then
  train=$data/corpus/train.jsonl; valid=$data/corpus/dev.jsonl; test=$data/corpus/test.jsonl
  demo=true; [ -n "$config" ] || config=hparams/demo.yaml
else
  demo=false; [ -n "$config" ] || config=hparams/small.yaml
  [ -n "$valid" ] || { echo "Error: --valid is required with --train" >&2; exit 2; }
  [ -n "$test" ] || { echo "Error: --test is required with --train" >&2; exit 2; }
fi
if [ -n "$lm_text" ] && [ -z "$lm_valid" ]; then
  case "$valid" in
    *.jsonl|*.txt) lm_valid=$valid ;;
    *) echo "Error: --lm_text needs held-out text: give --lm_valid FILE (.txt or .jsonl; --valid $valid is neither)" >&2
       exit 2 ;;
  esac
fi
declare -A corpora=([train]=$train [valid]=$valid)
for path in $test; do corpora[$(split_name "$path")]=$path; done

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  splits=()
  for name in "${!corpora[@]}"; do splits+=("$name=${corpora[$name]}"); done
  bash local/prepare_speech.sh --data "$data" --demo "$demo" --jobs "$jobs" -- "${splits[@]}"
fi

[ -f "$config" ] || config=recipes/finetune/$config
[ -f "$config" ] || { echo "Error: no config $config" >&2; echo "$usage" >&2; exit 2; }
[ -n "$exp" ] || exp=exp/finetune_$(split_name "$config")
text_field=$($python local/config_value.py "$config" text_field)
prefix_tokens=$($python local/config_value.py "$config" prefix_tokens)
tokenizer_dir=$data/tokenizer
[ "$text_field" = text ] || tokenizer_dir=$data/tokenizer_$text_field
[ -n "$token_type" ] || token_type=$($python local/config_value.py "$config" token_type)
[ -n "$vocab_size" ] || vocab_size=$($python local/config_value.py "$config" token_count)
if [ "$token_type" = char ]; then  # every character of the text: the size is the text's
  tokenizer=$tokenizer_dir/char.model; size_args=()
else
  tokenizer=$tokenizer_dir/${token_type}_${vocab_size}.model; size_args=(--vocab-size "$vocab_size")
fi
[ -z "$pretrained" ] || tokenizer=$pretrained/tokenizer.model  # token ids must match the weights
if [ -n "$pretrained" ] && [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  log "Stage 1: tokenizer: the pretrained one, $tokenizer"
  [ -f "$tokenizer" ] || { echo "Error: $tokenizer not found: run recipes/pretrain/run.sh first" >&2; exit 2; }
elif [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  log "Stage 1: tokenizer: $(shard_dir train "$train") ($text_field) -> $tokenizer"
  $python local/train_tokenizer.py "$(shard_dir train "$train")" "$tokenizer_dir" \
    "${size_args[@]}" --model-type "$token_type" --text-field "$text_field" \
    --user-symbols "$prefix_tokens"
fi

test_parquets=""
for path in $test; do
  test_parquets+="${test_parquets:+, }$(pool_parquet "$(shard_dir "$(split_name "$path")" "$path")")"
done
train_args=("$config" "--output_folder=$exp" "--tokenizer_file=$tokenizer"
  "--train_parquet=$(pool_parquet "$(shard_dir train "$train")")"
  "--valid_parquet=$(pool_parquet "$(shard_dir valid "$valid")")" "--test_parquets=[$test_parquets]")
[ -z "$pretrained" ] || train_args+=("--pretrained=$pretrained")
lm_exp=${exp}_lm
decode_args=()
# shellcheck disable=SC2206  # lm_decode_args: several overrides
[ -z "$lm_text" ] || decode_args=("--lm_dir=$lm_exp" "--lm_weight=$lm_weight" $lm_decode_args)

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  log "Stage 2: train: $(shard_dir train "$train") + $(shard_dir valid "$valid") -> $exp"
  launch_training recipes/finetune/train.py "${train_args[@]}" --do_test=False "${passthrough[@]}"
  if [ -n "$lm_text" ]; then
    log "Stage 2: language model: $lm_text (valid $lm_valid, $lm_minutes min) -> $lm_exp"
    # shellcheck disable=SC2086  # lm_args: several overrides
    bash recipes/lm/run.sh --tokenizer "$tokenizer" --data "$data" --text "$lm_text" --valid "$lm_valid" \
      --exp "$lm_exp" --nproc_per_node "$nproc_per_node" --torchrun_args "$torchrun_args" \
      -- "--train_minutes=$lm_minutes" $lm_args
  fi
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  log "Stage 3: decode + score: $test_parquets${lm_text:+ with the LM $lm_exp (weight $lm_weight)} -> $exp/results.json"
  launch_training recipes/finetune/train.py "${train_args[@]}" --do_train=False "${decode_args[@]}" \
    "${passthrough[@]}"  # ranks split it
  $python local/results_table.py "$exp/results.json"
  log "Learning curves (loss per term, validation WER / CER, learning rate per epoch): $exp/curves.png"
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ] && [ -n "$unlabelled" ]; then
  pools=()
  for path in $unlabelled; do
    out=$(shard_dir "unlabelled_$(split_name "$path")" "$path")
    if [ "$out" != "$path" ]; then  # its transcripts, if any, are dropped: self-training must not read them
      log "Stage 4: data: shard untranscribed $path -> $out"
      $python local/make_shards.py "$path" "$out" --jobs "$jobs" --prefix "$(split_name "$path")" --shard-size 64 \
        --unlabelled
    fi
    pools+=("$out")
  done
  held_out=()
  for path in $test; do held_out+=("$(shard_dir "$(split_name "$path")" "$path")"); done
  labeller=$exp
  for round in $(seq 1 "$self_training_rounds"); do
    round_exp=${exp}_st$round
    log "Stage 4: self-training round $round: $labeller${lm_text:+ + LM $lm_exp} labels ${pools[*]} -> $round_exp/pseudo_labels"
    lm_options=()
    # shellcheck disable=SC2206  # lm_decode_args: several options (pseudo_label.py reads them too)
    [ -z "$lm_text" ] || lm_options=(--lm_dir "$lm_exp" --lm_weight "$lm_weight" $lm_decode_args)
    # shellcheck disable=SC2086  # pseudo_label_args: several options
    $python recipes/finetune/pseudo_label.py "$labeller" --unlabelled "${pools[@]}" \
      --valid "$(shard_dir valid "$valid")" --held_out "${held_out[@]}" --output "$round_exp/pseudo_labels" \
      --tokenizer "$tokenizer" "${lm_options[@]}" $pseudo_label_args
    log "Stage 4: train on labelled + pseudo-labelled, from $labeller -> $round_exp"
    round_args=("${train_args[@]}" "--output_folder=$round_exp" "--pretrained=$round_exp/pseudo_labels/model"
      "--train_parquet=[$(pool_parquet "$(shard_dir train "$train")"), $(pool_parquet "$round_exp/pseudo_labels")]")
    launch_training recipes/finetune/train.py "${round_args[@]}" --do_test=False "${passthrough[@]}"
    log "Stage 4: decode + score round $round -> $round_exp/results.json"
    launch_training recipes/finetune/train.py "${round_args[@]}" --do_train=False "${decode_args[@]}" \
      "${passthrough[@]}"
    $python local/results_table.py "$exp/results.json" "$round_exp/results.json"
    labeller=$round_exp
  done
fi
