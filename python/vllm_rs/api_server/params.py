"""Request bodies: the JSON object (400 when not JSON or not an object), the
typed request models (pydantic, strict: a field of the wrong type is a 400
naming it) and the checks of the shared rule table (`request_rules.json`,
with vLLM 0.33's rules and messages) on every value that reaches an engine,
so an engine never receives a request vLLM's SamplingParams would refuse.
Rules, messages and limits are the Rust frontend's."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vllm_rs.api_server.errors import ApiError
from vllm_rs.api_server.request_rules import RULES
from vllm_rs.api_server.tokenizer import DecodeOptions

#: Largest request body accepted (bytes).
MAX_BODY_BYTES = 16 * 1024 * 1024
#: Integers with more digits than this are out of range for every parameter
#: (and are never converted: that costs quadratic time).
MAX_INT_DIGITS = 40
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: An integer the Rust frontend can hold (`i64`): both frontends refuse the same.
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
#: Below this temperature vLLM samples greedily (its `_SAMPLING_EPS`).
GREEDY_TEMPERATURE = 1e-5
TokenId = Annotated[int, Field(ge=0, le=2**32 - 1)]


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


class RequestModel(BaseModel):
    """A request model: strict types (no string-to-number coercion, as the
    Rust frontend), unknown fields ignored (as vLLM ignores them), null is
    the same as absent."""

    model_config = ConfigDict(strict=True, extra="ignore")


class SamplingInput(RequestModel):
    """The fields completions and chat share, as sent."""

    model: str | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    n: Int64 | None = None
    best_of: Int64 | None = None
    max_tokens: Int64 | None = None
    min_tokens: Int64 | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int64 | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: Int64 | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Int64] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    logit_bias: dict[str, float] | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[Int64] | None = None
    prompt_logprobs: Int64 | None = None
    return_tokens_as_token_ids: bool | None = None
    truncate_prompt_tokens: Int64 | None = None
    stream_interval: Int64 | None = None


Model = TypeVar("Model", bound=RequestModel)


def parse_model(model: type[Model], body: dict[str, Any]) -> Model:
    """`body` as `model`, or a 400 naming the first field of the wrong type."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        loc = e.errors()[0]["loc"]
        raise RULES.wrong_type(str(loc[0])) from None


@dataclass
class CommonParams:
    """The parameters completions and chat share, checked."""

    model: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    #: The parameter `max_tokens` came from, when given.
    max_tokens_param: str | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    decode: DecodeOptions = field(default_factory=DecodeOptions)
    stream: bool = False
    include_usage: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    #: Top logprobs per generated token (-1: the whole vocabulary), when asked for.
    logprobs: int | None = None
    #: Top logprobs per prompt token, when asked for.
    prompt_logprobs: int | None = None
    #: Tokens in logprobs as `token_id:N`; None: as the server is configured.
    return_tokens_as_token_ids: bool | None = None
    #: Choices to generate (child requests, as vLLM fans them out).
    n: int = 1


def _bounded(param: str, items: list | dict) -> None:
    limit = RULES.limits["max_list_items"]
    if len(items) > limit:
        raise RULES.refuse(param, "too_many_items", param=param, limit=limit, count=len(items))


def _check_numbers(values: dict[str, float | int | None]) -> None:
    for param, value in values.items():
        if value is not None:
            RULES.check_number(param, value)


def check_min_tokens(min_tokens: int, max_tokens: int) -> None:
    """400 when `min_tokens` exceeds `max_tokens` (given or defaulted), in vLLM's words."""
    if min_tokens > max_tokens:
        raise RULES.refuse("min_tokens", "min_tokens_above_max_tokens", max_tokens=max_tokens, min_tokens=min_tokens)


def _check_stop(stop: list[str]) -> None:
    limits = RULES.limits
    if len(stop) > limits["max_stop_strings"]:
        raise RULES.refuse("stop", "too_many_stop_strings", limit=limits["max_stop_strings"], count=len(stop))
    if any(not s for s in stop):
        raise RULES.refuse("stop", "empty_stop_string")
    chars = sum(len(s) for s in stop)
    if chars > limits["max_stop_chars"]:
        raise RULES.refuse("stop", "too_many_stop_chars", limit=limits["max_stop_chars"], count=chars)


def _python_int(text: str) -> int | None:
    """`int(text)` for a decimal key, None when Python could not read it."""
    try:
        return int(text) if len(text) <= MAX_INT_DIGITS else None
    except ValueError:
        return None


def _logit_bias(bias: dict[str, float]) -> dict[int, float]:
    _bounded("logit_bias", bias)
    bad = [key for key in sorted(bias) if _python_int(key) is None]
    if bad:
        raise RULES.refuse("logit_bias", "logit_bias_bad_keys", keys=repr(bad))
    if not all(-100.0 <= v <= 100.0 for v in bias.values()):
        raise RULES.refuse("logit_bias", "logit_bias_value_out_of_range")
    return {_python_int(key): float(value) for key, value in bias.items()}  # type: ignore[misc]


def common_params(s: SamplingInput, max_tokens: tuple[str, int] | None) -> CommonParams:
    """Checks every shared field; `max_tokens` is the token limit the
    endpoint reads (its name and value), the first one given."""
    stream = bool(s.stream)
    include_usage = False
    if s.stream_options is not None:
        # vLLM refuses options only when there are some (an empty object passes).
        if s.stream_options and not stream:
            raise RULES.refuse("stream_options", "stream_options_without_stream")
        usage = s.stream_options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise RULES.wrong_type("stream_options")
        include_usage = bool(usage)
    if s.prompt_logprobs is not None:
        RULES.check_number("prompt_logprobs", s.prompt_logprobs)
        if stream and (s.prompt_logprobs > 0 or s.prompt_logprobs == -1):
            raise RULES.refuse("prompt_logprobs", "prompt_logprobs_with_stream")
    _check_numbers({
        "n": s.n, "best_of": s.best_of, "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty, "repetition_penalty": s.repetition_penalty,
        "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "min_p": s.min_p,
    })  # fmt: skip
    n = 1 if s.n is None else s.n
    if n > 1 and s.temperature is not None and s.temperature < GREEDY_TEMPERATURE:
        raise ApiError(400, RULES.message("n_with_greedy_sampling", n=n))
    max_tokens_param, limit = max_tokens if max_tokens is not None else (None, None)
    if limit is not None:
        RULES.check_number(max_tokens_param, limit)  # type: ignore[arg-type]
    _check_numbers({"min_tokens": s.min_tokens})
    if s.min_tokens is not None and limit is not None:
        check_min_tokens(s.min_tokens, limit)
    _check_numbers({"stream_interval": s.stream_interval})
    stop_token_ids = s.stop_token_ids or []
    _bounded("stop_token_ids", stop_token_ids)
    stop = [s.stop] if isinstance(s.stop, str) else s.stop or []
    _check_stop(stop)
    if s.bad_words is not None:
        _bounded("bad_words", s.bad_words)
        if any(not word for word in s.bad_words):
            raise RULES.refuse("bad_words", "empty_bad_word", bad_words=repr(s.bad_words))
    if s.allowed_token_ids is not None:
        _bounded("allowed_token_ids", s.allowed_token_ids)
        if not s.allowed_token_ids:
            raise RULES.refuse("allowed_token_ids", "empty_allowed_token_ids")
    logit_bias = None if s.logit_bias is None else _logit_bias(s.logit_bias)
    if s.truncate_prompt_tokens is not None:
        raise RULES.refuse("truncate_prompt_tokens", "truncate_prompt_tokens_unsupported")
    sampling = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "frequency_penalty": s.frequency_penalty,
        "presence_penalty": s.presence_penalty,
        "repetition_penalty": s.repetition_penalty,
        "min_tokens": s.min_tokens,
        # vLLM reads seed -1 as no seed.
        "seed": None if s.seed == -1 else s.seed,
    }
    return CommonParams(
        model=s.model,
        sampling={k: v for k, v in sampling.items() if v is not None},
        max_tokens=limit,
        max_tokens_param=max_tokens_param,
        ignore_eos=bool(s.ignore_eos),
        stop_token_ids=stop_token_ids,
        stop=stop,
        decode=DecodeOptions(
            skip_special_tokens=s.skip_special_tokens is not False,
            spaces_between_special_tokens=s.spaces_between_special_tokens is not False,
        ),
        stream=stream,
        include_usage=include_usage,
        logit_bias=logit_bias,
        allowed_token_ids=s.allowed_token_ids,
        prompt_logprobs=s.prompt_logprobs,
        return_tokens_as_token_ids=s.return_tokens_as_token_ids,
        n=n,
    )
