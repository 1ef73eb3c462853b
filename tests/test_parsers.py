"""The tool-call and reasoning parsers through `vllm_rs._core` (the Python API
server's way in to the Rust parsers) against vLLM 0.33's results in
tests/fixtures/vllm-0.33/parsers.json (scripts/make_parser_fixtures.py)."""

from __future__ import annotations

import json

import pytest
from vllm_rs import _core

from tests.support.parsers import check_reasoning_case, check_tool_case, load_fixture

FIXTURE = load_fixture()


@pytest.mark.parametrize("case", FIXTURE["tool_parsers"], ids=lambda c: f"{c['parser']}-{c['case']}")
def test_tool_parser_matches_vllm(case):
    check_tool_case(case)


@pytest.mark.parametrize("case", FIXTURE["reasoning_parsers"], ids=lambda c: f"{c['parser']}-{c['case']}")
def test_reasoning_parser_matches_vllm(case):
    check_reasoning_case(case)


def test_every_fixture_parser_is_registered_by_its_vllm_name():
    assert {c["parser"] for c in FIXTURE["tool_parsers"]} <= set(_core.TOOL_PARSER_NAMES)
    assert {c["parser"] for c in FIXTURE["reasoning_parsers"]} <= set(_core.REASONING_PARSER_NAMES)
    assert _core.ToolParser("qwen3_coder").name == "qwen3_xml"
    assert _core.ToolParser("llama4_json").name == "llama3_json"


def test_bad_names_and_tools_are_value_errors():
    with pytest.raises(ValueError, match='unknown tool call parser "granite"; supported: .*hermes'):
        _core.ToolParser("granite")
    with pytest.raises(ValueError, match="tools_json is not JSON"):
        _core.ToolParser("hermes", "[{")
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        _core.ReasoningParser("nope")


def test_streamed_deltas_are_typed_and_finish_once():
    parser = _core.ToolParser("hermes", json.dumps([{"type": "function", "function": {"name": "f"}}]))
    stream = parser.stream()
    first = stream.push('Hi<tool_call>{"name": "f", "arguments": {"x":')
    assert first.content == "Hi" and first.reasoning is None
    (call,) = first.tool_calls
    assert (call.index, call.type, call.name) == (0, "function", "f") and call.id.startswith("chatcmpl-tool-")
    # Arguments as the model writes them, the open block's text stripped as vLLM strips it.
    assert call.arguments == '{"x":'
    rest = stream.push("1}}</tool_call>")
    assert [c.arguments for c in rest.tool_calls] == ["1}"] and rest.tool_calls[0].id is None
    assert stream.finish() is None and stream.finish() is None
    assert stream.tools_called


def test_qwen3_reasoning_off_is_all_content():
    assert _core.ReasoningParser("qwen3", thinking=False).parse("<think>a</think>b") == (None, "<think>a</think>b")
