#!/usr/bin/env bash
# Build everything and run every test suite: Rust (cargo nextest, or cargo test
# where nextest is missing) and Python (pytest). Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${VLLM_RS_CACHE:-$HOME/.cache/vllm-rs}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/target}
venv=$(bash "$root/scripts/setup.sh" | tail -n 1)
cd "$root"

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --release --no-fail-fast
else
  cargo test --workspace --release --no-fail-fast
fi
"$venv/bin/python" -m pytest "$@"
