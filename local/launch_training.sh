#!/usr/bin/env bash
# Sourced by the recipes' run.sh after their options are parsed:
#
#   launch_training recipes/finetune/train.py hparams.yaml --key=value ...
#
# runs a train.py in one process, or under torchrun (SpeechBrain DDP) when the options ask for more:
#   --nproc_per_node N   training processes on this node (one per GPU);
#   --torchrun_args "…"  several nodes, the same command on each, e.g.
#                        "--nnodes=2 --rdzv_backend=c10d --rdzv_endpoint=node0:29500 --rdzv_id=exp1"
#                        (without it, one node: --standalone).
launch_training() {
  if [ "$nproc_per_node" -le 1 ] && [ -z "$torchrun_args" ]; then
    $python "$@"
  else
    # shellcheck disable=SC2086  # torchrun_args holds several options
    $python -m torch.distributed.run ${torchrun_args:---standalone} --nproc_per_node="$nproc_per_node" "$@"
  fi
}
