"""Structured outputs against vLLM 0.33 itself: every constraint a frontend
accepts (`response_format`, `structured_outputs`, on chat and completions)
reaches the engine as the `structured_outputs` map vLLM's own msgpack encoder
writes for the same `StructuredOutputsParams` (backend resolved to
`guidance`), and vLLM's `MsgpackDecoder(EngineCoreRequest)` reads it back to
that dataclass; the JSON schemas the frontend builds for `tool_choice`
`required` and named are the ones vLLM builds."""

from __future__ import annotations

import json

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")

import msgspec  # noqa: E402  (comes with vLLM)
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402
from vllm.tool_parsers.utils import get_json_schema_from_tools  # noqa: E402
from vllm.v1.engine import EngineCoreRequest  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder  # noqa: E402
from vllm_rs._core import required_tools_schema  # noqa: E402

from tests.conformance.test_request_validation import FINISH_LENGTH, post, served  # noqa: E402, F401
from tests.support.http import in_background  # noqa: E402
from tests.support.wait import DEADLINE_S  # noqa: E402

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
CASES = [
    ("json_schema", "chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}},
     {"json": SCHEMA}),
    ("json_object", "chat", {"response_format": {"type": "json_object"}}, {"json_object": True}),
    ("regex", "completions", {"structured_outputs": {"regex": "[a-z]+", "disable_any_whitespace": True}},
     {"regex": "[a-z]+", "disable_any_whitespace": True}),
    ("choice", "chat", {"structured_outputs": {"choice": ["x", "y"]}}, {"choice": ["x", "y"]}),
    ("grammar", "completions", {"structured_outputs": {"grammar": 'start: "a"+'}}, {"grammar": 'start: "a"+'}),
    ("json_text", "completions", {"structured_outputs": {"json": json.dumps(SCHEMA)}}, {"json": json.dumps(SCHEMA)}),
    ("override", "chat", {"structured_outputs": {"whitespace_pattern": " "}, "response_format": {"type": "json_object"}},
     {"json_object": True, "whitespace_pattern": " "}),
]  # fmt: skip


def vllm_wire(fields: dict) -> dict:
    """The `structured_outputs` map vLLM's encoder writes for these fields, backend `guidance` as auto resolves it."""
    params = StructuredOutputsParams(**fields)
    params._backend = "guidance"
    params._backend_was_auto = True
    (frame,) = MsgpackEncoder().encode(SamplingParams(max_tokens=1, structured_outputs=params))
    return msgspec.msgpack.decode(frame)["structured_outputs"]


@pytest.mark.parametrize(("name", "endpoint", "extra", "fields"), CASES, ids=[c[0] for c in CASES])
def test_constraints_reach_the_engine_as_vllm_encodes_them(served, name, endpoint, extra, fields):  # noqa: F811
    body = {"messages": [{"role": "user", "content": "x"}]} if endpoint == "chat" else {"prompt": "x"}
    answered = in_background(post, served, endpoint, {**body, **extra, "max_tokens": 4}, f"so-{name}")
    engine = served.engine
    payload = engine.next_add_payload()
    sent = msgspec.msgpack.decode(payload)[3]["structured_outputs"]
    assert sent == vllm_wire(fields)
    request = MsgpackDecoder(EngineCoreRequest).decode(payload)
    decoded = request.sampling_params.structured_outputs
    expected = StructuredOutputsParams(**fields)
    assert {k: getattr(decoded, k) for k in fields} == {k: getattr(expected, k) for k in fields}
    assert decoded._backend == "guidance"
    engine.send_outputs([[request.request_id, [65], None, None, None, FINISH_LENGTH]])
    status, answer = answered.result(timeout=DEADLINE_S)
    assert status == 200, answer


TOOLS = [
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "$defs": {"D": {"type": "integer"}},
                                                                   "properties": {"d": {"$ref": "#/$defs/D"}}}}},
    {"type": "function", "function": {"name": "g"}},
]  # fmt: skip


@pytest.mark.parametrize("parallel", [None, True, False])
def test_required_tool_choice_schema_is_vllms(parallel):
    request = ChatCompletionRequest(
        messages=[{"role": "user", "content": "x"}], tools=json.loads(json.dumps(TOOLS)), tool_choice="required",
        parallel_tool_calls=parallel,
    )  # fmt: skip
    expected = get_json_schema_from_tools(request.tool_choice, request.tools, parallel)
    assert json.loads(required_tools_schema(json.dumps(TOOLS), parallel is not False)) == expected
