"""Tools, `tool_choice` and reasoning on the chat endpoint, as vLLM 0.33's
serve does them (the Rust frontend's `frontend-bin/src/http/tools.rs` does
the same with the same rule table):

- requests are checked as vLLM's request model checks them (`tools` not
  empty, `tool_choice` naming an offered function, ...);
- a tool parser exists only with `--enable-auto-tool-choice` and
  `--tool-call-parser`; without it `auto` and forced choices are refused with
  vLLM's messages;
- `required` and a named function constrain the output through structured
  outputs with the JSON schema vLLM builds, and their output is read as JSON
  (without the tool parser), except with parsers that read forced calls in
  their own format (`mistral`), which read them as `auto`;
- the output is read by `vllm_rs._core.ChatOutputParser`, the same code as
  the Rust frontend's, whole and streamed."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from vllm_rs._core import ChatOutputParser, DeltaMessage, required_tools_schema
from vllm_rs.api_server.request_rules import RULES


@dataclass(frozen=True)
class ParserSettings:
    """The serve flags that choose the output parsers (vLLM's names)."""

    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ParserSettings:
        """From the `serve` namespace."""
        return cls(
            enable_auto_tool_choice=bool(getattr(args, "enable_auto_tool_choice", False)),
            tool_call_parser=getattr(args, "tool_call_parser", None),
            reasoning_parser=getattr(args, "reasoning_parser", None),
        )

    @property
    def auto_tool_parser(self) -> str | None:
        """The tool parser vLLM builds: only with auto tool choice enabled."""
        return self.tool_call_parser if self.enable_auto_tool_choice else None


@dataclass
class ChatTools:
    """A chat request's tools, read and checked."""

    #: The `tools` list as the chat template gets it (None without tools).
    tools: list[dict[str, Any]] | None
    #: `none`, `auto`, `named` or `required`: how the output is read.
    mode: str
    #: The forced function of a named choice.
    function_name: str | None
    #: The structured-outputs constraint a forced choice sets (vLLM's JSON schema).
    constraint: dict[str, Any] | None
    parallel_tool_calls: bool


def _function(tool: Any) -> dict[str, Any]:
    """`tool["function"]` of a well-formed function tool, else a 400."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if (
        not isinstance(function, dict)
        or tool.get("type", "function") != "function"
        or not isinstance(function.get("name"), str)
        or not isinstance(function.get("parameters") or {}, dict)
    ):
        raise RULES.wrong_type("tools")
    return function


def read_chat_tools(body: dict[str, Any], settings: ParserSettings) -> ChatTools:
    """The request's tools and `tool_choice`, checked as vLLM checks them."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RULES.wrong_type("tools")
    if tools == []:
        raise RULES.refuse("tools", "tools_empty")
    functions = [_function(tool) for tool in tools or []]
    choice = body.get("tool_choice")
    if choice is None and tools:
        choice = "auto"
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise RULES.wrong_type("parallel_tool_calls")
    parallel = parallel is not False
    if choice is None or choice == "none":
        return ChatTools(tools, "none", None, None, parallel)
    if tools is None:
        raise RULES.refuse("tool_choice", "tool_choice_without_tools")
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise RULES.wrong_type("tool_choice")
        if not any(f["name"] == name for f in functions):
            raise RULES.refuse("tool_choice", "tool_choice_unknown_tool")
        constraint = body.get("structured_outputs")
        # vLLM refuses its own json/regex/choice constraints next to a named choice.
        if isinstance(constraint, dict) and any(constraint.get(k) is not None for k in ("json", "regex", "choice")):
            raise RULES.refuse("structured_outputs", "structured_outputs_with_tools")
    elif choice not in ("auto", "required"):
        raise RULES.refuse("tool_choice", "tool_choice_invalid", value=choice)
    parser = settings.auto_tool_parser
    if parser is None:
        if choice == "auto":
            raise RULES.refuse("tool_choice", "auto_tool_choice_disabled")
        described = f'function "{choice["function"]["name"]}"' if isinstance(choice, dict) else f'"{choice}"'
        raise RULES.refuse("tool_choice", "tool_choice_needs_parser", choice=described)
    # mistral reads forced calls in its own format, as auto (vLLM's supports_required_and_named).
    if choice == "auto" or parser == "mistral":
        return ChatTools(tools, "auto", None, None, parallel)
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        parameters = next(f.get("parameters") for f in functions if f["name"] == name)
        schema = parameters if parameters else {"type": "object", "properties": {}}
        return ChatTools(tools, "named", name, {"json": schema}, parallel)
    try:
        schema = json.loads(required_tools_schema(json.dumps(tools), parallel))
    except ValueError as e:
        raise RULES.refuse("tools", "tools_schema", why=str(e)) from None
    return ChatTools(tools, "required", None, {"json": schema}, parallel)


def output_parser(tools: ChatTools, settings: ParserSettings, thinking: bool = True) -> ChatOutputParser | None:
    """The reader of this request's output, or None when its text is all
    content; `thinking` is the request's `enable_thinking` (only qwen3 reads it)."""
    if tools.mode == "none" and settings.reasoning_parser is None:
        return None
    return ChatOutputParser(
        tools.mode,
        tool_parser=settings.auto_tool_parser if tools.mode == "auto" else None,
        function_name=tools.function_name,
        tools_json=json.dumps(tools.tools) if tools.tools else None,
        reasoning_parser=settings.reasoning_parser,
        thinking=thinking,
        parallel_tool_calls=tools.parallel_tool_calls,
    )


def finish_reason(engine_reason: str, tools: ChatTools, calls_made: bool) -> str:
    """vLLM's `resolve_finish_reason`: `tool_calls` when calls were made and
    the model stopped on its own, unless one named function was forced."""
    if calls_made and engine_reason == "stop" and tools.mode != "named":
        return "tool_calls"
    return engine_reason


def delta_json(delta: DeltaMessage) -> dict[str, Any]:
    """A streamed delta as vLLM writes it."""
    out: dict[str, Any] = {}
    if delta.content is not None:
        out["content"] = delta.content
    if delta.reasoning is not None:
        out["reasoning"] = delta.reasoning
    if delta.tool_calls:
        calls = []
        for call in delta.tool_calls:
            item: dict[str, Any] = {"index": call.index}
            if call.id is not None:
                item["id"] = call.id
                item["type"] = call.type
            function: dict[str, Any] = {}
            if call.name is not None:
                function["name"] = call.name
            if call.arguments is not None:
                function["arguments"] = call.arguments
            item["function"] = function
            calls.append(item)
        out["tool_calls"] = calls
    return out


def template_messages_extra(message: Any) -> dict[str, Any]:
    """The fields of a message beyond role and content that vLLM passes to
    chat templates: `name`, `tool_call_id`, and `tool_calls` with JSON
    arguments read into objects (as vLLM does for Hugging Face templates)."""
    extra: dict[str, Any] = {}
    if getattr(message, "name", None) is not None:
        extra["name"] = message.name
    if getattr(message, "tool_call_id", None) is not None:
        extra["tool_call_id"] = message.tool_call_id
    calls = getattr(message, "tool_calls", None)
    if calls:
        rendered = []
        for call in calls:
            call = dict(call)
            function = call.get("function")
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                try:
                    call["function"] = {**function, "arguments": json.loads(function["arguments"])}
                except (ValueError, RecursionError):
                    pass  # vLLM leaves arguments that are not JSON as text
            rendered.append(call)
        extra["tool_calls"] = rendered
    return extra
