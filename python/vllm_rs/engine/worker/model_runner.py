"""Runs a model for one engine: stages each step's inputs (`StepInputs`),
has an executor compute the logits of every scheduled request (prefill
chunks and decodes together), and samples. The executor is the native one
(`native_executor`: a GGUF on the CPU, no torch imported) where it can run
the model, else the torch one (`torch_executor`: the toy model, safetensors
checkpoints, CUDA, Gemma 3, `--enforce-eager`, ...); this module imports
no torch itself.

What it keeps of each request (the prompt positions scored, the seeded
generator) is its own (`request_state.CachedRequestState`), dropped when a
step's plan says the request finished; the scheduler's requests are only read."""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_rs.engine.config import EngineConfig
from vllm_rs.engine.kv_cache.prefix_hash import hash_block_tokens
from vllm_rs.engine.sample.logprobs import gather, log_softmax, num_columns
from vllm_rs.engine.sample.sampler import Sampler
from vllm_rs.engine.sched.output import ModelOutput, StepPlan
from vllm_rs.engine.sched.request import Request
from vllm_rs.engine.worker.native_executor import NativeExecutor, NativeStepUnsupported
from vllm_rs.engine.worker.request_state import CachedRequestState
from vllm_rs.iteration_details import compute_iteration_details
from vllm_rs.logger import init_logger

logger = init_logger(__name__)


def make_executor(config: EngineConfig) -> Any:
    """The native executor where it runs the model, else the torch one."""
    try:
        return NativeExecutor(config)
    except NativeStepUnsupported as e:
        logger.debug("torch executor: %s", e)
    from vllm_rs.engine.worker.torch_executor import TorchExecutor

    return TorchExecutor(config)


class ModelRunner:
    """A model's executor (with its KV cache), the step staging and the sampler."""

    def __init__(self, config: EngineConfig):
        # Structured outputs mask the logits before sampling; their grammars
        # are compiled for the model's tokenizer (a real model needs one) or
        # the toy model's byte vocabulary.
        spec = config.model_config.spec
        self.follows_grammars = not spec.is_real or spec.tokenizer_dir is not None
        self.executor = make_executor(config)
        #: Where the model runs.
        self.device = self.executor.device
        self.num_gpu_blocks = self.executor.num_gpu_blocks
        self.sampler = Sampler()
        #: The runner's state of each request it has seen and not yet seen finish.
        self.requests: dict[str, CachedRequestState] = {}

    def block_hasher(self):
        """The prefix-cache hash function."""
        return hash_block_tokens

    def iteration_details(self, plan: StepPlan):
        """Context/generation requests and tokens of the step."""
        return compute_iteration_details(plan)

    def execute(self, plan: StepPlan) -> ModelOutput:
        """Runs one step; samples a token for each request that reached the
        end of its known tokens, with the logprobs requests asked for (raw:
        the model's distribution before temperature and the other sampling
        settings, vLLM's default `logprobs_mode`). First forgets the requests
        the plan says finished."""
        for request_id in plan.finished_req_ids:
            self.requests.pop(request_id, None)
        if plan.total_num_scheduled_tokens == 0:
            return ModelOutput()
        staged = self.executor.inputs.stage(plan, self._state)
        logits = self.executor.forward(staged)
        sample_requests, prompt_scores = staged.sample_requests, staged.prompt_scores
        vocab = logits.shape[-1]
        sample_logits = logits[: len(sample_requests)]
        for i, state in enumerate(sample_requests):
            grammar = state.request.grammar
            if grammar is not None:
                # Masked before logprobs too: vLLM applies the grammar bitmask to the logits first.
                sample_logits[i][~grammar.allowed(vocab)] = -np.inf
        wanted = [i for i, r in enumerate(sample_requests) if r.sampling.logprobs is not None]
        raw = log_softmax(sample_logits[wanted]) if wanted else None
        tokens = self.sampler.sample(sample_logits, sample_requests)
        out = ModelOutput({r.request_id: t for r, t in zip(sample_requests, tokens, strict=True)})
        for row, i in enumerate(wanted):
            state = sample_requests[i]
            k = num_columns(state.sampling.logprobs, vocab)
            out.logprobs[state.request_id] = gather(raw[row : row + 1], [tokens[i]], k)
        offset = len(sample_requests)
        for state, targets in prompt_scores:
            rows = log_softmax(logits[offset : offset + len(targets)])
            offset += len(targets)
            k = num_columns(state.sampling.prompt_logprobs, vocab)
            out.prompt_logprobs[state.request_id] = gather(rows, targets, k)
        return out

    def _state(self, request: Request) -> CachedRequestState:
        """The runner's state of `request`, made when it first appears."""
        state = self.requests.get(request.request_id)
        if state is None:
            generator = self.sampler.seeded_generator(request.sampling)
            state = self.requests[request.request_id] = CachedRequestState(request.request_id, request, generator)
        return state
