"""The conformance suite: what the HTTP surface does, asserted once and run
against both frontends (the Rust `vllm-rs frontend` and the Python API
servers) as `python -m vllm_rs serve` starts them."""
