"""`POST /v1/responses`, as vLLM 0.33 serves it without a response store:
text or message input, one assistant message of text out, unstreamed (the
response object) or streamed as vLLM's typed events (`response.created` ...
`response.completed`). `chat_template_kwargs` and `reasoning.effort` reach
the chat template as in chat completions. What this server does not do
(tools, background mode, stored responses, structured output) is a 400
naming the field, never dropped."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from vllm_rs.api_server.errors import ApiError, dumps
from vllm_rs.api_server.generation import Finish, Generation, GenerationError
from vllm_rs.api_server.openai_routes import json_response, read_json_object
from vllm_rs.api_server.params import Int64, RequestModel, SamplingInput, common_params, parse_model
from vllm_rs.api_server.request_rules import RULES
from vllm_rs.api_server.state import ServerState
from vllm_rs.api_server.submit import RESPONSES, check_model, submit
from vllm_rs.api_server.template_kwargs import apply_reasoning_effort, read_reasoning_effort, read_template_kwargs
from vllm_rs.api_server.tokenizer import ChatMessage, ChatTemplateError
from vllm_rs.cli_args import REASONING_EFFORTS
from vllm_rs.engine.protocol import FinishReason


class TextFormat(RequestModel):
    """`text.format`: only its type matters."""

    type: str


class TextConfig(RequestModel):
    """`text`."""

    format: TextFormat | None = None


class ResponsesInput(RequestModel):
    """The fields only the responses API has, as sent."""

    input: Any = None
    instructions: str | None = None
    max_output_tokens: Int64 | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    background: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    include: list[str] | None = None
    text: TextConfig | None = None
    truncation: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: Int64 | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    include_stop_str_in_output: bool | None = None
    enable_response_messages: bool | None = None
    reasoning: Any = None
    prompt: Any = None
    previous_input_messages: Any = None
    structured_outputs: Any = None
    kv_transfer_params: Any = None
    vllm_xargs: Any = None
    mm_processor_kwargs: Any = None
    media_io_kwargs: Any = None


#: Fields refused when given (not null), beyond the ones with their own rule.
UNSUPPORTED = (
    "previous_input_messages",
    "structured_outputs",
    "kv_transfer_params",
    "vllm_xargs",
    "mm_processor_kwargs",
    "media_io_kwargs",
)


def _check_supported(r: ResponsesInput) -> None:
    if r.prompt is not None:
        raise RULES.refuse("prompt", "prompt_template_unsupported")
    if r.background:
        raise RULES.refuse("background", "background_store_false" if r.store is False else "background_without_store")
    if r.previous_response_id is not None:
        # vLLM without its response store finds no earlier response.
        raise ApiError(404, RULES.message("response_not_found", response_id=r.previous_response_id), "response_id")
    if r.tools:
        raise RULES.refuse("tools", "field_unsupported", param="tools")
    for param in UNSUPPORTED:
        if getattr(r, param) is not None:
            raise RULES.refuse(param, "field_unsupported", param=param)
    for param in ("include_stop_str_in_output", "enable_response_messages"):
        if getattr(r, param):
            raise RULES.refuse(param, "field_unsupported", param=param)
    if isinstance(r.tool_choice, str) and r.tool_choice not in ("auto", "none"):
        raise RULES.refuse("tool_choice", "tool_choice_without_tools", tool_choice=r.tool_choice)
    if r.tool_choice is not None and not isinstance(r.tool_choice, str):
        raise RULES.refuse("tool_choice", "field_unsupported", param="tool_choice")
    if r.include:
        raise RULES.refuse("include", "include_unsupported", value=dumps(r.include[0]))
    if r.text is not None and r.text.format is not None and r.text.format.type != "text":
        raise RULES.refuse("text", "text_format_unsupported")
    if r.truncation == "auto":
        raise RULES.refuse("truncation", "truncation_unsupported")
    if r.truncation not in (None, "disabled"):
        raise RULES.wrong_type("truncation")


#: The fields of `reasoning`, in the order vLLM writes them, each with the
#: values it may take (None: any string).
REASONING_FIELDS: dict[str, tuple[str, ...] | None] = {
    "context": ("auto", "current_turn", "all_turns"),
    "effort": REASONING_EFFORTS,
    "generate_summary": ("auto", "concise", "detailed"),
    "mode": None,
    "summary": ("auto", "concise", "detailed"),
}


def read_reasoning(value: Any) -> tuple[dict[str, Any] | None, str | None]:
    """`reasoning` checked as OpenAI's `Reasoning` model reads it, and as
    vLLM's response object repeats it (every field, None when not given),
    with its effort; a 400 naming the first bad field. vLLM acts on `effort`
    only."""
    if value is None:
        return None, None
    if not isinstance(value, dict):
        raise RULES.wrong_type("reasoning")
    echoed = {}
    for name, allowed in REASONING_FIELDS.items():
        field_value = value.get(name)
        valid = field_value is None or (isinstance(field_value, str) and (allowed is None or field_value in allowed))
        if not valid:
            raise RULES.wrong_type(f"reasoning.{name}")
        echoed[name] = field_value
    return echoed, read_reasoning_effort(value.get("effort"), "reasoning.effort")


def _input_message(item: Any) -> ChatMessage | None:
    """One input item as a chat message, when it is a message with text content."""
    if not isinstance(item, dict) or item.get("type") not in (None, "message"):
        return None
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        return None
    content = item.get("content")
    if isinstance(content, str):
        return ChatMessage(role, content)
    if not isinstance(content, list):
        return None
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text"):
            return None
        if not isinstance(part.get("text"), str):
            return None
        texts.append(part["text"])
    return ChatMessage(role, "".join(texts))


def input_messages(instructions: str | None, value: Any) -> list[ChatMessage]:
    """The conversation: `instructions` as the system message, then `input`
    (a user message, or messages whose content is text or text parts)."""
    messages = [ChatMessage("system", instructions)] if instructions else []
    if value is None:
        raise RULES.refuse("input", "input_missing")
    if isinstance(value, str):
        messages.append(ChatMessage("user", value))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            message = _input_message(item)
            if message is None:
                raise RULES.refuse("input", "input_item_unsupported", index=index)
            messages.append(message)
    else:
        raise RULES.wrong_type("input")
    if not messages:
        raise RULES.refuse("input", "input_missing")
    return messages


@dataclass
class Answer:
    """What every response object of one request shares."""

    request: ResponsesInput
    sampling: SamplingInput
    #: `reasoning` as the response object repeats it.
    reasoning: dict[str, Any] | None
    id: str
    created_at: int
    model: str
    max_tokens: int | None

    def object(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        """The response object with `status`, `output` and `usage`, as
        vLLM's `ResponsesResponse.from_request` fills it."""
        r, s = self.request, self.sampling
        text = {"format": {"type": "text"}} if r.text is not None and r.text.format is not None else None
        return {
            "id": self.id,
            "created_at": self.created_at,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": r.instructions,
            "metadata": r.metadata,
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": True if r.parallel_tool_calls is None else r.parallel_tool_calls,
            "temperature": 1.0 if s.temperature is None else s.temperature,
            "tool_choice": "none",
            "tools": [],
            "top_p": 1.0 if s.top_p is None else s.top_p,
            "background": False,
            "max_output_tokens": self.max_tokens,
            "max_tool_calls": r.max_tool_calls,
            "previous_response_id": None,
            "prompt": None,
            "prompt_cache_options": None,
            "prompt_cache_key": r.prompt_cache_key,
            "prompt_cache_retention": None,
            "reasoning": self.reasoning,
            "safety_identifier": r.safety_identifier,
            "service_tier": r.service_tier or "auto",
            "status": status,
            "text": text,
            "top_logprobs": None,
            "truncation": r.truncation or "disabled",
            "usage": usage,
            "user": r.user,
            "presence_penalty": 0.0 if s.presence_penalty is None else s.presence_penalty,
            "frequency_penalty": 0.0 if s.frequency_penalty is None else s.frequency_penalty,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }


def _status(finish: Finish) -> str:
    """`incomplete` when the output hit its token limit, else `completed`
    (the response's and the message item's status alike)."""
    return "incomplete" if finish.reason == FinishReason.LENGTH else "completed"


def _item_id() -> str:
    return f"msg_{secrets.token_hex(8)}"


def _text_part(text: str, logprobs: list | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    """The assistant message holding `text` (no content part when empty, as vLLM)."""
    content = [_text_part(text, None)] if text else []
    return {"id": item_id, "content": content, "role": "assistant", "status": status, "type": "message", "phase": None}


def _usage(generation: Generation) -> dict[str, Any]:
    """The usage object: one turn, nothing cached, no reasoning or tool tokens."""
    u = generation.usage()
    prompt, completion = u["prompt_tokens"], u["completion_tokens"]
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0,
                                 "input_tokens_per_turn": [prompt], "cached_tokens_per_turn": [0]},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                  "output_tokens_per_turn": [completion], "tool_output_tokens_per_turn": [0]},
        "total_tokens": u["total_tokens"],
    }  # fmt: skip


class _Events:
    """Numbers events and writes them as `event: TYPE` / `data: JSON`."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def __call__(self, event: dict[str, Any]) -> bytes:
        event["sequence_number"] = self.sequence_number
        self.sequence_number += 1
        return f"event: {event['type']}\ndata: {dumps(event)}\n\n".encode()


async def _stream(generation: Generation, answer: Answer) -> AsyncIterator[bytes]:
    events = _Events()
    try:
        opening = answer.object("in_progress", [], None)
        yield events({"response": opening, "type": "response.created"})
        yield events({"response": opening, "type": "response.in_progress"})
        item_id: str | None = None
        text = ""
        while True:
            try:
                delta = await generation.next_delta()
            except GenerationError as e:
                error = ApiError(e.status, str(e))
                yield events({"code": str(error.status), "message": error.message, "param": None, "type": "error"})
                return
            if delta is None:
                return
            if delta.text:
                if item_id is None:
                    item_id = _item_id()
                    item = {"id": item_id, "content": [], "role": "assistant", "status": "in_progress",
                            "type": "message", "phase": None}  # fmt: skip
                    yield events({"item": item, "output_index": 0, "type": "response.output_item.added"})
                    yield events({"content_index": 0, "item_id": item_id, "output_index": 0,
                                  "part": _text_part("", []), "type": "response.content_part.added"})  # fmt: skip
                text += delta.text
                yield events({"content_index": 0, "delta": delta.text, "item_id": item_id, "logprobs": [],
                              "output_index": 0, "type": "response.output_text.delta"})  # fmt: skip
            if delta.finish is not None:
                output = []
                status = _status(delta.finish)
                if item_id is not None:
                    yield events({"content_index": 0, "item_id": item_id, "logprobs": [], "output_index": 0,
                                  "text": text, "type": "response.output_text.done"})  # fmt: skip
                    yield events({"content_index": 0, "item_id": item_id, "output_index": 0,
                                  "part": _text_part(text, None), "type": "response.content_part.done"})  # fmt: skip
                    item = _message_item(item_id, text, status)
                    yield events({"item": item, "output_index": 0, "type": "response.output_item.done"})
                    output.append(item)
                final = answer.object(status, output, _usage(generation))
                kind = "response.incomplete" if status == "incomplete" else "response.completed"
                yield events({"response": final, "type": kind})
                return
    finally:
        generation.close()


async def create_response(request: Request) -> Response:
    """Handles a responses request, streamed or not."""
    state: ServerState = request.app.state.server
    body = await read_json_object(request)
    r = parse_model(ResponsesInput, body)
    s = parse_model(SamplingInput, body)
    _check_supported(r)
    messages = input_messages(r.instructions, r.input)
    reasoning, effort = read_reasoning(r.reasoning)
    settings = state.settings
    template_kwargs = read_template_kwargs(body, settings.default_chat_template_kwargs)
    template_kwargs = apply_reasoning_effort(template_kwargs, body, effort, settings.reasoning_effort_map)
    common = common_params(s, None if r.max_output_tokens is None else ("max_output_tokens", r.max_output_tokens))
    common.n = 1  # vLLM's Responses API has no `n`: one choice
    check_model(state, common.model)
    try:
        prompt_text = state.tokenizer.apply_chat_template(messages, True, None, template_kwargs)
    except ChatTemplateError as e:
        raise ApiError.invalid_param("input", f"cannot apply the chat template: {e}") from None
    prompt = state.tokenizer.encode(prompt_text, add_special_tokens=False)
    # vLLM caps max_output_tokens at the room the prompt leaves instead of refusing it.
    max_len = state.max_model_len
    if max_len is not None and len(prompt) < max_len:
        room = max_len - len(prompt)
        common.max_tokens = room if common.max_tokens is None else min(common.max_tokens, room)
    submitted = submit(state, request.headers, RESPONSES, prompt, common)
    answer = Answer(
        r, s, reasoning, submitted.id, submitted.created, state.settings.primary_model_name, common.max_tokens
    )
    (generation,) = submitted.generations  # a response has one choice
    if common.stream:
        return StreamingResponse(
            _stream(generation, answer),
            media_type="text/event-stream; charset=utf-8",
            headers={"cache-control": "no-cache"},
        )
    try:
        whole = await generation.collect()
    except GenerationError as e:
        raise ApiError(e.status, str(e)) from None
    finally:
        generation.close()
    finish = whole.finish
    assert finish is not None  # collect() returns finished generations only
    # Unstreamed, vLLM always answers one message item (empty content when there is no text).
    output = [_message_item(_item_id(), whole.text, _status(finish))]
    return json_response(answer.object(_status(finish), output, _usage(generation)))
