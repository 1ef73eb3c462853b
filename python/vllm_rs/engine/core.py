"""The engine core without its sockets: requests in, one scheduling step at a
time, outputs and stats out, and the utility methods frontends may call, with
vLLM 0.33's names, signatures and results."""

from __future__ import annotations

import enum
import os
import time
from typing import Any

from vllm_rs.engine.config import EngineConfig
from vllm_rs.engine.kv_cache.block_pool import BlockPool
from vllm_rs.engine.kv_cache.kv_cache_manager import KVCacheGroup, KVCacheManager
from vllm_rs.engine.layers.rope_frequencies import long_rope_after
from vllm_rs.engine.model_loader.pooler_config import SUPPORTED_TASKS
from vllm_rs.engine.pooling_params import PoolingParams, tensor_wire
from vllm_rs.engine.protocol import (
    VLLM_PROTOCOL_VERSION,
    EngineCoreOutput,
    EngineCoreRequest,
    FinishReason,
    ReadyResponse,
    RequestError,
)
from vllm_rs.engine.sample.structured_output import GrammarMatcher, compile_grammar, grammar_vocabulary
from vllm_rs.engine.sched.request import InvalidRequestError, Request, SamplingParams
from vllm_rs.engine.sched.scheduler import Scheduler
from vllm_rs.engine.stats import PrefillStats, SchedulerIterationDetails, SchedulerStats
from vllm_rs.engine.step_log import StepLog
from vllm_rs.logger import init_logger

logger = init_logger(__name__)

#: Fault injection for tests: the engine fails in step N (counting from 1).
FAIL_AT_STEP_ENV = "VLLM_RS_ENGINE_FAIL_AT_STEP"


class UnknownUtilityError(ValueError):
    """A UTILITY call names a method the engine does not have."""


class InjectedEngineFailure(RuntimeError):
    """The failure asked for with `VLLM_RS_ENGINE_FAIL_AT_STEP`."""


#: vLLM's pause modes: abort what runs, let it finish, or freeze it.
PAUSE_MODES = ("abort", "wait", "keep")


class PauseState(enum.Enum):
    """vLLM's scheduler pause states."""

    UNPAUSED = "unpaused"
    #: No new request starts; running ones continue.
    PAUSED_NEW = "paused_new"
    #: Nothing is stepped.
    PAUSED_ALL = "paused_all"


class WhenIdle:
    """Returned by a utility method whose reply (None) waits until no request
    runs: vLLM answers `sleep(mode="wait")` once the engine has drained."""


def make_runner(config: EngineConfig) -> Any:
    """The model runner for the configured model type."""
    if config.model_config.runner.is_pooling:
        from vllm_rs.engine.worker.pooling_runner import PoolingRunner

        return PoolingRunner(config)
    if config.model_config.spec.model_type == "echo":
        from vllm_rs.engine.worker.echo_runner import EchoRunner

        return EchoRunner()
    from vllm_rs.engine.worker.model_runner import ModelRunner

    return ModelRunner(config)


class EngineCore:
    """One engine: a model runner driven by a continuous-batching scheduler."""

    def __init__(self, config: EngineConfig, engine_index: int = 0):
        self.config = config
        self.engine_index = engine_index
        self.max_model_len = config.model_config.max_model_len
        self.runner = make_runner(config)
        blocks = self.runner.num_gpu_blocks
        kv_cache_manager = None
        if blocks:
            # Each group holds `blocks` blocks of its own layers: together the cache's budget.
            spec, caching = config.model_config.spec, config.cache_config.enable_prefix_caching
            groups = [
                KVCacheGroup(BlockPool(blocks, caching), window, layers)
                for window, layers in zip(spec.kv_groups, spec.kv_group_layers(), strict=True)
            ]
            kv_cache_manager = KVCacheManager(
                groups, config.cache_config.block_size, self.runner.block_hasher(),
                long_rope_after(spec.transformer) if spec.transformer is not None else None,
            )  # fmt: skip
        self.scheduler = Scheduler(
            config.scheduler_config.max_num_seqs,
            config.scheduler_config.max_num_batched_tokens,
            self.max_model_len,
            kv_cache_manager,
            record_events=config.log_stats,
            whole_prompts=config.model_config.runner.is_pooling,
        )
        self.pause_state = PauseState.UNPAUSED
        self.weight_version = "default"
        self.step_counter = 0
        self.last_iteration: SchedulerIterationDetails | None = None
        #: Outputs made outside a step (aborts of a pause), sent before the reply.
        self.pending_outputs: list[tuple[int, EngineCoreOutput]] = []
        self.totals = {"requests_added": 0, "requests_finished": 0, "requests_aborted": 0, "prompt_tokens_computed": 0,
                       "generation_tokens": 0, "steps": 0}  # fmt: skip
        fail_at = os.environ.get(FAIL_AT_STEP_ENV)
        self._fail_at_step = int(fail_at) if fail_at else None
        #: Per-step timing records, when `VLLM_RS_STEP_LOG` asks for them.
        self._step_log = StepLog.from_env()

    @property
    def num_gpu_blocks(self) -> int:
        """KV blocks (0 for a model without a KV cache)."""
        return self.runner.num_gpu_blocks or 0

    def has_work(self) -> bool:
        """True while a step would do something: requests wait or run, and
        the pause state lets them."""
        if self.pause_state == PauseState.PAUSED_ALL:
            return False
        if self.pause_state == PauseState.PAUSED_NEW:
            return bool(self.scheduler.running)
        return self.scheduler.has_work()

    def ready_response(self) -> ReadyResponse:
        """What this engine registers with: vLLM 0.33's EngineCoreReadyResponse."""
        config = self.config
        block_size = config.cache_config.block_size
        blocks = self.num_gpu_blocks
        parallel = config.parallel_config
        return ReadyResponse(
            max_model_len=self.max_model_len,
            num_gpu_blocks=blocks,
            block_size=block_size,
            dp_stats_address=config.coordinator.front_publish if config.coordinator else None,
            dtype=config.model_config.dtype,
            vllm_version=VLLM_PROTOCOL_VERSION,
            world_size=parallel.tensor_parallel_size * parallel.pipeline_parallel_size,
            data_parallel_size=parallel.data_parallel_size,
            tensor_parallel_size=parallel.tensor_parallel_size,
            pipeline_parallel_size=parallel.pipeline_parallel_size,
            decode_context_parallel_size=1,
            data_parallel_rank=self.engine_index,
            max_num_seqs=config.scheduler_config.max_num_seqs,
            max_num_batched_tokens=config.scheduler_config.max_num_batched_tokens,
            instance_id=f"vllm-rs-{os.getpid()}-{self.engine_index}",
            supports_lora=False,
            max_loras=0,
            # No KV cache (echo): vLLM's attention-free models say None here.
            kv_cache_size_tokens=blocks * block_size if blocks else None,
            kv_cache_max_concurrency=blocks * block_size / self.max_model_len if blocks else None,
            effective_attention_block_size=block_size if blocks else None,
        )

    def take_pending_outputs(self) -> list[tuple[int, EngineCoreOutput]]:
        """Outputs made outside a step, `(client_index, output)`."""
        outputs, self.pending_outputs = self.pending_outputs, []
        return outputs

    def add_request(self, wire: EngineCoreRequest) -> EngineCoreOutput | None:
        """Queues a request; returns an ERROR output (with a `validation_error`
        RequestError, as vLLM) when it cannot run."""
        try:
            pooling = self._pooling_params(wire)
            sampling = SamplingParams.from_wire(wire.sampling_params or {})
            prompt = wire.prompt_token_ids
            vocab = self.config.model_config.spec.vocab_size
            if prompt and (set(map(type, prompt)) != {int} or min(prompt) < 0 or max(prompt) >= vocab):
                raise InvalidRequestError(f"prompt token ids must be integers in [0, {vocab})")
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
                pooling_params=pooling,
            )
            if sampling.structured_outputs is not None:
                if not self.runner.follows_grammars:
                    raise InvalidRequestError(
                        f"the {self.config.model_config.spec.model_type} model cannot follow structured outputs"
                    )
                spec = self.config.model_config.spec
                vocabulary = grammar_vocabulary(spec.tokenizer_dir, spec.vocab_size)
                request.grammar = GrammarMatcher(compile_grammar(sampling.structured_outputs, vocabulary), vocabulary)
            self.scheduler.add(request)
        except InvalidRequestError as e:
            logger.warning("rejecting request %s: %s", wire.request_id, e)
            self.scheduler.note_finished(wire.client_index, wire.request_id)
            return EngineCoreOutput(
                wire.request_id, [], FinishReason.ERROR, error=RequestError("validation_error", str(e))
            )
        self.totals["requests_added"] += 1
        return None

    def _pooling_params(self, wire: EngineCoreRequest) -> PoolingParams | None:
        """A pooling request's checked params; raises InvalidRequestError
        when the request and the model's runner do not match."""
        pools = self.config.model_config.runner.is_pooling
        if wire.pooling_params is None:
            if pools:
                raise InvalidRequestError("This model only supports pooling tasks, not generation")
            return None
        if not pools:
            raise InvalidRequestError("This model does not support pooling tasks (it runs with --runner generate)")
        params = PoolingParams.from_wire(wire.pooling_params)
        self.runner.check(params)
        return params

    def abort_requests(self, request_ids: list[str]) -> int:
        """Aborts these requests; returns how many were in the engine."""
        removed = self.scheduler.abort(request_ids)
        self.totals["requests_aborted"] += len(removed)
        return len(removed)

    def step(self) -> list[tuple[int, EngineCoreOutput]]:
        """Schedules and runs one step; returns `(client_index, output)` for
        every request that produced a token."""
        mark = self._step_log.mark() if self._step_log is not None else None
        plan = self.scheduler.schedule(admit=self.pause_state == PauseState.UNPAUSED)
        if not plan.requests:
            if plan.finished_req_ids:
                self.runner.execute(plan)  # computes nothing: the runner forgets the finished
            return []
        self.step_counter += 1
        if self._fail_at_step is not None and self.step_counter >= self._fail_at_step:
            raise InjectedEngineFailure(f"{FAIL_AT_STEP_ENV}={self._fail_at_step}: failing in step {self.step_counter}")
        details = self.runner.iteration_details(plan)
        started = time.monotonic()
        self.totals["prompt_tokens_computed"] += sum(
            max(
                0,
                min(r.num_computed_tokens + plan.num_scheduled_tokens[r.request_id], r.num_prompt_tokens)
                - r.num_computed_tokens,
            )
            for r in plan.requests
        )
        model_output = self.runner.execute(plan)
        if details is not None:
            self.last_iteration = SchedulerIterationDetails(
                iteration_index=self.step_counter - 1,
                num_ctx_requests=details.num_ctx_requests,
                num_ctx_tokens=details.num_ctx_tokens,
                num_generation_requests=details.num_generation_requests,
                num_generation_tokens=details.num_generation_tokens,
                elapsed_ms=(time.monotonic() - started) * 1000,
                num_encoder_inputs=details.num_encoder_inputs,
                num_encoder_output_tokens=details.num_encoder_output_tokens,
            )
        if model_output.prompt_logprobs:
            for request in plan.requests:
                rows = model_output.prompt_logprobs.get(request.request_id)
                # A preempted request computes its prompt again: its logprobs went out already.
                if rows is not None and not request.output_token_ids:
                    request.pending_prompt_logprobs.append(rows)
        advanced = self.scheduler.update(plan, model_output.sampled)
        if model_output.pooled:
            return self._pooled_outputs(plan, model_output.pooled, mark)
        for request in advanced:
            if request.grammar is not None:
                request.grammar.accept(request.output_token_ids[-1])
        self.totals["steps"] += 1
        self.totals["generation_tokens"] += len(advanced)
        outputs = []
        for request in advanced:
            if request.finish_reason is not None:
                self.totals["requests_finished"] += 1
            output = EngineCoreOutput(
                request.request_id,
                [request.output_token_ids[-1]],
                request.finish_reason,
                request.stop_reason,
                events=request.take_events(),
                new_logprobs=model_output.logprobs.get(request.request_id),
                new_prompt_logprobs=request.take_prompt_logprobs(),
                prefill_stats=None if request.sent_prefill_stats else self._take_prefill_stats(request),
            )
            outputs.append((request.client_index, output))
        if mark is not None:
            self._step_log.record(mark, len(plan.requests), plan.total_num_scheduled_tokens)
        return outputs

    def _pooled_outputs(self, plan: Any, pooled: dict[str, Any], mark: Any) -> list[tuple[int, EngineCoreOutput]]:
        """The one output of each pooled request (its vector, finished)."""
        done = [r for r in plan.requests if r.request_id in pooled]
        self.scheduler.finish_pooled(done)
        self.totals["steps"] += 1
        self.totals["requests_finished"] += len(done)
        outputs = [
            (r.client_index, EngineCoreOutput(
                r.request_id, [], FinishReason.STOP, events=r.take_events(),
                prefill_stats=self._take_prefill_stats(r), pooling_output=tensor_wire(pooled[r.request_id]),
            ))
            for r in done
        ]  # fmt: skip
        if mark is not None:
            self._step_log.record(mark, len(plan.requests), plan.total_num_scheduled_tokens)
        return outputs

    def _take_prefill_stats(self, request: Request) -> PrefillStats:
        """The request's `PrefillStats`, sent with its first output only (as
        vLLM sends them: whatever preemptions came between, they describe its
        first prefill)."""
        request.sent_prefill_stats = True
        in_cache = len(request.block_hashes) * self.config.cache_config.block_size
        return PrefillStats.of(request.num_prompt_tokens, request.num_cached_tokens, in_cache)

    def take_finished(self, client_index: int) -> list[str]:
        """Ids of `client_index`'s requests that finished (any reason,
        aborts included) since the last call: `finished_requests`."""
        return self.scheduler.take_finished(client_index)

    def scheduler_stats(self) -> SchedulerStats:
        """vLLM's SchedulerStats for now: counts, KV usage, the last step's
        details, and the prefix-cache lookups since the previous call."""
        kv = self.scheduler.kv_cache_manager
        iteration, self.last_iteration = self.last_iteration, None
        return SchedulerStats(
            num_running_reqs=self.scheduler.num_running,
            num_waiting_reqs=self.scheduler.num_waiting,
            step_counter=self.step_counter,
            kv_cache_usage=kv.usage if kv else 0.0,
            iteration_details=iteration,
            prefix_cache_stats=self.scheduler.take_prefix_cache_stats(),
        )

    # ---- utility methods (UTILITY calls), with vLLM 0.33's signatures ----

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
            "pause_scheduler": self.pause_scheduler,
            "resume_scheduler": self.resume_scheduler,
            "is_scheduler_paused": self.is_scheduler_paused,
            "get_supported_tasks": self.get_supported_tasks,
            "list_loras": self.list_loras,
            "get_weight_version": self.get_weight_version,
            "set_weight_version": self.set_weight_version,
        }

    def get_stats(self) -> dict[str, Any]:
        """This project's extension: cumulative counters, the prefix-cache
        totals (in blocks) and the current counts."""
        kv = self.scheduler.kv_cache_manager
        pool = kv.block_pool if kv else None
        return {
            "engine_index": self.engine_index,
            "model": self.config.model_config.model,
            "device": str(self.runner.device),
            "max_model_len": self.max_model_len,
            "num_gpu_blocks": self.num_gpu_blocks,
            "timestamp": time.time(),
            **self.totals,
            "prefix_cache_block_queries": pool.queries if pool else 0,
            "prefix_cache_block_hits": pool.hits if pool else 0,
            "num_preemptions": self.scheduler.num_preemptions,
            "num_running_reqs": self.scheduler.num_running,
            "num_waiting_reqs": self.scheduler.num_waiting,
            "is_sleeping": self.is_sleeping(),
        }

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        """Forgets the prefix cache (there is no connector; running requests
        keep their blocks either way: the cache forgets them, and they are
        not shared from then on)."""
        return self.scheduler.reset_prefix_cache()

    def pause_scheduler(self, mode: str = "abort", clear_cache: bool = True) -> WhenIdle | None:
        """Pauses generation as vLLM does: `abort` aborts every request
        (ABORT outputs) and starts nothing new, `wait` lets the running ones
        finish and answers then, `keep` freezes everything. New requests
        queue until `resume_scheduler`/`wake_up`."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"Invalid pause mode: {mode}")
        if mode == "abort":
            for request in self.scheduler.abort(list(self.scheduler.requests)):
                self.totals["requests_aborted"] += 1
                self.pending_outputs.append(
                    (request.client_index, EngineCoreOutput(request.request_id, [], FinishReason.ABORT))
                )
        self.pause_state = PauseState.PAUSED_ALL if mode == "keep" else PauseState.PAUSED_NEW
        if clear_cache:
            self.scheduler.reset_prefix_cache()
        return WhenIdle() if mode == "wait" and self.scheduler.running else None

    def resume_scheduler(self) -> None:
        """Resumes scheduling; queued requests start."""
        self.pause_state = PauseState.UNPAUSED

    def is_scheduler_paused(self) -> bool:
        """Whether the scheduler is in any pause state."""
        return self.pause_state != PauseState.UNPAUSED

    def sleep(self, level: int = 1, mode: str = "abort") -> WhenIdle | None:
        """vLLM's `sleep(level, mode)`: pauses (see `pause_scheduler`), and at
        level 1 or more drops the prefix cache. The reference engine keeps
        its weights and KV cache where they are."""
        if isinstance(level, bool) or not isinstance(level, int) or level < 0:
            raise ValueError(f"sleep level must be a non-negative integer, got {level!r}")
        return self.pause_scheduler(mode=mode, clear_cache=level >= 1)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """Resumes scheduling; True: everything is resident again."""
        if tags is not None and (not isinstance(tags, list) or not all(isinstance(t, str) for t in tags)):
            raise ValueError(f"wake_up tags must be a list of strings, got {tags!r}")
        self.resume_scheduler()
        return True

    def is_sleeping(self) -> bool:
        """Whether the engine is paused or asleep."""
        return self.is_scheduler_paused()

    def get_supported_tasks(self) -> list[str]:
        """The tasks this engine runs (vLLM returns a tuple; msgpack sends an array)."""
        runner = self.config.model_config.runner
        return list(SUPPORTED_TASKS[runner.task]) if runner.is_pooling else ["generate"]

    def list_loras(self) -> list[int]:
        """LoRA adapters loaded: none (vLLM returns a set; msgpack sends an array)."""
        return []

    def get_weight_version(self) -> str:
        """The weight version (vLLM's default: `"default"`)."""
        return self.weight_version

    def set_weight_version(self, weight_version: str) -> None:
        """Sets the weight version label."""
        if not isinstance(weight_version, str):
            raise ValueError(f"weight_version must be a string, got {weight_version!r}")
        self.weight_version = weight_version
