#!/usr/bin/env bash
# Install the Debian packages named as arguments when they are missing: with apt-get when running as
# root, otherwise print the exact command to run and fail.
set -euo pipefail
missing=()
for package in "$@"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "Installing ${missing[*]} with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "Error: missing system packages: ${missing[*]}. Run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 2
fi
