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
    Int64,
    RequestModel,
    SamplingInput,
    TokenId,
    common_params,
    parse_decimal,
    parse_json_object,
    parse_model,
)
from vllm_rs.api_server.request_rules import RULES
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


class CompletionInput(RequestModel):
    """The fields only completions have, as sent."""

    prompt: str | list[TokenId] | list[str] | list[list[TokenId]] | None = None
    echo: bool | None = None
    suffix: str | None = None
    logprobs: Int64 | None = None


class PartInput(RequestModel):
    """One content part; only text parts are supported."""

    type: str
    text: str | None = None


class MessageInput(RequestModel):
    """One chat message as sent."""

    role: str
    content: str | list[PartInput] | None = None


class ResponseFormatInput(RequestModel):
    """`response_format` as sent: only its type matters."""

    type: str | None = None


class ChatInput(RequestModel):
    """The fields only chat has, as sent."""

    messages: list[MessageInput] | None = None
    max_completion_tokens: Int64 | None = None
    logprobs: bool | None = None
    top_logprobs: Int64 | None = None
    tools: list[Any] | None = None
    response_format: ResponseFormatInput | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None


def parse_completion(body: dict[str, Any]) -> tuple[CommonParams, str | list[int]]:
    """Every parameter of a completion body checked: the shared ones and the
    prompt (text or token ids); a 400 naming the first bad one."""
    c = parse_model(CompletionInput, body)
    s = parse_model(SamplingInput, body)
    if c.logprobs is not None:
        RULES.check_number("logprobs", c.logprobs)
        raise RULES.refuse("logprobs", "logprobs_unsupported", param="logprobs")
    common = common_params(s, None if s.max_tokens is None else ("max_tokens", s.max_tokens))
    if c.echo:
        raise RULES.refuse("echo", "echo_unsupported")
    if c.suffix is not None:
        raise RULES.refuse("suffix", "suffix_unsupported")
    prompt = c.prompt
    if prompt is None or prompt == "":
        raise RULES.refuse("prompt", "prompt_missing")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise RULES.refuse("prompt", "one_prompt_only")
        prompt = prompt[0]
    return common, prompt  # type: ignore[return-value]


def parse_chat(body: dict[str, Any]) -> tuple[CommonParams, list[ChatMessage], bool]:
    """Every parameter of a chat body checked: the shared ones, the messages
    (each content flattened to text) and `add_generation_prompt`; a 400
    naming the first bad one."""
    c = parse_model(ChatInput, body)
    s = parse_model(SamplingInput, body)
    if c.top_logprobs is not None:
        RULES.check_number("top_logprobs", c.top_logprobs)
        if (c.top_logprobs == -1 or c.top_logprobs > 0) and not c.logprobs:
            raise RULES.refuse("top_logprobs", "top_logprobs_without_logprobs")
    if c.logprobs:
        raise RULES.refuse("logprobs", "logprobs_unsupported", param="logprobs")
    if c.continue_final_message:
        key = "continue_with_generation_prompt" if c.add_generation_prompt else "continue_final_message_unsupported"
        raise RULES.refuse("continue_final_message", key)
    # vLLM reads max_completion_tokens when given, else max_tokens.
    if c.max_completion_tokens is not None:
        max_tokens: tuple[str, int] | None = ("max_completion_tokens", c.max_completion_tokens)
    else:
        max_tokens = None if s.max_tokens is None else ("max_tokens", s.max_tokens)
    common = common_params(s, max_tokens)
    if c.tools:
        raise RULES.refuse("tools", "tools_unsupported")
    if c.response_format is not None and c.response_format.type != "text":
        raise RULES.refuse("response_format", "response_format_unsupported")
    messages = flatten_messages(c.messages)
    return common, messages, True if c.add_generation_prompt is None else c.add_generation_prompt


def flatten_messages(items: list[MessageInput] | None) -> list[ChatMessage]:
    """The conversation, each content flattened to text; a 400 naming
    `messages` when it is missing, empty or holds a part that is not text."""
    if items is None:
        raise RULES.refuse("messages", "messages_missing")
    if not items:
        raise RULES.refuse("messages", "messages_empty")
    messages = []
    for i, item in enumerate(items):
        content = item.content
        if content is None:
            content = ""
        elif isinstance(content, list):
            if not all(part.type == "text" and part.text is not None for part in content):
                raise RULES.refuse("messages", "text_parts_only", index=i)
            content = "".join(part.text for part in content)  # type: ignore[misc]
        messages.append(ChatMessage(item.role, content))
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
    common, prompt = parse_completion(await read_json_object(request))
    check_model(state, common.model)
    prompt_tokens = state.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    submitted = submit(state, request.headers, COMPLETIONS, prompt_tokens, common)
    return await _answer(state, submitted, common, COMPLETION_SHAPE)


async def create_chat_completion(request: Request) -> Response:
    """Handles a chat completion request."""
    state: ServerState = request.app.state.server
    common, messages, add_generation_prompt = parse_chat(await read_json_object(request))
    check_model(state, common.model)
    try:
        prompt_text = state.tokenizer.apply_chat_template(messages, add_generation_prompt)
    except ChatTemplateError as e:  # the template refused the messages, or there is none
        raise ApiError.invalid_param("messages", f"cannot apply the chat template: {e}") from None
    # The template writes BOS and the like itself.
    prompt = state.tokenizer.encode(prompt_text, add_special_tokens=False)
    submitted = submit(state, request.headers, CHAT, prompt, common)
    return await _answer(state, submitted, common, CHAT_SHAPE)
