"""Request bodies: the JSON object (400 when not JSON or not an object) and
typed parameter readers whose errors name the parameter, with the same rules
and messages as the Rust frontend. Every number that reaches an engine is
range-checked here (finite floats, int32/int64 integers) and every list is
bounded, so an engine never receives a value it cannot hold."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from vllm_rs.api_server.errors import ApiError
from vllm_rs.api_server.tokenizer import DecodeOptions

#: Largest request body accepted (bytes).
MAX_BODY_BYTES = 16 * 1024 * 1024
#: Most entries of `stop`, `stop_token_ids` and `logit_bias`.
MAX_LIST_ITEMS = 1024
#: Most characters over all `stop` strings: matching them costs memory and
#: set-up time in proportion.
MAX_STOP_CHARS = 32 * 1024
#: Integers with more digits than this are out of range for every parameter
#: (and are never converted: that costs quadratic time).
MAX_INT_DIGITS = 40
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
TOKEN_ID_MAX = 2**32 - 1


class OversizedInt:
    """Stands for a JSON integer with more than MAX_INT_DIGITS digits."""

    def __repr__(self) -> str:
        return "<oversized integer>"


class _NotJson(ValueError):
    """A JSON extension Python accepts but JSON does not (NaN, Infinity)."""


def _parse_int(text: str) -> int | OversizedInt:
    return OversizedInt() if len(text) > MAX_INT_DIGITS else int(text)


def _refuse_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON value")


#: What a surrogate looks like in a JSON body: a `\uD800`-`\uDFFF` escape, or
#: its raw bytes (json.loads decodes bytes with `surrogatepass`). Only bodies
#: holding one are walked.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _has_lone_surrogate(value: Any) -> bool:
    """True when a string anywhere in `value` (keys included) holds a lone
    UTF-16 surrogate, which JSON allows as an escape but UTF-8 cannot carry.
    Iterative, so depth costs nothing."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 ApiError."""
    try:
        value = json.loads(body, parse_int=_parse_int, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, _NotJson) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise ApiError(400, "the request body is not valid JSON: it is nested too deeply") from None
    if not isinstance(value, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if _MAYBE_SURROGATE.search(body) and _has_lone_surrogate(value):
        raise ApiError(400, "the request body is not valid JSON: a string holds a lone UTF-16 surrogate")
    return value


def parse_decimal(text: str, maximum: int) -> int | None:
    """`text` as a non-negative integer of ASCII digits up to `maximum`, else None."""
    text = text.strip()
    if not text or not text.isascii() or not text.isdigit() or len(text) > len(str(maximum)):
        return None
    value = int(text)
    return value if value <= maximum else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Params:
    """Typed, named access to the parameters of a request; null counts as absent."""

    def __init__(self, body: dict[str, Any]):
        self.body = body

    def get(self, name: str) -> Any:
        """The raw value, None when absent or null; 400 for an integer too
        large for any parameter."""
        value = self.body.get(name)
        if isinstance(value, OversizedInt):
            raise ApiError.invalid_param(name, f"`{name}` is out of range")
        return value

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

    def int_in(self, name: str, minimum: int, maximum: int) -> int | None:
        """An integer from `minimum` to `maximum`."""
        value = self.get(name)
        if value is not None and not _is_int(value):
            raise self.wrong(name, "an integer")
        if value is not None and not minimum <= value <= maximum:
            raise self.wrong(name, f"an integer from {minimum} to {maximum}")
        return value

    def float_in(self, name: str, ok: Any, what: str) -> float | None:
        """A finite number for which `ok(value)` holds, described as `what`
        in errors."""
        value = self.get(name)
        if value is None:
            return None
        if not _is_number(value):
            raise self.wrong(name, "a number")
        number = float(value)  # at most MAX_INT_DIGITS digits: never overflows
        if not math.isfinite(number) or not ok(number):
            raise self.wrong(name, what)
        return number

    def count(self, name: str, minimum: int) -> int | None:
        """An integer from `minimum` to 2**31-1."""
        value = self.get(name)
        if value is not None and (not _is_int(value) or not minimum <= value <= INT32_MAX):
            raise self.wrong(name, f"an integer from {minimum} to {INT32_MAX}")
        return value

    def _at_most(self, name: str, items: list | dict) -> None:
        if len(items) > MAX_LIST_ITEMS:
            raise ApiError.invalid_param(
                name, f"`{name}` has {len(items)} entries; at most {MAX_LIST_ITEMS} are allowed"
            )

    def token_ids(self, name: str) -> list[int] | None:
        """A list of at most MAX_LIST_ITEMS token ids."""
        value = self.get(name)
        if value is None:
            return None
        if not isinstance(value, list) or not all(_is_int(t) and 0 <= t <= TOKEN_ID_MAX for t in value):
            raise self.wrong(name, "a list of token ids (non-negative integers)")
        self._at_most(name, value)
        return value

    def strings(self, name: str) -> list[str]:
        """A string or a list of at most MAX_LIST_ITEMS strings."""
        value = self.get(name)
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            self._at_most(name, value)
            return value
        raise self.wrong(name, "a string or a list of strings")

    def stop_strings(self, name: str) -> list[str]:
        """`strings(name)` holding at most MAX_STOP_CHARS characters in all."""
        stops = self.strings(name)
        total = sum(len(s) for s in stops)
        if total > MAX_STOP_CHARS:
            raise ApiError.invalid_param(
                name, f"`{name}` strings hold {total} characters; at most {MAX_STOP_CHARS} are allowed"
            )
        return stops

    def logit_bias(self, name: str) -> dict[int, float] | None:
        """A map of at most MAX_LIST_ITEMS token ids (as strings) to biases
        from -100 to 100."""
        value = self.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.wrong(name, "a map from token ids to numbers")
        self._at_most(name, value)
        bias = {}
        for key, number in value.items():
            token = parse_decimal(key, TOKEN_ID_MAX)
            if token is None:
                raise ApiError.invalid_param(name, f"`{name}` keys must be token ids, got {key[:40]!r}")
            if not _is_number(number) or not -100 <= number <= 100:
                raise ApiError.invalid_param(name, f"`{name}` values must be numbers from -100 to 100")
            bias[token] = float(number)
        return bias

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
    decode: DecodeOptions = field(default_factory=DecodeOptions)
    stream: bool = False
    include_usage: bool = False


def _true_unless_false(value: bool | None) -> bool:
    """A boolean that defaults to true when absent."""
    return value is None or value


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
    top_k = p.int_in("top_k", -1, INT32_MAX)
    if top_k == 0:
        raise ApiError.invalid_param("top_k", f"`top_k` must be -1 (off) or an integer from 1 to {INT32_MAX}")
    min_tokens = p.count("min_tokens", 0)
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise ApiError.invalid_param("min_tokens", "`min_tokens` must not exceed `max_tokens`")

    def penalty(v: float) -> bool:
        return -2.0 <= v <= 2.0

    sampling = {
        "temperature": p.float_in("temperature", lambda v: v >= 0.0, "a finite non-negative number"),
        "top_p": p.float_in("top_p", lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
        "top_k": top_k,
        "min_p": p.float_in("min_p", lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
        "frequency_penalty": p.float_in("frequency_penalty", penalty, "in [-2, 2]"),
        "presence_penalty": p.float_in("presence_penalty", penalty, "in [-2, 2]"),
        "repetition_penalty": p.float_in("repetition_penalty", lambda v: v > 0.0, "a finite positive number"),
        "min_tokens": min_tokens,
        "seed": p.int_in("seed", INT64_MIN, INT64_MAX),
        "logit_bias": p.logit_bias("logit_bias"),
    }
    return CommonParams(
        model=p.str("model"),
        sampling={k: v for k, v in sampling.items() if v is not None},
        max_tokens=max_tokens,
        ignore_eos=p.bool("ignore_eos") or False,
        stop_token_ids=p.token_ids("stop_token_ids") or [],
        stop=p.stop_strings("stop"),
        decode=DecodeOptions(
            skip_special_tokens=_true_unless_false(p.bool("skip_special_tokens")),
            spaces_between_special_tokens=_true_unless_false(p.bool("spaces_between_special_tokens")),
        ),
        stream=stream,
        include_usage=include_usage,
    )
