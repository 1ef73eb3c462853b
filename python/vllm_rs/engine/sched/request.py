"""A request inside the engine: its prompt, sampling parameters, the tokens it
has produced, its KV-cache blocks, and the stop checks vLLM's engine applies."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from vllm_rs.engine.protocol import EngineCoreEvent, EngineCoreEventType, FinishReason
from vllm_rs.engine.sample.logprobs import LogprobsRows

#: Temperatures below this sample greedily.
GREEDY_TEMPERATURE = 1e-5
#: vLLM's `SamplingParams.max_tokens` default. vLLM's encoder leaves out every
#: field equal to its default, so a request without `max_tokens` asks for 16;
#: an explicit nil asks for as many as `max_model_len` leaves room for.
DEFAULT_MAX_TOKENS = 16


class InvalidRequestError(ValueError):
    """A request the engine cannot run (bad ids, too long, bad parameters)."""


@dataclass
class SamplingParams:
    """The sampling parameters an engine reads from the request's map, with
    vLLM 0.33's default for every key left out; keys it does not know are
    ignored."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    min_tokens: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    eos_token_id: int | None = None
    ignore_eos: bool = False
    #: Top tokens to return with each sampled token (-1: the whole vocabulary).
    logprobs: int | None = None
    #: Top tokens to return with each prompt position after the first.
    prompt_logprobs: int | None = None
    #: vLLM's StructuredOutputsParams map (compiled by the engine when the request is added).
    structured_outputs: dict[str, Any] | None = None

    @property
    def is_greedy(self) -> bool:
        """True when sampling is plain argmax."""
        return self.temperature < GREEDY_TEMPERATURE

    @classmethod
    def from_wire(cls, params: dict[str, Any]) -> SamplingParams:
        """Reads the wire map; raises InvalidRequestError for a bad value."""

        def number(key: str, default: float) -> float:
            value = params.get(key)
            if value is None:
                return default
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidRequestError(f"sampling param {key} must be a number, got {value!r}")
            return float(value)

        def integer(key: str, default: int | None) -> int | None:
            value = params.get(key)
            if value is None:
                return default
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidRequestError(f"sampling param {key} must be an integer, got {value!r}")
            return value

        stop_ids = params.get("stop_token_ids") or ()
        if not isinstance(stop_ids, (list, tuple)) or not all(isinstance(t, int) for t in stop_ids):
            raise InvalidRequestError("sampling param stop_token_ids must be a list of integers")
        out = cls(
            temperature=number("temperature", 1.0),
            top_p=number("top_p", 1.0),
            top_k=integer("top_k", 0) or 0,
            min_p=number("min_p", 0.0),
            max_tokens=integer("max_tokens", None) if "max_tokens" in params else DEFAULT_MAX_TOKENS,
            min_tokens=integer("min_tokens", 0) or 0,
            seed=integer("seed", None),
            stop_token_ids=tuple(stop_ids),
            eos_token_id=integer("_eos_token_id", None),
            ignore_eos=bool(params.get("ignore_eos", False)),
            logprobs=integer("logprobs", None),
            prompt_logprobs=integer("prompt_logprobs", None),
            structured_outputs=params.get("structured_outputs"),
        )
        for key in ("logprobs", "prompt_logprobs"):
            if (getattr(out, key) or 0) < -1:
                raise InvalidRequestError(f"sampling param {key} must be -1 or at least 0, got {getattr(out, key)}")
        if out.temperature < 0 or not 0 < out.top_p <= 1 or out.top_k < -1 or not 0 <= out.min_p <= 1:
            raise InvalidRequestError(
                f"sampling params out of range: temperature={out.temperature} top_p={out.top_p} "
                f"top_k={out.top_k} min_p={out.min_p}"
            )
        if out.max_tokens is not None and out.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be at least 1, got {out.max_tokens}")
        return out

    def stop_ids_for_min_tokens(self) -> tuple[int, ...]:
        """Tokens suppressed while fewer than `min_tokens` were generated."""
        if self.eos_token_id is not None and not self.ignore_eos:
            return (*self.stop_token_ids, self.eos_token_id)
        return self.stop_token_ids


class RequestStatus(enum.Enum):
    """Where a request is in the scheduler."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One request in the engine."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    client_index: int = 0
    arrival_time: float = 0.0
    cache_salt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    #: Prompt tokens found in the prefix cache when it was first scheduled.
    num_cached_tokens: int = 0
    #: Times it was preempted (its KV cache freed, to be computed again).
    num_preemptions: int = 0
    #: Whether its first output (which carries its `PrefillStats`) went out.
    sent_prefill_stats: bool = False
    #: Its block table in each KV-cache group (`KVCacheManager.groups`), all
    #: of one length; empty while it holds no blocks.
    block_ids: list[list[int]] = field(default_factory=list)
    #: Hashes of this request's full, computed blocks, in order.
    block_hashes: list[bytes] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    #: Lifecycle events not yet sent (recorded only when stats are logged).
    events: list[EngineCoreEvent] = field(default_factory=list)
    #: The request's `structured_output.GrammarMatcher`, when it has structured outputs.
    grammar: Any = None
    #: Prompt logprobs computed but not sent yet (prefill may take several steps).
    pending_prompt_logprobs: list[LogprobsRows] = field(default_factory=list)
    #: A pooling request's `pooling_params.PoolingParams` (None: generation).
    pooling_params: Any = None

    def record_event(self, event_type: EngineCoreEventType) -> None:
        """Stamps an event now; it goes out with the request's next output."""
        self.events.append(EngineCoreEvent.now(event_type))

    def take_events(self) -> list[EngineCoreEvent] | None:
        """The events since the last output (None when there are none)."""
        if not self.events:
            return None
        events, self.events = self.events, []
        return events

    def take_prompt_logprobs(self) -> LogprobsRows | None:
        """The prompt logprobs computed so far, all at once (vLLM sends them
        with the first sampled token), then forgets them."""
        if not self.pending_prompt_logprobs:
            return None
        parts, self.pending_prompt_logprobs = self.pending_prompt_logprobs, []
        return parts[0] if len(parts) == 1 else LogprobsRows.concat(parts)

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def max_total_tokens(self) -> int:
        """Longest this request can grow: prompt plus `max_tokens`."""
        return len(self.prompt_token_ids) + self.max_tokens

    def token_at(self, position: int) -> int:
        """The token at `position` of prompt + output."""
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < n else self.output_token_ids[position - n]

    def tokens(self, start: int, end: int) -> list[int]:
        """Tokens `start:end` of prompt + output."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        return (self.prompt_token_ids + self.output_token_ids)[start:end]

    def append_token(self, token_id: int, max_model_len: int) -> bool:
        """Adds a generated token and applies vLLM's stop checks (length, then
        EOS, then stop token ids, none before `min_tokens`). Returns True
        when the request is now finished."""
        self.output_token_ids.append(token_id)
        n_out = len(self.output_token_ids)
        if n_out >= self.max_tokens or self.num_tokens >= max_model_len:
            self.finish(FinishReason.LENGTH)
            return True
        if n_out < self.sampling.min_tokens:
            return False
        if not self.sampling.ignore_eos and token_id == self.sampling.eos_token_id:
            self.finish(FinishReason.STOP)
            return True
        if token_id in self.sampling.stop_token_ids:
            self.finish(FinishReason.STOP, token_id)
            return True
        return False

    def finish(self, reason: FinishReason, stop_reason: int | str | None = None) -> None:
        """Marks the request finished."""
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
