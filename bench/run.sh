#!/usr/bin/env bash
# Runs every benchmark (bench/bench_*.py) with the project's venv; each prints
# ratios against baselines measured in the same run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VLLM_RS_VENV:-${VLLM_RS_CACHE:-$HOME/.cache/vllm-rs}/venv}
for bench in "$root"/bench/bench_*.py; do
  echo "##### $(basename "$bench")"
  "$venv/bin/python" "$bench"
done
