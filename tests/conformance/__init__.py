"""The conformance suite: what the HTTP surface does (vLLM 0.33's routes and
shapes), asserted against the frontend (`vllm-rs frontend`) as
`python -m vllm_rs serve` starts it."""
