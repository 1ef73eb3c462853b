"""`POST /v1/completions` and `POST /v1/chat/completions`, streamed or not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from vllm_rs.api_server.chat_tools import ChatTools, finish_reason, output_parser, read_chat_tools
from vllm_rs.api_server.chat_tools import template_messages_extra as _template_extra
from vllm_rs.api_server.errors import ApiError, dumps
from vllm_rs.api_server.generation import Delta, GenerationError, total_usage
from vllm_rs.api_server.logprobs import TokenStrings
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
from vllm_rs.api_server.rendering import CompletionPieces, Echo, Rendering
from vllm_rs.api_server.request_rules import RULES
from vllm_rs.api_server.sse import (
    ChatChunks,
    ChunkHeader,
    CompletionChunks,
    ParsedChatChunks,
    sse_response,
)
from vllm_rs.api_server.state import ServerState
from vllm_rs.api_server.structured_outputs import read_structured_outputs, wire_params
from vllm_rs.api_server.submit import CHAT, COMPLETIONS, Submitted, check_model, submit
from vllm_rs.api_server.template_kwargs import (
    apply_reasoning_effort,
    read_reasoning_effort,
    read_template_kwargs,
    thinking_enabled,
)
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
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None


class PartInput(RequestModel):
    """One content part; only text parts are supported."""

    type: str
    text: str | None = None


class MessageInput(RequestModel):
    """One chat message as sent."""

    role: str
    content: str | list[PartInput] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatInput(RequestModel):
    """The fields only chat has, as sent."""

    messages: list[MessageInput] | None = None
    max_completion_tokens: Int64 | None = None
    logprobs: bool | None = None
    top_logprobs: Int64 | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    reasoning_effort: Any = None


def parse_completion(body: dict[str, Any]) -> tuple[CommonParams, str | list[int], bool, bool]:
    """Every parameter of a completion body checked: the shared ones, the
    prompt (text or token ids), `echo`, and whether the prompt is echoed
    alone (`echo` with `max_tokens` 0); a 400 naming the first bad one."""
    c = parse_model(CompletionInput, body)
    s = parse_model(SamplingInput, body)
    if c.logprobs is not None:
        RULES.check_number("logprobs", c.logprobs)
    echo = bool(c.echo)
    # vLLM's `echo_without_generation`: the engine is asked for one token;
    # without echo, 0 stays a 400 (max_tokens must be at least 1).
    prompt_only = echo and s.max_tokens == 0
    if prompt_only:
        s.max_tokens = 1
    common = common_params(s, None if s.max_tokens is None else ("max_tokens", s.max_tokens))
    common.logprobs = c.logprobs
    if echo and common.prompt_logprobs is None:
        # vLLM scores an echoed prompt as it scores the completion.
        common.prompt_logprobs = c.logprobs
    if c.suffix is not None:
        raise RULES.refuse("suffix", "suffix_unsupported")
    prompt = c.prompt
    if prompt is None or prompt == "":
        raise RULES.refuse("prompt", "prompt_missing")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise RULES.refuse("prompt", "one_prompt_only")
        prompt = prompt[0]
    _constrain(common, body)
    return common, prompt, echo, prompt_only  # type: ignore[return-value]


def _constrain(common: CommonParams, body: dict[str, Any]) -> None:
    """Puts the request's structured outputs (`response_format`,
    `structured_outputs`) into its sampling params, as vLLM encodes them."""
    fields, _ = read_structured_outputs(body)
    if fields is not None:
        common.sampling["structured_outputs"] = wire_params(fields)


def parse_chat(body: dict[str, Any]) -> tuple[CommonParams, list[ChatMessage], bool, str | None]:
    """Every parameter of a chat body checked: the shared ones, the messages
    (each content flattened to text), `add_generation_prompt` and
    `reasoning_effort`; a 400 naming the first bad one."""
    c = parse_model(ChatInput, body)
    s = parse_model(SamplingInput, body)
    if c.top_logprobs is not None:
        RULES.check_number("top_logprobs", c.top_logprobs)
        if (c.top_logprobs == -1 or c.top_logprobs > 0) and not c.logprobs:
            raise RULES.refuse("top_logprobs", "top_logprobs_without_logprobs")
    if c.continue_final_message:
        key = "continue_with_generation_prompt" if c.add_generation_prompt else "continue_final_message_unsupported"
        raise RULES.refuse("continue_final_message", key)
    # vLLM reads max_completion_tokens when given, else max_tokens.
    if c.max_completion_tokens is not None:
        max_tokens: tuple[str, int] | None = ("max_completion_tokens", c.max_completion_tokens)
    else:
        max_tokens = None if s.max_tokens is None else ("max_tokens", s.max_tokens)
    common = common_params(s, max_tokens)
    if c.logprobs:
        common.logprobs = c.top_logprobs or 0
    _constrain(common, body)
    messages = flatten_messages(c.messages)
    reasoning_effort = read_reasoning_effort(c.reasoning_effort, "reasoning_effort")
    return common, messages, True if c.add_generation_prompt is None else c.add_generation_prompt, reasoning_effort


def flatten_messages(items: list[MessageInput] | None) -> list[ChatMessage]:
    """The conversation, each content flattened to text (with what templates
    get beyond role and content); a 400 naming `messages` when it is
    missing, empty or holds a part that is not text."""
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
        messages.append(ChatMessage(item.role, content, _template_extra(item) or None))
    return messages


def _completion_choice(whole: Delta, rendering: Rendering) -> dict[str, Any]:
    text, logprobs = CompletionPieces(rendering).piece(whole)
    choice = {"text": text, "logprobs": logprobs}
    if rendering.prompt_logprobs:
        choice["prompt_logprobs"] = rendering.prompt_logprobs_json(whole.prompt_logprobs)
    return choice


def _chat_choice(whole: Delta, rendering: Rendering) -> dict[str, Any]:
    message = {"role": "assistant", "content": whole.text}
    return {"message": message, "logprobs": rendering.chat_logprobs(whole)}


@dataclass(frozen=True)
class AnswerShape:
    """How one endpoint answers: object names, stream chunks, the choice."""

    object: str
    chunk_object: str
    #: Makes the stream writer of choice `index`: (header, rendering, index).
    chunks: Callable[[ChunkHeader, Rendering, int], CompletionChunks]
    #: The body of a whole choice; a `finish_reason` in it overrides the engine's.
    choice: Callable[[Delta, Rendering], dict[str, Any]]
    #: Whether prompt logprobs go on the response (chat) rather than the choice.
    prompt_logprobs_on_response: bool


COMPLETION_SHAPE = AnswerShape("text_completion", "text_completion", CompletionChunks, _completion_choice, False)
CHAT_SHAPE = AnswerShape("chat.completion", "chat.completion.chunk", ChatChunks, _chat_choice, True)


def _rendering(state: ServerState, common: CommonParams, echo: Echo | None = None) -> Rendering:
    as_ids = common.return_tokens_as_token_ids
    return Rendering(
        strings=TokenStrings(
            state.tokenizer.decode, state.settings.return_tokens_as_token_ids if as_ids is None else as_ids
        ),
        logprobs=common.logprobs,
        echo=echo,
        prompt_logprobs=common.prompt_logprobs is not None,
    )


async def _answer(
    state: ServerState, submitted: Submitted, common: CommonParams, shape: AnswerShape, rendering: Rendering
) -> Response:
    """Streams the generation as SSE, or collects it into one JSON answer."""
    model = state.settings.primary_model_name
    if common.stream:
        header = ChunkHeader(submitted.id, shape.chunk_object, submitted.created, model)
        writers = [shape.chunks(header, rendering, index) for index in range(len(submitted.generations))]
        return sse_response(submitted.generations, writers, common.include_usage)
    generations = submitted.generations
    tasks = [asyncio.ensure_future(generation.collect()) for generation in generations]
    try:
        wholes = await asyncio.gather(*tasks)
    except GenerationError as e:
        raise ApiError(e.status, str(e)) from None
    finally:
        for task in tasks:
            task.cancel()  # the other choices, when one failed
        for generation in generations:
            generation.close()
    choices = []
    for index, whole in enumerate(wholes):
        finish = whole.finish
        assert finish is not None  # collect() returns finished generations only
        body = shape.choice(whole, rendering)  # may name the finish itself (a tool call)
        choices.append({"index": index, **body, "finish_reason": body.get("finish_reason", finish.reason.openai_name),
                        "stop_reason": finish.stop_reason})  # fmt: skip
    answer = {
        "id": submitted.id,
        "object": shape.object,
        "created": submitted.created,
        "model": model,
        "choices": choices,
        "usage": total_usage(generations),
    }
    whole = wholes[0]
    if shape.prompt_logprobs_on_response and rendering.prompt_logprobs:
        answer["prompt_logprobs"] = rendering.prompt_logprobs_json(whole.prompt_logprobs)
    return json_response(answer)


async def create_completion(request: Request) -> Response:
    """Handles a completion request."""
    state: ServerState = request.app.state.server
    common, prompt, echo, prompt_only = parse_completion(await read_json_object(request))
    check_model(state, common.model)
    prompt_tokens = state.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    submitted = submit(state, request.headers, COMPLETIONS, prompt_tokens, common)
    echoed = None
    if echo:
        text = prompt if isinstance(prompt, str) else state.tokenizer.decode(prompt)
        echoed = Echo(text, prompt_tokens, prompt_only)
    return await _answer(state, submitted, common, COMPLETION_SHAPE, _rendering(state, common, echoed))


def _parsed_chat_shape(parser: Any, tools: ChatTools, reasoning_parser: str | None) -> AnswerShape:
    """The chat shape whose text goes through the request's output parser
    (reasoning, tool calls), streamed or whole, each choice on its own."""

    def named_finish(reason: str, called: bool) -> str:
        return finish_reason(reason, tools, called)

    def chunks(header: ChunkHeader, rendering: Rendering, index: int) -> CompletionChunks:
        return ParsedChatChunks(header, rendering, parser.stream(), named_finish, index)

    def choice(whole: Delta, rendering: Rendering) -> dict[str, Any]:
        reasoning, content, calls = parser.parse(whole.text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning_parser is not None:
            message["reasoning"] = reasoning
        if calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
            ]
        assert whole.finish is not None  # collect() returns finished generations only
        finish = named_finish(whole.finish.reason.openai_name, bool(calls))
        return {"message": message, "logprobs": rendering.chat_logprobs(whole), "finish_reason": finish}

    return AnswerShape(CHAT_SHAPE.object, CHAT_SHAPE.chunk_object, chunks, choice, True)


async def create_chat_completion(request: Request) -> Response:
    """Handles a chat completion request."""
    state: ServerState = request.app.state.server
    body = await read_json_object(request)
    common, messages, add_generation_prompt, reasoning_effort = parse_chat(body)
    tools = read_chat_tools(body, state.settings.parsers)
    template_kwargs = read_template_kwargs(body, state.settings.default_chat_template_kwargs)
    template_kwargs = apply_reasoning_effort(
        template_kwargs, body, reasoning_effort, state.settings.reasoning_effort_map
    )
    if tools.constraint is not None:
        # A forced tool choice replaces the request's own constraint, as in vLLM.
        common.sampling["structured_outputs"] = wire_params(tools.constraint)
    check_model(state, common.model)
    try:
        prompt_text = state.tokenizer.apply_chat_template(messages, add_generation_prompt, tools.tools, template_kwargs)
    except ChatTemplateError as e:  # the template refused the messages, or there is none
        raise ApiError.invalid_param("messages", f"cannot apply the chat template: {e}") from None
    # The template writes BOS and the like itself.
    prompt = state.tokenizer.encode(prompt_text, add_special_tokens=False)
    submitted = submit(state, request.headers, CHAT, prompt, common)
    parser = output_parser(tools, state.settings.parsers, thinking_enabled(template_kwargs))
    shape = CHAT_SHAPE if parser is None else _parsed_chat_shape(parser, tools, state.settings.parsers.reasoning_parser)
    return await _answer(state, submitted, common, shape, _rendering(state, common))
