"""tests/compat: this project against vLLM 0.33's own classes. Every module
here skips, saying why, unless `vllm` is importable (see README.md)."""

import os

# vLLM's argument parser infers a device; on a machine without a GPU it can
# only infer the CPU platform when told to.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
