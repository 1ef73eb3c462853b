#!/usr/bin/env bash
# Formatting and lint checks, as CI runs them: rustfmt and clippy (warnings are
# errors) over the whole workspace, ruff's linter and formatter over the Python
# tree. Fixes: `cargo fmt --all`, `ruff check --fix .`, `ruff format .`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${VLLM_RS_CACHE:-$HOME/.cache/vllm-rs}
venv=${VLLM_RS_VENV:-$cache/venv}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/target}
cd "$root"

[ -x "$venv/bin/ruff" ] || { echo "ruff is missing from $venv: run scripts/setup.sh first" >&2; exit 1; }
echo "lint: cargo fmt --check"
cargo fmt --all -- --check
echo "lint: cargo clippy (all targets and features, warnings are errors)"
cargo clippy --workspace --all-targets --all-features --quiet -- -D warnings
echo "lint: ruff check"
"$venv/bin/ruff" check .
echo "lint: ruff format --check"
"$venv/bin/ruff" format --check .
echo "lint: no import circles (python/vllm_rs and every Rust crate)"
"$venv/bin/python" scripts/check_import_cycles.py
echo "lint: every pointer into docs/ names a file and section that exist"
"$venv/bin/python" scripts/check_doc_refs.py
