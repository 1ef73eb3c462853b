"""A request's `chat_template_kwargs`, as vLLM 0.33 reads them (the Rust
frontend's `frontend-bin/src/http/template_kwargs.rs` does the same with the
same rule table): an object merged over the server's
`--default-chat-template-kwargs`; `chat_template` and `tokenize` are refused,
as are the names the server itself passes to the template (transformers fails
on the duplicate). The tokenizer filters the rest to the variables the
template reads. A requested reasoning effort joins them as vLLM's
`build_chat_params` puts it."""

from __future__ import annotations

from typing import Any

from vllm_rs.api_server.request_rules import RULES
from vllm_rs.cli_args import REASONING_EFFORTS

#: Keys vLLM refuses outright ("unexpected chat template kwargs").
UNEXPECTED = ("chat_template", "tokenize")

#: Keys transformers' `apply_chat_template` already receives from the server.
RESERVED = ("conversation", "messages", "tools")

#: transformers' `apply_chat_template` parameters: accepted as kwargs, but
#: consumed by transformers, so the template never sees them.
CONSUMED_BY_APPLY = frozenset(
    {
        "add_generation_prompt",
        "chat_template",
        "continue_final_message",
        "max_length",
        "padding",
        "return_assistant_tokens_mask",
        "return_dict",
        "return_tensors",
        "sanitize_control_tokens",
        "tokenize",
        "tokenizer_kwargs",
        "truncation",
    }
)


def read_template_kwargs(body: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The effective kwargs of a request body: its `chat_template_kwargs`
    (absent or null: none) merged over `defaults`; request values that are
    null or `"auto"` leave the default in place (vLLM's `merge_kwargs`). A
    non-object or a refused key is a 400 naming `chat_template_kwargs`."""
    given = body.get("chat_template_kwargs")
    if given is None:
        return dict(defaults)
    if not isinstance(given, dict):
        raise RULES.wrong_type("chat_template_kwargs")
    unexpected = [k for k in UNEXPECTED if k in given]
    if unexpected:
        keys = "{" + ", ".join(repr(k) for k in unexpected) + "}"
        raise RULES.refuse("chat_template_kwargs", "chat_template_kwargs_unexpected", keys=keys)
    for key in RESERVED:
        if key in given:
            raise RULES.refuse("chat_template_kwargs", "chat_template_kwargs_reserved", key=key)
    return defaults | {k: v for k, v in given.items() if v is not None and v != "auto"}


def read_reasoning_effort(value: Any, param: str) -> str | None:
    """A request's reasoning effort (chat's `reasoning_effort`, the responses
    API's `reasoning.effort`): None when absent or null; anything but one of
    `REASONING_EFFORTS` is a 400 naming `param`."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in REASONING_EFFORTS:
        raise RULES.wrong_type(param)
    return value


def apply_reasoning_effort(
    kwargs: dict[str, Any], body: dict[str, Any], effort: str | None, effort_map: dict[str, str]
) -> dict[str, Any]:
    """`kwargs` with a requested `effort` put in as vLLM's `build_chat_params`
    does: the effort, rewritten by the server's `effort_map`
    (`--reasoning-effort-map`), becomes `reasoning_effort`, and
    `enable_thinking` becomes whether it is not `"none"` unless the request's
    own `chat_template_kwargs` (in `body`) name `enable_thinking`. Both win
    over the request's and the server's kwargs; an effort mapped to `"auto"`
    leaves `reasoning_effort` as it was, as vLLM's merge does."""
    if effort is None:
        return kwargs
    effort = effort_map.get(effort, effort)
    merged = dict(kwargs)
    if effort != "auto":
        merged["reasoning_effort"] = effort
    given = body.get("chat_template_kwargs")
    if not (isinstance(given, dict) and "enable_thinking" in given):
        merged["enable_thinking"] = effort != "none"
    return merged


def thinking_enabled(kwargs: dict[str, Any]) -> bool:
    """The `enable_thinking` the reasoning parser reads (vLLM's qwen3): true when absent."""
    return bool(kwargs.get("enable_thinking", True))


def template_variables(kwargs: dict[str, Any], variables: frozenset[str]) -> dict[str, Any]:
    """The kwargs a template with undeclared `variables` gets."""
    return {k: v for k, v in kwargs.items() if k in variables and k not in CONSUMED_BY_APPLY}
