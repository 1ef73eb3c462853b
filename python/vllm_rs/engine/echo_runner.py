"""The `echo` model: no weights, no KV cache, no torch. Each step gives every
request whose known tokens are all "computed" its next token at once: the
prompt repeated, byte after byte (`prompt[i % len(prompt)]` for output i).
Deterministic, so tests and benchmarks know what comes back."""

from __future__ import annotations

from vllm_rs.engine.scheduler import StepPlan


class EchoRunner:
    """Answers without a model."""

    #: The echo model keeps no KV cache.
    num_gpu_blocks: int | None = None
    device = "cpu"

    def execute(self, plan: StepPlan) -> dict[str, int]:
        """The next token of each request that finished its known tokens."""
        sampled = {}
        for request in plan.requests:
            if request.num_computed_tokens + plan.num_scheduled_tokens[request.request_id] == request.num_tokens:
                prompt = request.prompt_token_ids
                sampled[request.request_id] = prompt[len(request.output_token_ids) % len(prompt)]
        return sampled

    def iteration_details(self, plan: StepPlan) -> None:
        """The echo model reports no per-step breakdown (keeps torch out)."""
        return None

    def block_hasher(self) -> None:
        """No prefix cache."""
        return None
