"""tests/compat: this project against vLLM 0.33's own classes. Every module
here skips, saying why, unless `vllm` is importable (see README.md)."""
