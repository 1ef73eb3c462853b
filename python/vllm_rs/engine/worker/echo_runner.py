"""The `echo` model: no weights, no KV cache, no torch. Each step gives every
request whose known tokens are all "computed" its next token at once: the
prompt repeated, byte after byte (`prompt[i % len(prompt)]` for output i).
Deterministic, so tests and benchmarks know what comes back, logprobs
included (`logprobs.echo_rows`: every scored token has logprob -ln 2, rank 1)."""

from __future__ import annotations

from vllm_rs.engine.model_loader.registry import BYTE_VOCAB_SIZE
from vllm_rs.engine.sample.logprobs import echo_rows, num_columns
from vllm_rs.engine.sched.output import ModelOutput, StepPlan


class EchoRunner:
    """Answers without a model."""

    #: The echo model keeps no KV cache.
    num_gpu_blocks: int | None = None
    #: It repeats the prompt whatever a grammar says, so it refuses structured outputs.
    follows_grammars = False
    device = "cpu"

    def execute(self, plan: StepPlan) -> ModelOutput:
        """The next token of each request that finished its known tokens,
        with the logprobs its request asked for."""
        out = ModelOutput()
        for request in plan.requests:
            start = request.num_computed_tokens
            end = start + plan.num_scheduled_tokens[request.request_id]
            params = request.sampling
            if params.prompt_logprobs is not None and start < request.num_prompt_tokens:
                # Position p scores prompt token p + 1: the first prompt token has none.
                targets = request.prompt_token_ids[start + 1 : min(end + 1, request.num_prompt_tokens)]
                if targets:
                    k = num_columns(params.prompt_logprobs, BYTE_VOCAB_SIZE)
                    out.prompt_logprobs[request.request_id] = echo_rows(targets, k, BYTE_VOCAB_SIZE)
            if end == request.num_tokens:
                prompt = request.prompt_token_ids
                token = prompt[len(request.output_token_ids) % len(prompt)]
                out.sampled[request.request_id] = token
                if params.logprobs is not None:
                    k = num_columns(params.logprobs, BYTE_VOCAB_SIZE)
                    out.logprobs[request.request_id] = echo_rows([token], k, BYTE_VOCAB_SIZE)
        return out

    def iteration_details(self, plan: StepPlan) -> None:
        """The echo model reports no per-step breakdown (keeps torch out)."""
        return None

    def block_hasher(self) -> None:
        """No prefix cache."""
        return None
