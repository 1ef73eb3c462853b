"""What `/v1/completions` and `/v1/chat/completions` share: the model check,
length checks, ids, EOS handling and submission to an engine."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

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
    """A request running in an engine."""

    id: str
    created: int
    generation: Generation


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
    max_len = state.max_model_len
    if max_len is None:
        return DEFAULT_COMPLETION_MAX_TOKENS if max_tokens is None and not endpoint.is_chat else max_tokens
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
    if prompt_len + max_tokens > max_len:
        raise ApiError.invalid_param(
            max_tokens_param or "max_tokens",
            f"This model's maximum context length is {max_len} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the {param}, {max_tokens} in the completion). "
            f"Please reduce the length of the {param} or completion.",
        )
    return max_tokens


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
    all_stop = list(common.stop_token_ids)
    sampling["stop_token_ids"] = list(common.stop_token_ids)
    if common.ignore_eos:
        sampling["ignore_eos"] = True
    else:
        eos = state.tokenizer.eos_token_id
        if eos is not None:
            sampling["_eos_token_id"] = eos
            if eos not in all_stop:
                all_stop.append(eos)
    sampling["_all_stop_token_ids"] = all_stop
    external_id = f"{endpoint.id_prefix}{_client_request_id(headers)}"
    request = EngineCoreRequest(
        request_id=f"{external_id}-{secrets.token_hex(4)}",
        prompt_token_ids=prompt,
        sampling_params=sampling,
        arrival_time=time.time(),
        external_req_id=external_id,
    )
    pinned = _pinned_rank(headers)
    if state.settings.enable_log_requests:
        logger.info(
            "received request %s: prompt_tokens=%d max_tokens=%s temperature=%s stream=%s",
            request.request_id, len(prompt), max_tokens, sampling.get("temperature"), common.stream,
        )  # fmt: skip
    try:
        stream = state.engines.submit(request, pinned)
    except RankOutOfRangeError as e:
        raise ApiError.invalid_param(DATA_PARALLEL_RANK_HEADER, str(e)) from None
    except EngineUnavailableError as e:
        raise ApiError(503, str(e)) from None
    decoder = state.tokenizer.decoder(prompt, common.decode)
    generation = Generation(stream, decoder, common.stop, len(prompt), state.metrics, started)
    return Submitted(external_id, int(time.time()), generation)
