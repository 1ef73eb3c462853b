"""The API server's strict reader of engine output messages: every field is
checked before anything is dispatched, so a malformed message is dropped as a
whole with one error (`EngineOutputError`) that names the requests it
mentioned, and never fails anything else."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from vllm_rs.api_server.logprobs import read_rows
from vllm_rs.engine.logprobs import LogprobsRows
from vllm_rs.engine.protocol import (
    ENGINE_CORE_DEAD,
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
    RequestError,
    UtilityOutput,
)

#: Token ids are unsigned 32-bit on the wire.
MAX_TOKEN_ID = 2**32 - 1
#: Engine indices are the 2-byte routing identities.
MAX_ENGINE_INDEX = 2**16 - 1
_FINISH_REASONS = {int(reason) for reason in FinishReason}


class EngineOutputError(ValueError):
    """An output message that breaks the protocol. `request_ids` are the
    requests it named (the only ones that may be failed because of it)."""

    def __init__(self, message: str, request_ids: Sequence[str] = ()):
        super().__init__(message)
        self.request_ids = list(request_ids)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _slot(items: list, index: int) -> Any:
    return items[index] if index < len(items) else None


def _named_request_ids(items: list) -> list[str]:
    """Request ids a malformed message mentions, as far as they can be read."""
    named = []
    outputs = _slot(items, 1)
    if isinstance(outputs, list):
        named += [o[0] for o in outputs if isinstance(o, list) and o and isinstance(o[0], str)]
    finished = _slot(items, 5)
    if isinstance(finished, list):
        named += [r for r in finished if isinstance(r, str)]
    return list(dict.fromkeys(named))


def _output(item: Any, frames: Sequence[bytes | memoryview]) -> EngineCoreOutput:
    if not isinstance(item, list) or len(item) < 2 or not isinstance(item[0], str):
        raise ValueError("an output is not [request_id, new_token_ids, ...]")
    tokens = item[1] if item[1] is not None else []
    if not isinstance(tokens, list) or not all(_is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in tokens):
        raise ValueError(f"new_token_ids of {item[0]!r:.100} are not a list of token ids")
    reason = _slot(item, 5)
    if reason is not None and not (_is_int(reason) and reason in _FINISH_REASONS):
        raise ValueError(f"finish_reason of {item[0]!r:.100} is not a finish reason")
    stop_reason = _slot(item, 6)
    if stop_reason is not None and not (_is_int(stop_reason) or isinstance(stop_reason, str)):
        raise ValueError(f"stop_reason of {item[0]!r:.100} is neither a token id nor a string")
    finish = None if reason is None else FinishReason(reason)
    return EngineCoreOutput(
        item[0],
        tokens,
        finish,
        stop_reason,
        error=_request_error(item[0], _slot(item, 18)),
        new_logprobs=_logprobs(item, 2, frames, "new_logprobs"),
        new_prompt_logprobs=_logprobs(item, 3, frames, "new_prompt_logprobs_tensors"),
    )


def _logprobs(item: list, slot: int, frames: Sequence[bytes | memoryview], what: str) -> LogprobsRows | None:
    value = _slot(item, slot)
    return None if value is None else read_rows(value, frames, f"{what} of {item[0]!r:.100}")


def _request_error(request_id: str, value: Any) -> RequestError | None:
    """vLLM's RequestError (slot 18, a map msgspec writes for the dataclass)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"error of {request_id!r:.100} is not a RequestError map")
    code, message, retryable = value.get("code"), value.get("message"), value.get("retryable", False)
    if not isinstance(code, str) or not isinstance(message, str) or not isinstance(retryable, bool):
        raise ValueError(f"error of {request_id!r:.100} is not a RequestError (code, message, retryable)")
    return RequestError(code, message, retryable)


def _stats(value: Any) -> dict[str, int | float] | None:
    """Only what the balancer and the DP coordinator read, checked: the
    request counts and the KV cache usage."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("scheduler_stats is not a map")
    stats = {}
    for key in ("num_running_reqs", "num_waiting_reqs"):
        count = value.get(key)
        if count is None:
            count = 0
        if not _is_int(count) or not 0 <= count <= 2**31:
            raise ValueError(f"scheduler_stats.{key} is not a count")
        stats[key] = count
    usage = value.get("kv_cache_usage")
    if usage is not None:
        if not isinstance(usage, (int, float)) or isinstance(usage, bool) or not 0.0 <= usage <= 1.0:
            raise ValueError("scheduler_stats.kv_cache_usage is not a fraction")
        stats["kv_cache_usage"] = float(usage)
    return stats


def _utility(value: Any) -> UtilityOutput | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not _is_int(value[0]):
        raise ValueError("utility_output is not [call_id, failure_message, result]")
    failure = _slot(value, 1)
    if failure is not None and not isinstance(failure, str):
        raise ValueError("utility_output failure_message is not a string")
    result = _slot(value, 2)
    if result is not None and not (isinstance(result, list) and len(result) >= 2):
        raise ValueError("utility_output result is not [type_info, value]")
    return UtilityOutput(value[0], failure, None if result is None else result[1])


def _message(items: list, frames: Sequence[bytes | memoryview]) -> EngineCoreOutputs:
    engine_index = _slot(items, 0) if items else 0
    if not _is_int(engine_index) or not 0 <= engine_index <= MAX_ENGINE_INDEX:
        raise ValueError("engine_index is not an engine index")
    raw_outputs = _slot(items, 1)
    if raw_outputs is not None and not isinstance(raw_outputs, list):
        raise ValueError("outputs is not an array")
    outputs = [_output(o, frames) for o in raw_outputs or ()]
    stats = _stats(_slot(items, 2))
    timestamp = _slot(items, 3)
    if timestamp is not None and not (isinstance(timestamp, (int, float)) and not isinstance(timestamp, bool)):
        raise ValueError("timestamp is not a number")
    utility = _utility(_slot(items, 4))
    finished = _slot(items, 5)
    if finished is not None and not (isinstance(finished, list) and all(isinstance(r, str) for r in finished)):
        raise ValueError("finished_requests is not an array of request ids")
    wave_complete, start_wave = _slot(items, 6), _slot(items, 7)
    for name, wave in (("wave_complete", wave_complete), ("start_wave", start_wave)):
        if wave is not None and not _is_int(wave):
            raise ValueError(f"{name} is not an integer")
    is_batch = bool(outputs) or stats is not None or bool(finished)
    is_wave = wave_complete is not None or start_wave is not None
    kinds = is_batch + (utility is not None) + is_wave
    if kinds == 0:
        raise ValueError(f"empty outputs message from engine {engine_index}")
    if kinds > 1:
        raise ValueError(
            f"outputs message from engine {engine_index} mixes request outputs, a utility reply and wave fields"
        )
    return EngineCoreOutputs(
        engine_index=engine_index,
        outputs=outputs,
        scheduler_stats=stats,
        timestamp=float(timestamp or 0.0),
        utility_output=utility,
        finished_requests=finished or None,
        wave_complete=wave_complete,
        start_wave=start_wave,
    )


def decode_engine_message(frames: Sequence[bytes | memoryview]) -> EngineCoreOutputs | None:
    """One output-socket message: None for `ENGINE_CORE_DEAD`, else the
    checked message. Raises EngineOutputError, and nothing else, for anything
    that breaks the protocol. Extra frames are vLLM's aux buffers: the
    logprobs arrays too large to travel inline."""
    if not frames:
        raise EngineOutputError("a message without frames")
    first = frames[0]
    if len(first) == len(ENGINE_CORE_DEAD) and bytes(first) == ENGINE_CORE_DEAD:
        return None
    try:
        items = msgpack.unpackb(first, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        # UnicodeDecodeError, ExtraData, StackError and unhashable map keys
        # all land here: the bytes are not a MessagePack value we can read.
        raise EngineOutputError(f"undecodable MessagePack ({type(e).__name__})") from None
    if not isinstance(items, list):
        raise EngineOutputError(f"EngineCoreOutputs must be an array, got {type(items).__name__}")
    try:
        return _message(items, frames)
    except ValueError as e:
        raise EngineOutputError(str(e), _named_request_ids(items)) from None
