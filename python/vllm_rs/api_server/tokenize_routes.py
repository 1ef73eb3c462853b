"""`POST /tokenize` and `POST /detokenize`, as vLLM serves them: a prompt or
chat messages to token ids (with the count and the model length), and token
ids back to text."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from vllm_rs.api_server.errors import ApiError
from vllm_rs.api_server.openai_routes import MessageInput, flatten_messages, json_response, read_json_object
from vllm_rs.api_server.params import Int64, RequestModel, parse_model
from vllm_rs.api_server.request_rules import RULES
from vllm_rs.api_server.state import ServerState
from vllm_rs.api_server.submit import check_model
from vllm_rs.api_server.template_kwargs import read_template_kwargs
from vllm_rs.api_server.tokenizer import ChatTemplateError


class TokenizeInput(RequestModel):
    """A `/tokenize` body: vLLM's completion form (`prompt`) or chat form (`messages`)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[MessageInput] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    return_token_strs: bool | None = None
    tools: list[Any] | None = None
    chat_template: Any = None
    media_io_kwargs: Any = None
    mm_processor_kwargs: Any = None


class DetokenizeInput(RequestModel):
    """A `/detokenize` body."""

    model: str | None = None
    tokens: list[Int64] | None = None


def _tokens(state: ServerState, t: TokenizeInput, body: dict[str, Any]) -> list[int]:
    for param in ("chat_template", "media_io_kwargs", "mm_processor_kwargs"):
        if getattr(t, param) is not None:
            raise RULES.refuse(param, "field_unsupported", param=param)
    if t.tools:
        raise RULES.refuse("tools", "field_unsupported", param="tools")
    # vLLM tries the completion form first: a prompt wins.
    if t.prompt is not None:
        return state.tokenizer.encode(
            t.prompt, add_special_tokens=True if t.add_special_tokens is None else t.add_special_tokens
        )
    if t.messages is None:
        raise RULES.refuse("prompt", "tokenize_input_missing")
    add_generation_prompt = True if t.add_generation_prompt is None else t.add_generation_prompt
    if t.continue_final_message:
        key = "continue_with_generation_prompt" if add_generation_prompt else "continue_final_message_unsupported"
        raise RULES.refuse("continue_final_message", key)
    messages = flatten_messages(t.messages)
    kwargs = read_template_kwargs(body, state.settings.default_chat_template_kwargs)
    try:
        text = state.tokenizer.apply_chat_template(messages, add_generation_prompt, None, kwargs)
    except ChatTemplateError as e:
        raise ApiError.invalid_param("messages", f"cannot apply the chat template: {e}") from None
    return state.tokenizer.encode(text, add_special_tokens=bool(t.add_special_tokens))


async def tokenize(request: Request) -> Response:
    """Handles `POST /tokenize`."""
    state: ServerState = request.app.state.server
    body = await read_json_object(request)
    t = parse_model(TokenizeInput, body)
    check_model(state, t.model)
    tokens = _tokens(state, t, body)
    token_strs = state.tokenizer.token_strings(tokens) if t.return_token_strs else None
    return json_response(
        {"count": len(tokens), "max_model_len": state.max_model_len, "tokens": tokens, "token_strs": token_strs}
    )


async def detokenize(request: Request) -> Response:
    """Handles `POST /detokenize`: the text of `tokens`, special tokens kept."""
    state: ServerState = request.app.state.server
    d = parse_model(DetokenizeInput, await read_json_object(request))
    check_model(state, d.model)
    if d.tokens is None:
        raise RULES.wrong_type("tokens")
    bad = next((t for t in d.tokens if not 0 <= t < state.tokenizer.vocab_size), None)
    if bad is not None:
        raise RULES.refuse("tokens", "token_out_of_vocab", token_id=bad)
    return json_response({"prompt": state.tokenizer.decode(d.tokens)})
