"""Conformance tests: the frontends against vLLM 0.33's routes and shapes."""
