"""What `/v1/completions` and `/v1/chat/completions` share: the model check,
length checks, ids, EOS handling and submission to an engine."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace

from starlette.datastructures import Headers

from vllm_rs.api_server.engine_client import EngineUnavailableError, RankOutOfRangeError
from vllm_rs.api_server.engine_outputs import MAX_ENGINE_INDEX
from vllm_rs.api_server.errors import ApiError
from vllm_rs.api_server.generation import Generation
from vllm_rs.api_server.params import CommonParams, check_min_tokens, parse_decimal
from vllm_rs.api_server.request_rules import RULES
from vllm_rs.api_server.state import ServerState
from vllm_rs.engine.protocol import EngineCoreRequest
from vllm_rs.logger import init_logger

logger = init_logger(__name__)

#: Header that pins a request to one engine.
DATA_PARALLEL_RANK_HEADER = "x-data-parallel-rank"
#: Header whose value becomes part of the request id.
REQUEST_ID_HEADER = "x-request-id"
#: `max_tokens` of a completion that does not say (OpenAI's default).
DEFAULT_COMPLETION_MAX_TOKENS = 16


@dataclass
class Endpoint:
    """Which endpoint a request came in on."""

    #: Starts the id the client sees, separator included.
    id_prefix: str
    prompt_param: str
    #: `max_tokens` defaults to the room the prompt leaves (else 16).
    is_chat: bool


COMPLETIONS = Endpoint("cmpl-", "prompt", False)
CHAT = Endpoint("chatcmpl-", "messages", True)
RESPONSES = Endpoint("resp_", "input", True)


@dataclass
class Submitted:
    """A request running in an engine: one generation per choice (`n`)."""

    id: str
    created: int
    generations: list[Generation]


def check_model(state: ServerState, model: str | None) -> None:
    """404 unless `model` is absent or a served name."""
    if model is not None and model not in state.settings.served_model_names:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")


def _client_request_id(headers: Headers) -> str:
    value = headers.get(REQUEST_ID_HEADER)
    if value and len(value) <= 128 and all(33 <= ord(c) <= 126 for c in value):
        return value
    return secrets.token_hex(16)


def _pinned_rank(headers: Headers) -> int | None:
    value = headers.get(DATA_PARALLEL_RANK_HEADER)
    if value is None:
        return None
    rank = parse_decimal(value, MAX_ENGINE_INDEX)
    if rank is None:
        raise ApiError.invalid_param(
            DATA_PARALLEL_RANK_HEADER, f"X-data-parallel-rank must be an integer from 0 to {MAX_ENGINE_INDEX}"
        )
    return rank


def _check_vocabulary(ids: list[int], param: str, vocab_size: int) -> None:
    """400 naming `param` when a token id lies outside the vocabulary, in vLLM's words."""
    outside = [t for t in ids if not 0 <= t < vocab_size]
    if outside:
        raise RULES.refuse(param, "token_ids_out_of_vocab", token_ids=outside, param=param, vocab_size=vocab_size)


def _limit_max_tokens(
    state: ServerState, endpoint: Endpoint, prompt_len: int, max_tokens: int | None, max_tokens_param: str | None
) -> int | None:
    generation_config = state.settings.generation_config
    max_len = state.max_model_len
    if endpoint.is_chat and max_tokens is None:
        max_tokens = generation_config.defaults.get("max_tokens")
        if max_tokens is not None and max_len is not None:
            # vLLM takes the smaller of the default and what the prompt leaves.
            max_tokens = min(max_tokens, max(max_len - prompt_len, 1))
    if max_len is None:
        if max_tokens is None and not endpoint.is_chat:
            max_tokens = DEFAULT_COMPLETION_MAX_TOKENS
        return generation_config.max_tokens_cap if max_tokens is None else generation_config.cap_max_tokens(max_tokens)
    param = endpoint.prompt_param
    if prompt_len >= max_len:
        raise ApiError.invalid_param(
            param,
            f"This model's maximum context length is {max_len} tokens. However, your prompt has {prompt_len} tokens, "
            "leaving no room for completion tokens.",
        )
    if max_tokens is None:
        max_tokens = (
            max_len - prompt_len if endpoint.is_chat else min(DEFAULT_COMPLETION_MAX_TOKENS, max_len - prompt_len)
        )
    max_tokens = generation_config.cap_max_tokens(max_tokens)
    if prompt_len + max_tokens > max_len:
        raise ApiError.invalid_param(
            max_tokens_param or "max_tokens",
            f"This model's maximum context length is {max_len} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the {param}, {max_tokens} in the completion). "
            f"Please reduce the length of the {param} or completion.",
        )
    return max_tokens


def _check_logprobs(state: ServerState, common: CommonParams, sampling: dict) -> None:
    """vLLM's SamplingParams check against `--max-logprobs` (-1 counts as the
    whole vocabulary on both sides); puts the counts into `sampling`."""
    vocab = state.tokenizer.vocab_size
    limit = vocab if state.settings.max_logprobs == -1 else state.settings.max_logprobs
    for param, key, value in (
        ("logprobs", "logprobs_above_max", common.logprobs),
        ("prompt_logprobs", "prompt_logprobs_above_max", common.prompt_logprobs),
    ):
        if value is None:
            continue
        count = vocab if value == -1 else value
        if count > limit:
            raise RULES.refuse(param, key, count=count, limit=limit)
        sampling[param] = value


def submit(
    state: ServerState, headers: Headers, endpoint: Endpoint, prompt: list[int], common: CommonParams
) -> Submitted:
    """Checks the prompt, fills in `max_tokens` and the stop tokens, and
    sends the request to an engine."""
    started = time.monotonic()
    if state.engines.failure is not None:
        raise ApiError(503, state.engines.failure)
    param = endpoint.prompt_param
    if not prompt:
        raise ApiError.invalid_param(param, f"`{param}` must not be empty")
    vocab = state.tokenizer.vocab_size
    bad = next((t for t in prompt if t >= vocab), None)
    if bad is not None:
        raise ApiError.invalid_param(param, f"token id {bad} is out of vocabulary (vocab size {vocab})")
    sampling = dict(common.sampling)
    max_tokens = _limit_max_tokens(state, endpoint, len(prompt), common.max_tokens, common.max_tokens_param)
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
        # Checked again once max_tokens may have been defaulted: vLLM refuses min > max.
        check_min_tokens(common.sampling.get("min_tokens", 0), max_tokens)
    _check_vocabulary(common.stop_token_ids, "stop_token_ids", vocab)
    if common.logit_bias is not None:
        _check_vocabulary(list(common.logit_bias), "logit_bias", vocab)
        sampling["logit_bias"] = common.logit_bias
    if common.allowed_token_ids is not None and any(not 0 <= t < vocab for t in common.allowed_token_ids):
        raise RULES.refuse("allowed_token_ids", "allowed_token_ids_out_of_vocab")
    _check_logprobs(state, common, sampling)
    generation_config = state.settings.generation_config
    generation_config.fill_sampling_defaults(sampling)
    if common.ignore_eos:
        sampling["ignore_eos"] = True
    eos = state.tokenizer.eos_token_id
    sampling.update(generation_config.stop_token_fields(list(common.stop_token_ids), common.ignore_eos, eos))
    external_id = f"{endpoint.id_prefix}{_client_request_id(headers)}"
    request = EngineCoreRequest(
        request_id=f"{external_id}-{secrets.token_hex(4)}",
        prompt_token_ids=prompt,
        sampling_params=sampling,
        arrival_time=time.time(),
        external_req_id=external_id,
    )
    pinned = _pinned_rank(headers)
    children = child_requests(request, common.n)
    if state.settings.enable_log_requests:
        logger.info(
            "received request %s: prompt_tokens=%d max_tokens=%s temperature=%s stream=%s",
            ", ".join(c.request_id for c in children), len(prompt), max_tokens, sampling.get("temperature"),
            common.stream,
        )  # fmt: skip
    every_token = common.logprobs is not None or common.prompt_logprobs is not None
    generations: list[Generation] = []
    try:
        for child in children:
            stream = state.engines.submit(child, pinned)
            decoder = state.tokenizer.decoder(prompt, common.decode)
            generations.append(
                Generation(
                    stream, decoder, common.stop, len(prompt), state.metrics, started, every_token,
                    state.tokenizer.decode,
                )
            )  # fmt: skip
    except (RankOutOfRangeError, EngineUnavailableError) as e:
        for generation in generations:
            generation.close()
        if isinstance(e, RankOutOfRangeError):
            raise ApiError.invalid_param(DATA_PARALLEL_RANK_HEADER, str(e)) from None
        raise ApiError(503, str(e)) from None
    return Submitted(external_id, int(time.time()), generations)


def child_requests(request: EngineCoreRequest, n: int) -> list[EngineCoreRequest]:
    """The request itself when n is 1, else n child requests as vLLM's
    ParentRequest makes them: ids `{index}_{request_id}`, seeds `seed + index`."""
    if n == 1:
        return [request]
    seed = request.sampling_params.get("seed")
    children = []
    for index in range(n):
        sampling = dict(request.sampling_params)
        if seed is not None:
            sampling["seed"] = seed + index
        children.append(replace(request, request_id=f"{index}_{request.request_id}", sampling_params=sampling))
    return children
