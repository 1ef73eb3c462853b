"""The conformance suite: what the HTTP surface does (vLLM 0.33's routes and
shapes), asserted once and run against both frontends (the Rust `vllm-rs
frontend` and the Python API servers) as `python -m vllm_rs serve` starts
them."""
