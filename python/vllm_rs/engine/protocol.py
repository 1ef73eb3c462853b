"""The engine-core wire protocol of vLLM 0.33 in Python: type bytes, finish
reasons, and the MessagePack codecs both sides need.

The engine side decodes requests and encodes outputs exactly as vLLM 0.33's
engine core does (full arrays, every field of the ready response and of
the stats; tests/fixtures/vllm-0.33 holds vLLM's own bytes to compare
with); the frontend side (requests encoded, registrations decoded) serves
the tests and tools that play a frontend. Arrays may be received short
(trailing defaults omitted) and are read leniently.
"""

from __future__ import annotations

import enum
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from vllm_rs.engine.stats import PrefillStats

if TYPE_CHECKING:
    # Only annotations: importing logprobs (numpy) here would load numpy in
    # `serve`'s supervisor, which reads this module for its constants.
    from vllm_rs.engine.sample.logprobs import LogprobsRows

#: Frontend -> engine type bytes.
REQUEST_ADD = b"\x00"
REQUEST_ABORT = b"\x01"
REQUEST_START_DP_WAVE = b"\x02"
REQUEST_UTILITY = b"\x03"

#: The single frame an engine sends on its output socket when it dies.
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"

#: The vLLM release whose engine protocol this module speaks (the ready
#: response's `vllm_version`).
VLLM_PROTOCOL_VERSION = "0.33.0"


class FinishReason(enum.IntEnum):
    """Why a request finished (EngineCoreOutput slot 5)."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4

    @property
    def openai_name(self) -> str:
        """The OpenAI `finish_reason` string (`stop`, `length`, ...)."""
        return self.name.lower()


class EngineCoreEventType(enum.IntEnum):
    """A request's lifecycle event in the engine (vLLM's numbering)."""

    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


@dataclass(frozen=True)
class EngineCoreEvent:
    """A timestamped request event; `timestamp` is `time.monotonic()` of the
    engine process (only intervals between one engine's events mean anything)."""

    type: EngineCoreEventType
    timestamp: float

    @classmethod
    def now(cls, event_type: EngineCoreEventType) -> EngineCoreEvent:
        """The event, stamped now."""
        return cls(event_type, time.monotonic())

    def to_wire(self) -> dict[str, Any]:
        """A map, as msgspec encodes vLLM's (non array-like) struct."""
        return {"type": int(self.type), "timestamp": float(self.timestamp)}


@dataclass(frozen=True)
class RequestError:
    """Why the engine failed one request (sent with finish reason ERROR)."""

    code: str
    message: str
    retryable: bool = False

    def to_wire(self) -> dict[str, Any]:
        """A map, as msgspec encodes vLLM's dataclass."""
        return {"code": self.code, "message": self.message, "retryable": self.retryable}


class ProtocolError(ValueError):
    """A message that breaks the protocol (wrong shape, empty, mixed kinds)."""


def engine_identity(index: int) -> bytes:
    """The ZeroMQ routing identity of engine `index`: 2 bytes little-endian."""
    return int(index).to_bytes(2, "little")


def pack(value: Any) -> bytes:
    """MessagePack bytes of `value` (str as str, bytes as bin)."""
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes) -> Any:
    """Decodes one MessagePack value (strings as str)."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _slot(items: list, index: int, default: Any = None) -> Any:
    if index < len(items) and items[index] is not None:
        return items[index]
    return default


# ---------------------------------------------------------------------------
# Frontend -> engine
# ---------------------------------------------------------------------------


@dataclass
class EngineCoreRequest:
    """An ADD payload (the fields this project reads; see the protocol page)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: dict[str, Any]
    arrival_time: float = 0.0
    cache_salt: str | None = None
    data_parallel_rank: int | None = None
    client_index: int = 0
    external_req_id: str | None = None
    #: The data-parallel request wave the frontend saw (the coordinator's; 0 without one).
    current_wave: int = 0
    #: vLLM's PoolingParams as sent (an array), for a pooling request; None to generate.
    pooling_params: Any = None

    def to_wire(self) -> list[Any]:
        """The msgpack array, through slot 16 (`external_req_id`)."""
        return [
            self.request_id,
            self.prompt_token_ids,
            None,  # mm_features
            None if self.pooling_params is not None else self.sampling_params,
            self.pooling_params,
            float(self.arrival_time),
            None,  # lora_request
            self.cache_salt,
            self.data_parallel_rank,
            None,  # prompt_embeds
            None,  # prompt_is_token_ids
            self.client_index,
            self.current_wave,
            0,  # priority
            None,  # trace_headers
            False,  # resumable
            self.external_req_id,
        ]

    @classmethod
    def from_wire(cls, items: Any) -> EngineCoreRequest:
        """Reads an array of at least 4 slots; raises ProtocolError otherwise."""
        if not isinstance(items, (list, tuple)) or len(items) < 4:
            raise ProtocolError(f"EngineCoreRequest must be an array of at least 4 slots, got {items!r:.200}")
        request_id, prompt, params = items[0], items[1], items[3]
        if not isinstance(request_id, str):
            raise ProtocolError(f"request_id must be a string, got {request_id!r:.100}")
        if not isinstance(prompt, (list, tuple)):
            raise ProtocolError(f"prompt_token_ids of {request_id} must be an array")
        if params is not None and not isinstance(params, dict):
            raise ProtocolError(f"sampling_params of {request_id} must be a map")
        pooling = _slot(items, 4)
        return cls(
            request_id=request_id,
            prompt_token_ids=list(prompt),
            sampling_params=params or {},
            arrival_time=float(_slot(items, 5, 0.0)),
            cache_salt=_slot(items, 7),
            data_parallel_rank=_slot(items, 8),
            client_index=int(_slot(items, 11, 0)),
            external_req_id=_slot(items, 16),
            current_wave=_wave(_slot(items, 12, 0)),
            pooling_params=pooling,
        )


def _wave(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError(f"current_wave must be a non-negative integer, got {value!r:.100}")
    return value


def encode_add(request: EngineCoreRequest) -> bytes:
    """ADD payload bytes."""
    return pack(request.to_wire())


def encode_abort(request_ids: list[str]) -> bytes:
    """ABORT payload bytes: the array of request ids."""
    return pack(list(request_ids))


def encode_utility(client_index: int, call_id: int, method: str, args: list[Any]) -> bytes:
    """UTILITY payload bytes: `[client_index, call_id, method_name, args]`."""
    return pack([client_index, call_id, method, list(args)])


@dataclass
class UtilityCall:
    """A decoded UTILITY payload."""

    client_index: int
    call_id: int
    method: str
    args: list[Any]

    @classmethod
    def from_wire(cls, items: Any) -> UtilityCall:
        """Reads `[client_index, call_id, method_name, args]`."""
        if not isinstance(items, (list, tuple)) or len(items) < 3 or not isinstance(items[2], str):
            raise ProtocolError(f"UTILITY must be [client_index, call_id, method, args], got {items!r:.200}")
        args = _slot(items, 3, [])
        return cls(int(items[0]), int(items[1]), items[2], list(args) if isinstance(args, (list, tuple)) else [args])


# ---------------------------------------------------------------------------
# Engine -> frontend
# ---------------------------------------------------------------------------


#: EngineCoreOutput slots 8..17 at their defaults: kv/ec_transfer_params,
#: trace_headers, prefill_stats, routed_experts, num_nans_in_logits (0),
#: mm_cache_miss_hashes, new_sampling_mask, spec_decode_metrics,
#: prompt_token_id_logprobs. Slot 18 is `error`.
_DEFAULT_SLOTS_8_TO_17 = (None, None, None, None, None, 0, None, None, None, None)
#: The slot of `prefill_stats`.
_PREFILL_STATS_SLOT = 11


@dataclass
class EngineCoreOutput:
    """New tokens of one request; the last one carries the finish reason.
    `events` are the request's lifecycle events since its last output;
    `error` says why a request finished with ERROR."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    events: list[EngineCoreEvent] | None = None
    error: RequestError | None = None
    #: The new token's logprobs (vLLM's `LogprobsLists`), when asked for.
    new_logprobs: LogprobsRows | None = None
    #: The prompt's logprobs (vLLM's `LogprobsTensors`), with the first token.
    new_prompt_logprobs: LogprobsRows | None = None
    #: How the prompt was filled, with the first token.
    prefill_stats: PrefillStats | None = None
    #: A pooling request's result, as vLLM encodes a torch tensor: `[dtype, shape, data]`.
    pooling_output: list[Any] | None = None

    def to_wire(self) -> list[Any]:
        """vLLM's 19-slot array without its trailing default slots (vLLM's
        decoder fills them in, as for any array-like struct): two slots for
        most outputs, which keeps a step of many requests cheap to encode."""
        if self.error is not None or self.prefill_stats is not None:
            slots = list(_DEFAULT_SLOTS_8_TO_17)
            if self.prefill_stats is not None:
                slots[_PREFILL_STATS_SLOT - 8] = self.prefill_stats.to_wire()
            if self.error is None:
                return [*self._through_events(), *slots[: _PREFILL_STATS_SLOT - 7]]
            return [*self._through_events(), *slots, self.error.to_wire()]
        if self.events:
            return self._through_events()
        if self.finish_reason is not None or self.stop_reason is not None:
            return self._through_events()[:7]
        if self.new_prompt_logprobs is not None:
            return self._through_events()[:4]
        if self.new_logprobs is not None:
            return self._through_events()[:3]
        return [self.request_id, self.new_token_ids]

    def _through_events(self) -> list[Any]:
        return [
            self.request_id,
            self.new_token_ids,
            None if self.new_logprobs is None else self.new_logprobs.to_lists_wire(),
            None if self.new_prompt_logprobs is None else self.new_prompt_logprobs.to_tensors_wire(),
            self.pooling_output,
            None if self.finish_reason is None else int(self.finish_reason),
            self.stop_reason,
            None if not self.events else [e.to_wire() for e in self.events],
        ]  # fmt: skip


@dataclass
class UtilityOutput:
    """The reply to a UTILITY call."""

    call_id: int
    failure_message: str | None = None
    result: Any = None

    def to_wire(self) -> list[Any]:
        """`[call_id, failure_message, [type_info, result]]`."""
        if self.failure_message is not None:
            return [self.call_id, self.failure_message, None]
        return [self.call_id, None, [None, self.result]]


@dataclass
class EngineCoreOutputs:
    """One message on the output socket: a request batch, a utility reply or a
    wave message (exactly one kind). `timestamp` is the engine's
    `time.monotonic()` (0 means "now" when encoded), as vLLM stamps it."""

    engine_index: int = 0
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    scheduler_stats: dict[str, Any] | None = None
    timestamp: float = 0.0
    utility_output: UtilityOutput | None = None
    finished_requests: list[str] | None = None
    wave_complete: int | None = None
    start_wave: int | None = None
    weight_version: str | None = None

    def to_wire(self) -> list[Any]:
        """The full 9-slot array, as vLLM encodes it."""
        return [
            self.engine_index,
            [o.to_wire() for o in self.outputs],
            self.scheduler_stats,
            float(self.timestamp or time.monotonic()),
            None if self.utility_output is None else self.utility_output.to_wire(),
            self.finished_requests,
            self.wave_complete,
            self.start_wave,
            self.weight_version,
        ]

    @property
    def is_utility(self) -> bool:
        """True for a utility reply."""
        return self.utility_output is not None


def encode_outputs(message: EngineCoreOutputs) -> bytes:
    """Output-socket frame bytes for `message`."""
    return pack(message.to_wire())


@dataclass
class ReadyResponse:
    """vLLM 0.33's `EngineCoreReadyResponse`: what an engine registers with
    once its model is loaded (every field; vLLM's frontend requires them)."""

    max_model_len: int
    num_gpu_blocks: int
    block_size: int
    dp_stats_address: str | None
    dtype: str
    vllm_version: str
    world_size: int
    data_parallel_size: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    decode_context_parallel_size: int
    data_parallel_rank: int
    max_num_seqs: int
    max_num_batched_tokens: int
    instance_id: str
    supports_lora: bool
    max_loras: int
    mamba_block_size: int | None = None
    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    kv_events_config: dict[str, Any] | None = None
    weight_transfer_backend: str | None = None
    enable_sleep_mode: bool = False
    supports_draft_weight_updates: bool = False
    effective_attention_block_size: int | None = None
    coord_store_port: int = 0
    coordinator_input_address: str | None = None
    coordinator_output_address: str | None = None


def encode_ready_response(response: ReadyResponse) -> bytes:
    """The registration payload: a map of every field, as msgspec encodes
    vLLM's dataclass."""
    return pack(asdict(response))


@dataclass
class Registration:
    """What an engine said when it registered."""

    max_model_len: int | None = None
    num_gpu_blocks: int | None = None
    dp_stats_address: str | None = None


def decode_registration(payload: bytes) -> Registration:
    """Reads a registration payload (empty, or a map with `max_model_len` and
    `num_gpu_blocks`); raises ProtocolError otherwise."""
    if not payload:
        return Registration()
    value = unpack(payload)
    if not isinstance(value, dict):
        raise ProtocolError(f"registration must be empty or a map, got {value!r:.100}")
    for key in ("max_model_len", "num_gpu_blocks"):
        if not isinstance(value.get(key), int) or value[key] < 0:
            raise ProtocolError(f"registration `{key}` must be a non-negative integer, got {value.get(key)!r}")
    return Registration(value["max_model_len"], value["num_gpu_blocks"], value.get("dp_stats_address"))
