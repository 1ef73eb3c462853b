"""`POST /v1/completions` and `POST /v1/chat/completions`, streamed or not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from vllm_rs.api_server.errors import ApiError, dumps
from vllm_rs.api_server.generation import GenerationError
from vllm_rs.api_server.params import (
    MAX_BODY_BYTES,
    CommonParams,
    Params,
    common_params,
    parse_decimal,
    parse_json_object,
)
from vllm_rs.api_server.sse import (
    ChatChunks,
    ChunkHeader,
    CompletionChunks,
    sse_response,
)
from vllm_rs.api_server.state import ServerState
from vllm_rs.api_server.submit import CHAT, COMPLETIONS, Submitted, check_model, submit
from vllm_rs.api_server.tokenizer import ChatMessage, ChatTemplateError


async def read_json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object; 413 past `MAX_BODY_BYTES`, 400 when not JSON."""
    too_large = ApiError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
    length = request.headers.get("content-length")
    if length is not None and parse_decimal(length, MAX_BODY_BYTES) is None:
        raise too_large  # llhttp only lets digits through: this is a huge length
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    return parse_json_object(b"".join(chunks))


def json_response(value: Any) -> Response:
    """A 200 JSON response written like the Rust frontend's."""
    return Response(dumps(value), media_type="application/json")


def _prompt_tokens(state: ServerState, p: Params) -> list[int]:
    bad = ApiError.invalid_param(
        "prompt", "`prompt` must be a string, a list of token ids, or a list holding one of those"
    )

    def single(value: Any) -> list[int]:
        if isinstance(value, str):
            return state.tokenizer.encode(value)
        if isinstance(value, list) and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in value
        ):
            return value
        raise bad

    prompt = p.get("prompt")
    if prompt is None:
        raise ApiError.invalid_param("prompt", "`prompt` is required")
    if isinstance(prompt, list) and any(isinstance(i, (str, list)) for i in prompt):
        if len(prompt) != 1:
            raise ApiError.invalid_param("prompt", "only one prompt per request is supported")
        return single(prompt[0])
    return single(prompt)


def _messages(p: Params) -> list[ChatMessage]:
    items = p.get("messages")
    if items is None:
        raise ApiError.invalid_param("messages", "`messages` is required")
    if not isinstance(items, list):
        raise ApiError.invalid_param("messages", "`messages` must be a list")
    if not items:
        raise ApiError.invalid_param("messages", "`messages` must not be empty")
    messages = []
    for i, item in enumerate(items):
        role = item.get("role") if isinstance(item, dict) else None
        if not isinstance(role, str):
            raise ApiError.invalid_param("messages", f"messages[{i}].role must be a string")
        content = item.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise ApiError.invalid_param("messages", f"messages[{i}].content: only text parts are supported")
                texts.append(part["text"])
            content = "".join(texts)
        elif not isinstance(content, str):
            raise ApiError.invalid_param("messages", f"messages[{i}].content must be a string or a list of parts")
        messages.append(ChatMessage(role, content))
    return messages


@dataclass(frozen=True)
class AnswerShape:
    """How one endpoint answers: object names, stream chunks, the choice."""

    object: str
    chunk_object: str
    chunks: type[CompletionChunks]
    choice_field: Callable[[str], dict[str, Any]]


COMPLETION_SHAPE = AnswerShape("text_completion", "text_completion", CompletionChunks, lambda text: {"text": text})
CHAT_SHAPE = AnswerShape(
    "chat.completion",
    "chat.completion.chunk",
    ChatChunks,
    lambda text: {"message": {"role": "assistant", "content": text}},
)


async def _answer(state: ServerState, submitted: Submitted, common: CommonParams, shape: AnswerShape) -> Response:
    """Streams the generation as SSE, or collects it into one JSON answer."""
    model = state.settings.primary_model_name
    if common.stream:
        header = ChunkHeader(submitted.id, shape.chunk_object, submitted.created, model)
        return sse_response(submitted.generation, shape.chunks(header), common.include_usage)
    generation = submitted.generation
    try:
        text, finish = await generation.collect()
    except GenerationError as e:
        raise ApiError(e.status, str(e)) from None
    finally:
        generation.close()
    choice = {"index": 0, **shape.choice_field(text), "logprobs": None,
              "finish_reason": finish.reason.openai_name, "stop_reason": finish.stop_reason}  # fmt: skip
    return json_response({
        "id": submitted.id,
        "object": shape.object,
        "created": submitted.created,
        "model": model,
        "choices": [choice],
        "usage": generation.usage(),
    })  # fmt: skip


async def create_completion(request: Request) -> Response:
    """Handles a completion request."""
    state: ServerState = request.app.state.server
    p = Params(await read_json_object(request))
    common = common_params(p, ("max_tokens",))
    check_model(state, common.model)
    p.only("echo", False, "echo is not supported")
    p.only("suffix", None, "suffix is not supported")
    if p.get("logprobs") is not None:
        raise ApiError.invalid_param("logprobs", "`logprobs` is not supported")
    submitted = submit(state, request.headers, COMPLETIONS, _prompt_tokens(state, p), common)
    return await _answer(state, submitted, common, COMPLETION_SHAPE)


async def create_chat_completion(request: Request) -> Response:
    """Handles a chat completion request."""
    state: ServerState = request.app.state.server
    p = Params(await read_json_object(request))
    common = common_params(p, ("max_completion_tokens", "max_tokens"))
    check_model(state, common.model)
    logprobs = p.get("logprobs")
    if logprobs is not None and logprobs is not False:
        raise ApiError.invalid_param("logprobs", "`logprobs` is not supported")
    tools = p.get("tools")
    if tools is not None and not (isinstance(tools, list) and not tools):
        raise ApiError.invalid_param("tools", "`tools` is not supported")
    response_format = p.get("response_format")
    if response_format is not None and not (
        isinstance(response_format, dict) and response_format.get("type") == "text"
    ):
        raise ApiError.invalid_param("response_format", "only the `text` response format is supported")
    messages = _messages(p)
    add_generation_prompt = p.bool("add_generation_prompt")
    try:
        prompt_text = state.tokenizer.apply_chat_template(
            messages, True if add_generation_prompt is None else add_generation_prompt
        )
    except ChatTemplateError as e:  # the template refused the messages, or there is none
        raise ApiError.invalid_param("messages", f"cannot apply the chat template: {e}") from None
    # The template writes BOS and the like itself.
    prompt = state.tokenizer.encode(prompt_text, add_special_tokens=False)
    submitted = submit(state, request.headers, CHAT, prompt, common)
    return await _answer(state, submitted, common, CHAT_SHAPE)
