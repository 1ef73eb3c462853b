"""This project's tool-call and reasoning parsers (`vllm_rs._core`, the Rust
crate vllm-rs-parsers) against vLLM 0.33's own parser classes, live: every
model output of scripts/make_parser_fixtures.py, streamed in the script's
pieces and one character at a time (markers whole, as tokens), goes to both;
the whole parses must agree (content, names, argument text) and the streams
must reassemble to the same content, reasoning, names and JSON arguments."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")

from tests.support.parsers import check_reasoning_case, check_tool_case  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_parser_fixtures.py"
_spec = importlib.util.spec_from_file_location("make_parser_fixtures", SCRIPT)
fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixtures)
TOKENIZER = fixtures.MarkerTokenizer(fixtures.SPECIAL_TOKENS)

TOOL_CASES = [(name, case, text) for name, cases in fixtures.TOOL_CASES.items() for case, text in cases]
REASONING_CASES = [(name, case, text) for name, cases in fixtures.REASONING_CASES.items() for case, text in cases]


@pytest.mark.parametrize("piece", [3, 1])
@pytest.mark.parametrize(("name", "case", "text"), TOOL_CASES, ids=[f"{n}-{c}" for n, c, _ in TOOL_CASES])
def test_tool_parser_agrees_with_vllm(name, case, text, piece):
    check_tool_case(fixtures.tool_case(name, case, text, TOKENIZER, piece))


@pytest.mark.parametrize("piece", [3, 1])
@pytest.mark.parametrize(("name", "case", "text"), REASONING_CASES, ids=[f"{n}-{c}" for n, c, _ in REASONING_CASES])
def test_reasoning_parser_agrees_with_vllm(name, case, text, piece):
    check_reasoning_case(fixtures.reasoning_case(name, case, text, TOKENIZER, piece))
