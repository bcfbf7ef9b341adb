#!/usr/bin/env bash
# Shared option parser for run.sh scripts, sourced after the script sets its defaults and `usage`.
#
#   stage=0          # every option is a shell variable with a default, set before sourcing
#   usage="Usage: run.sh [--stage N] ..."
#   . local/parse_options.sh
#
# `--some-option VALUE` or `--some_option=VALUE` sets $some_option, but only if the script declared
# it: an unknown option prints the usage and exits 2. `--help` prints the usage. Everything after
# `--` is left in the array `passthrough` (the recipes hand it to train.py as overrides).
passthrough=()
while [ $# -gt 0 ]; do
  case "$1" in
    --help|-h) echo "$usage"; exit 0 ;;
    --) shift; passthrough=("$@"); break ;;
    --*=*) name="${1%%=*}"; value="${1#*=}"; shift ;;
    --*)
      name="$1"
      if [ $# -lt 2 ]; then echo "Error: option $name needs a value" >&2; echo "$usage" >&2; exit 2; fi
      value="$2"; shift 2 ;;
    *) echo "Error: unexpected argument '$1'" >&2; echo "$usage" >&2; exit 2 ;;
  esac
  name="${name#--}"; name="${name//-/_}"
  if ! declare -p "$name" >/dev/null 2>&1 || [[ ! "$name" =~ ^[a-z][a-z0-9_]*$ ]]; then
    echo "Error: unknown option --${name//_/-}" >&2; echo "$usage" >&2; exit 2
  fi
  printf -v "$name" '%s' "$value"
done
unset name value

# log MESSAGE: a timestamped line on stderr, the form every stage uses.
log() { echo "$(date '+%Y-%m-%d %H:%M:%S') $*" >&2; }
