"""Request bodies: the JSON object (400 when not JSON or not an object) and
typed parameter readers whose errors name the parameter, with the same rules
and messages as the Rust frontend."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vllm_rs.api_server.errors import ApiError

#: Largest request body accepted (bytes).
MAX_BODY_BYTES = 16 * 1024 * 1024


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 ApiError."""
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Params:
    """Typed, named access to the parameters of a request; null counts as absent."""

    def __init__(self, body: dict[str, Any]):
        self.body = body

    def get(self, name: str) -> Any:
        """The raw value, None when absent or null."""
        return self.body.get(name)

    @staticmethod
    def wrong(name: str, expected: str) -> ApiError:
        """400 saying what `name` must be."""
        return ApiError.invalid_param(name, f"`{name}` must be {expected}")

    def bool(self, name: str) -> bool | None:
        """A boolean parameter."""
        value = self.get(name)
        if value is not None and not isinstance(value, bool):
            raise self.wrong(name, "a boolean")
        return value

    def str(self, name: str) -> str | None:
        """A string parameter."""
        value = self.get(name)
        if value is not None and not isinstance(value, str):
            raise self.wrong(name, "a string")
        return value

    def int(self, name: str) -> int | None:
        """An integer parameter."""
        value = self.get(name)
        if value is not None and not _is_int(value):
            raise self.wrong(name, "an integer")
        return value

    def float_in(self, name: str, ok: Any, what: str) -> float | None:
        """A number for which `ok(value)` holds, described as `what` in errors."""
        value = self.get(name)
        if value is None:
            return None
        if not _is_number(value):
            raise self.wrong(name, "a number")
        if not ok(value):
            raise self.wrong(name, what)
        return float(value)

    def count(self, name: str, minimum: int) -> int | None:
        """A non-negative integer, at least `minimum`."""
        value = self.get(name)
        if value is not None and (not _is_int(value) or value < minimum):
            raise self.wrong(name, f"an integer of at least {minimum}")
        return value

    def token_ids(self, name: str) -> list[int] | None:
        """A list of token ids."""
        value = self.get(name)
        if value is None:
            return None
        if not isinstance(value, list) or not all(_is_int(t) and 0 <= t < 2**32 for t in value):
            raise self.wrong(name, "a list of token ids (non-negative integers)")
        return value

    def strings(self, name: str) -> list[str]:
        """A string or a list of strings."""
        value = self.get(name)
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return value
        raise self.wrong(name, "a string or a list of strings")

    def only(self, name: str, accepted: Any, why: str) -> None:
        """Refuses a parameter unless absent or equal to its accepted value."""
        value = self.get(name)
        if value is not None and not (value == accepted and type(value) is type(accepted)):
            raise ApiError.invalid_param(name, f"`{name}`: {why}")


@dataclass
class CommonParams:
    """The parameters completions and chat share."""

    model: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False


def common_params(p: Params, max_tokens_names: tuple[str, ...]) -> CommonParams:
    """Reads the shared parameters; the first present of `max_tokens_names`
    is the token limit."""
    p.only("n", 1, "only n=1 is supported")
    p.only("best_of", 1, "only best_of=1 is supported")
    stream = p.bool("stream") or False
    include_usage = False
    options = p.get("stream_options")
    if options is not None:
        if not stream:
            raise ApiError.invalid_param("stream_options", "`stream_options` can only be given when `stream` is true")
        if not isinstance(options, dict):
            raise ApiError.invalid_param("stream_options", "`stream_options` must be an object")
        usage = options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise ApiError.invalid_param("stream_options", "`stream_options.include_usage` must be a boolean")
        include_usage = bool(usage)
    max_tokens = None
    for name in max_tokens_names:
        max_tokens = p.count(name, 1)
        if max_tokens is not None:
            break
    top_k = p.int("top_k")
    if top_k is not None and top_k < -1:
        raise ApiError.invalid_param("top_k", "`top_k` must be -1 (off), 0 (off) or positive")
    min_tokens = p.count("min_tokens", 0)
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise ApiError.invalid_param("min_tokens", "`min_tokens` must not exceed `max_tokens`")

    def penalty(v: float) -> bool:
        return -2.0 <= v <= 2.0

    sampling = {
        "temperature": p.float_in("temperature", lambda v: v >= 0.0, "a non-negative number"),
        "top_p": p.float_in("top_p", lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
        "top_k": top_k,
        "min_p": p.float_in("min_p", lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
        "frequency_penalty": p.float_in("frequency_penalty", penalty, "in [-2, 2]"),
        "presence_penalty": p.float_in("presence_penalty", penalty, "in [-2, 2]"),
        "repetition_penalty": p.float_in("repetition_penalty", lambda v: v > 0.0, "a positive number"),
        "min_tokens": min_tokens,
        "seed": p.int("seed"),
    }
    return CommonParams(
        model=p.str("model"),
        sampling={k: v for k, v in sampling.items() if v is not None},
        max_tokens=max_tokens,
        ignore_eos=p.bool("ignore_eos") or False,
        stop_token_ids=p.token_ids("stop_token_ids") or [],
        stop=p.strings("stop"),
        stream=stream,
        include_usage=include_usage,
    )
