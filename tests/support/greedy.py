"""Greedy generation in the engine core, as the weight-format tests run it:
every prompt in flight together, EOS ignored, and the log-probabilities of
each sampled row recorded (the sampler's input, log-softmaxed in float64)."""

from __future__ import annotations

import torch
from vllm_rs.engine.core import EngineCore
from vllm_rs.engine.protocol import EngineCoreRequest


def greedy_with_rows(
    core: EngineCore, prompts: list[list[int]], max_tokens: int
) -> tuple[dict[str, list[int]], dict[str, list[torch.Tensor]]]:
    """Request `r{i}` for prompt i: its greedy tokens and the
    log-probabilities of every row sampled for it."""
    rows: dict[str, list[torch.Tensor]] = {}
    sample = core.runner.sampler.sample

    def recording_sample(logits, requests):
        for row, request in zip(logits, requests, strict=True):
            rows.setdefault(request.request_id, []).append(torch.log_softmax(torch.from_numpy(row).double(), -1))
        return sample(logits, requests)

    core.runner.sampler.sample = recording_sample
    for i, prompt in enumerate(prompts):
        params = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}
        core.add_request(EngineCoreRequest(f"r{i}", prompt, params))
    tokens: dict[str, list[int]] = {}
    while core.has_work():
        for _, output in core.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
    return tokens, rows


def run_to_completion(core: EngineCore) -> dict[str, list[int]]:
    """Steps `core` until it has no work; each request's new tokens."""
    outputs: dict[str, list[int]] = {}
    while core.has_work():
        for _, output in core.step():
            outputs.setdefault(output.request_id, []).extend(output.new_token_ids)
    return outputs
