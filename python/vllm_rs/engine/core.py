"""The engine core without its sockets: requests in, one scheduling step at a
time, outputs and stats out, and the utility methods frontends may call."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any

from vllm_rs.engine.block_pool import BlockPool
from vllm_rs.engine.config import EngineConfig
from vllm_rs.engine.models import BYTE_VOCAB_SIZE
from vllm_rs.engine.protocol import EngineCoreOutput, EngineCoreRequest, FinishReason
from vllm_rs.engine.request import InvalidRequestError, Request, SamplingParams
from vllm_rs.engine.scheduler import Scheduler
from vllm_rs.logger import init_logger

logger = init_logger(__name__)

#: Fault injection for tests: the engine fails in step N (counting from 1).
FAIL_AT_STEP_ENV = "VLLM_RS_ENGINE_FAIL_AT_STEP"


class UnknownUtilityError(ValueError):
    """A UTILITY call names a method the engine does not have."""


class InjectedEngineFailure(RuntimeError):
    """The failure asked for with `VLLM_RS_ENGINE_FAIL_AT_STEP`."""


def make_runner(config: EngineConfig) -> Any:
    """The model runner for the configured model type."""
    if config.model_config.spec.model_type == "echo":
        from vllm_rs.engine.echo_runner import EchoRunner

        return EchoRunner()
    from vllm_rs.engine.toy_runner import ToyModelRunner

    return ToyModelRunner(config)


class EngineCore:
    """One engine: a model runner driven by a continuous-batching scheduler."""

    def __init__(self, config: EngineConfig, engine_index: int = 0):
        self.config = config
        self.engine_index = engine_index
        self.max_model_len = config.model_config.max_model_len
        self.runner = make_runner(config)
        blocks = self.runner.num_gpu_blocks
        pool = BlockPool(blocks, config.cache_config.enable_prefix_caching) if blocks else None
        self.scheduler = Scheduler(
            config.scheduler_config.max_num_seqs,
            config.scheduler_config.max_num_batched_tokens,
            self.max_model_len,
            pool,
            config.cache_config.block_size,
            self.runner.block_hasher(),
        )
        self.sleeping = False
        self.step_counter = 0
        self.last_iteration: dict[str, int] | None = None
        self.totals = {"requests_added": 0, "requests_finished": 0, "requests_aborted": 0, "prompt_tokens_computed": 0,
                       "generation_tokens": 0, "steps": 0}  # fmt: skip
        fail_at = os.environ.get(FAIL_AT_STEP_ENV)
        self._fail_at_step = int(fail_at) if fail_at else None

    @property
    def num_gpu_blocks(self) -> int:
        """KV blocks (0 for a model without a KV cache)."""
        return self.runner.num_gpu_blocks or 0

    def has_work(self) -> bool:
        """True while requests are waiting or running."""
        return self.scheduler.has_work()

    def add_request(self, wire: EngineCoreRequest) -> EngineCoreOutput | None:
        """Queues a request; returns an ERROR output when it cannot run."""
        try:
            sampling = SamplingParams.from_wire(wire.sampling_params)
            prompt = wire.prompt_token_ids
            if prompt and (set(map(type, prompt)) != {int} or min(prompt) < 0 or max(prompt) >= BYTE_VOCAB_SIZE):
                raise InvalidRequestError(f"prompt token ids must be integers in [0, {BYTE_VOCAB_SIZE})")
            room = self.max_model_len - len(prompt)
            max_tokens = min(sampling.max_tokens, room) if sampling.max_tokens is not None else room
            request = Request(
                request_id=wire.request_id,
                prompt_token_ids=list(prompt),
                sampling=sampling,
                max_tokens=max(max_tokens, 1),
                client_index=wire.client_index,
                arrival_time=wire.arrival_time,
                cache_salt=wire.cache_salt,
            )
            self.scheduler.add(request)
        except InvalidRequestError as e:
            logger.warning("rejecting request %s: %s", wire.request_id, e)
            return EngineCoreOutput(wire.request_id, [], FinishReason.ERROR, str(e))
        self.totals["requests_added"] += 1
        return None

    def abort_requests(self, request_ids: list[str]) -> int:
        """Aborts these requests; returns how many were in the engine."""
        removed = self.scheduler.abort(request_ids)
        self.totals["requests_aborted"] += len(removed)
        return len(removed)

    def step(self) -> list[tuple[int, EngineCoreOutput]]:
        """Schedules and runs one step; returns `(client_index, output)` for
        every request that produced a token."""
        plan = self.scheduler.schedule()
        if not plan.requests:
            return []
        self.step_counter += 1
        if self._fail_at_step is not None and self.step_counter >= self._fail_at_step:
            raise InjectedEngineFailure(f"{FAIL_AT_STEP_ENV}={self._fail_at_step}: failing in step {self.step_counter}")
        details = self.runner.iteration_details(plan)
        self.last_iteration = None if details is None else asdict(details)
        self.totals["prompt_tokens_computed"] += sum(
            max(0, min(r.num_computed_tokens + plan.num_scheduled_tokens[r.request_id], r.num_prompt_tokens) - r.num_computed_tokens)
            for r in plan.requests
        )
        sampled = self.runner.execute(plan)
        advanced = self.scheduler.update(plan, sampled)
        self.totals["steps"] += 1
        self.totals["generation_tokens"] += len(advanced)
        outputs = []
        for request in advanced:
            if request.finish_reason is not None:
                self.totals["requests_finished"] += 1
            output = EngineCoreOutput(request.request_id, [request.output_token_ids[-1]], request.finish_reason, request.stop_reason)
            outputs.append((request.client_index, output))
        return outputs

    def scheduler_stats(self) -> dict[str, Any]:
        """The stats sent with outputs (the balancer reads the first two)."""
        pool = self.scheduler.block_pool
        stats: dict[str, Any] = {
            "num_running_reqs": self.scheduler.num_running,
            "num_waiting_reqs": self.scheduler.num_waiting,
            "kv_cache_usage": pool.usage if pool else 0.0,
            "step_counter": self.step_counter,
            "current_wave": 0,
        }
        if pool is not None:
            stats["prefix_cache_stats"] = {"queries": pool.queries, "hits": pool.hits}
        if self.last_iteration is not None:
            stats["iteration"] = self.last_iteration
        return stats

    # ---- utility methods (UTILITY calls) ----

    def call_utility(self, method: str, args: list[Any]) -> Any:
        """Runs a utility method by name; raises UnknownUtilityError."""
        handler = self._utilities().get(method)
        if handler is None:
            raise UnknownUtilityError(f"engine core has no utility method {method!r}")
        return handler(*args)

    def _utilities(self) -> dict[str, Any]:
        return {
            "get_stats": self.get_stats,
            "reset_prefix_cache": self.reset_prefix_cache,
            "sleep": self.sleep,
            "wake_up": self.wake_up,
            "is_sleeping": self.is_sleeping,
            "get_supported_tasks": lambda: ["generate"],
            "list_loras": lambda: [],
        }

    def get_stats(self) -> dict[str, Any]:
        """Cumulative counters plus the current scheduler stats."""
        return {
            "engine_index": self.engine_index,
            "model": self.config.model_config.model,
            "device": str(self.runner.device),
            "max_model_len": self.max_model_len,
            "num_gpu_blocks": self.num_gpu_blocks,
            "timestamp": time.time(),
            **self.totals,
            "scheduler": self.scheduler_stats(),
        }

    def reset_prefix_cache(self, *_: Any) -> bool:
        """Forgets the prefix cache."""
        return self.scheduler.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Accepted and answered; the reference engine frees nothing."""
        self.sleeping = True

    def wake_up(self, tags: Any = None) -> None:
        """Accepted and answered."""
        self.sleeping = False

    def is_sleeping(self) -> bool:
        """Whether `sleep` was called last."""
        return self.sleeping
