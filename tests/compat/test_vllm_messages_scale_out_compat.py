"""The Messages API and the scale-out routes against vLLM 0.33's own request
and response classes: what the frontend answers validates as vLLM's
`AnthropicMessagesResponse`, `AnthropicStreamEvent`,
`AnthropicCountTokensResponse`, `GenerateRequest` and `GenerateResponse`;
vLLM's own conversion of a Messages request to a chat request renders the
prompt the frontend renders for the Messages request; and every route of
vLLM's routers is in `tests/fixtures/vllm-0.33/routes.json`."""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")

from vllm.entrypoints.anthropic.protocol import (  # noqa: E402
    AnthropicCountTokensResponse,
    AnthropicMessagesRequest,
    AnthropicMessagesResponse,
    AnthropicStreamEvent,
)
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages  # noqa: E402

from tests.test_serve import API_KEY, needs_frontend, serving  # noqa: E402


def vllm_class(name: str):
    """A validator of vLLM's `name` (a class or, for `GenerateResponse`, a
    tagged union), from whichever module vLLM 0.33 keeps its scale-out protocol in."""
    from pydantic import TypeAdapter

    for module in (
        "vllm.entrypoints.scale_out.token_in_token_out.protocol",
        "vllm.entrypoints.serve.disagg.protocol",
        "vllm.entrypoints.openai.protocol",
    ):
        try:
            return TypeAdapter(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    pytest.skip(f"vLLM's {name} is not where vLLM 0.33 keeps it")


TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
CONVERSATION = {
    "model": "echo",
    "max_tokens": 8,
    "system": [{"type": "text", "text": "Be brief."}],
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]},
    ],
}


@pytest.fixture(scope="module")
def stack():
    with serving("--model", "echo", "--port", "0", "--max-model-len", "512", "--enable-scale-out",
                 env={"VLLM_API_KEY": API_KEY}) as serve:  # fmt: skip
        yield serve


def post(stack, path: str, body: dict) -> tuple[int, bytes]:
    return stack.http("POST", path, body, headers={"x-api-key": API_KEY})


def ok(stack, path: str, body: dict):
    status, data = post(stack, path, body)
    assert status == 200, data
    return json.loads(data)


@needs_frontend
def test_messages_answers_are_vllms_response_classes(stack):
    request = {"model": "echo", "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]}
    AnthropicMessagesRequest.model_validate(request)
    AnthropicMessagesResponse.model_validate(ok(stack, "/v1/messages", request))
    status, data = post(stack, "/v1/messages", {**request, "stream": True})
    assert status == 200
    for frame in data.decode().split("\n\n"):
        if frame:
            AnthropicStreamEvent.model_validate_json(frame.split("data: ", 1)[1])
    count = {k: request[k] for k in ("model", "messages")}
    AnthropicCountTokensResponse.model_validate(ok(stack, "/v1/messages/count_tokens", count))


@needs_frontend
def test_vllms_conversion_renders_the_prompt_ours_renders(stack):
    converted = AnthropicServingMessages.to_chat_completion_request(
        AnthropicMessagesRequest.model_validate(CONVERSATION)
    )
    chat = converted.model_dump(exclude_unset=True, exclude_none=True)
    ours = ok(stack, "/v1/messages/render", CONVERSATION)
    theirs = ok(stack, "/v1/chat/completions/render", chat)
    assert ours["token_ids"] == theirs["token_ids"]


@needs_frontend
def test_render_and_generate_are_vllms_scale_out_classes(stack):
    generate_request = vllm_class("GenerateRequest")
    generate_response = vllm_class("GenerateResponse")
    rendered = ok(
        stack, "/v1/chat/completions/render", {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    )
    generate_request.validate_python(rendered)
    for rendered_completion in ok(stack, "/v1/completions/render", {"model": "echo", "prompt": "hi"}):
        generate_request.validate_python(rendered_completion)
    generated = ok(stack, "/inference/v1/generate", rendered)
    assert generate_response.validate_python(generated).output_mode == "tokens"


def vllm_route_paths() -> set[tuple[str, str]]:
    """(method, path) of every route in every APIRouter under vllm.entrypoints."""
    from fastapi import APIRouter

    found = set()
    package = importlib.import_module("vllm.entrypoints")
    for info in pkgutil.walk_packages(package.__path__, "vllm.entrypoints."):
        try:
            module = importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - a module needing a GPU or an optional package has no routes for us
            continue
        for value in vars(module).values():
            if isinstance(value, APIRouter):
                for route in value.routes:
                    for method in getattr(route, "methods", None) or {"GET"}:
                        if method not in ("HEAD", "OPTIONS"):
                            found.add((method, route.path))
    return found


def test_every_vllm_route_is_in_the_table():
    table = json.loads((Path(__file__).parents[1] / "fixtures" / "vllm-0.33" / "routes.json").read_text())
    listed = {(route["method"], route["path"]) for route in table["routes"]}
    found = vllm_route_paths()
    assert found, "no routers found under vllm.entrypoints"
    assert sorted(found - listed) == [], "vLLM routes missing from routes.json"
