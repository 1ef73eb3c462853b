"""The scheduler statistics an engine sends with its outputs, shaped exactly
like vLLM 0.33's `SchedulerStats` (every field, in vLLM's order and types),
which vLLM's frontend decodes strictly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since the last report, in tokens (vLLM's
    `PrefixCacheStats`): `requests` new requests looked up, `queries` their
    prompt tokens, `hits` the tokens found cached; `reset` when the cache was
    reset meanwhile."""

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    hits_by_source: dict[str, int] = field(default_factory=dict)

    def record(self, num_tokens: int, num_hits: int) -> None:
        """Counts one new request's lookup."""
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits

    def record_preempted(self, num_tokens: int, num_hits: int) -> None:
        """Counts the lookup of a preempted request admitted again (vLLM
        keeps these apart, so that recomputation does not inflate hits)."""
        self.preempted_requests += 1
        self.preempted_queries += num_tokens
        self.preempted_hits += num_hits


@dataclass
class PrefillStats:
    """How a request's prompt was filled (vLLM's `PrefillStats`), sent with
    its first token: `num_computed_tokens` computed here,
    `num_cached_tokens` not (`num_local_cached_tokens` found in the prefix
    cache plus `num_external_cached_tokens` received from a KV connector,
    which this engine has not), and `num_cache_creation_tokens` computed and
    written to the prefix cache."""

    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_local_cached_tokens: int = 0
    num_external_cached_tokens: int = 0
    num_cache_creation_tokens: int = 0

    @classmethod
    def of(cls, num_prompt_tokens: int, num_cached_tokens: int, num_tokens_in_cache: int) -> PrefillStats:
        """The stats of a prompt of which `num_cached_tokens` were found in
        the local prefix cache, and whose first `num_tokens_in_cache` tokens
        are in the prefix cache now."""
        created = max(0, min(num_tokens_in_cache, num_prompt_tokens) - num_cached_tokens)
        computed = num_prompt_tokens - num_cached_tokens
        return cls(num_prompt_tokens, computed, num_cached_tokens, num_cached_tokens, 0, created)

    def to_wire(self) -> dict[str, int]:
        """A map of every field in order, as msgspec encodes vLLM's dataclass."""
        return dict(self.__dict__)


@dataclass
class SchedulerIterationDetails:
    """What one step computed (vLLM's `SchedulerIterationDetails`)."""

    iteration_index: int
    num_ctx_requests: int
    num_ctx_tokens: int
    num_generation_requests: int
    num_generation_tokens: int
    elapsed_ms: float
    num_encoder_inputs: int = 0
    num_encoder_output_tokens: int = 0
    is_dummy: bool = False


@dataclass
class SchedulerStats:
    """vLLM's `SchedulerStats`; the frontends' balancers read the first two."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    num_kv_fetch_reqs_by_stage: dict[str, int] = field(default_factory=dict)
    step_counter: int = 0
    current_wave: int = 0
    kv_cache_usage: float = 0.0
    iteration_details: SchedulerIterationDetails | None = None
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    connector_prefix_cache_stats: PrefixCacheStats | None = None
    kv_cache_eviction_events: list[Any] = field(default_factory=list)
    spec_decoding_stats: None = None
    kv_connector_stats: dict[str, Any] | None = None
    ec_connector_stats: dict[str, Any] | None = None
    waiting_lora_adapters: dict[str, int] = field(default_factory=dict)
    running_lora_adapters: dict[str, int] = field(default_factory=dict)
    cudagraph_stats: None = None
    perf_stats: None = None

    def to_wire(self) -> dict[str, Any]:
        """The msgpack map: every field in order, nested dataclasses as maps,
        as msgspec encodes vLLM's dataclass. (Built from the instances'
        dicts, which hold the fields in order: `asdict` costs as much as an
        echo step.)"""
        wire = dict(self.__dict__)
        for key in ("iteration_details", "prefix_cache_stats", "connector_prefix_cache_stats"):
            if wire[key] is not None:
                wire[key] = dict(wire[key].__dict__)
        return wire
