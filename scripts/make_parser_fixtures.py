"""Writes what vLLM 0.33's tool-call and reasoning parsers make of a set of model
outputs into tests/fixtures/vllm-0.33/parsers.json.

Run it with the Python of a virtual environment that has vLLM 0.33.0 (never the
project's own):

    ~/.cache/vllm033/bin/python scripts/make_parser_fixtures.py

Each case is parsed by vLLM's own parser classes, found by name through
`ToolParserManager` / `ReasoningParserManager`, twice: whole
(`extract_tool_calls` / `extract_reasoning`) and streamed, one delta at a time
as vLLM's chat endpoint feeds them (`extract_tool_calls_streaming` /
`extract_reasoning_streaming` with previous, current and delta text and token
ids, then `finish_streaming` where the parser has it). Both results go into the
fixture, so the Rust tests (`rust/parsers/tests/vllm_fixtures.rs`) and
the Python tests check this project's parsers against vLLM without vLLM
installed. Tool call ids are random in vLLM; the fixture keeps their shape
(`chatcmpl-tool-` + 16 hex digits, or Mistral's 9 letters and digits).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import vllm  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.reasoning import ReasoningParserManager  # noqa: E402
from vllm.tool_parsers import ToolParserManager  # noqa: E402

CHECKED_VERSION = "0.33.0"
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-0.33" / "parsers.json"

#: Marker strings the parsers look up in the vocabulary; each is one token.
SPECIAL_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<think>",
    "</think>",
]


class MarkerTokenizer:
    """The vocabulary the parsers need: every marker is one token, any other
    character its own token (id = code point)."""

    def __init__(self, markers: list[str]) -> None:
        self.vocab = {t: 1_000_000 + i for i, t in enumerate(markers)}

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        by_id = {token_id: marker for marker, token_id in self.vocab.items()}
        return "".join(by_id.get(t, chr(t) if t < 0x110000 else "") for t in token_ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        out, i = [], 0
        while i < len(text):
            for marker, token_id in self.vocab.items():
                if text.startswith(marker, i):
                    out.append(token_id)
                    i += len(marker)
                    break
            else:
                out.append(ord(text[i]))
                i += 1
        return out


def chunks_of(text: str, markers: list[str], piece: int = 3) -> list[str]:
    """Splits text the way a tokenizer streams it: each marker alone, other
    text in pieces of up to `piece` characters (a space joins the word after it)."""
    pattern = "|".join(re.escape(m) for m in sorted(markers, key=len, reverse=True))
    out: list[str] = []
    for part in re.split(f"({pattern})", text):
        if not part:
            continue
        if part in markers:
            out.append(part)
        else:
            out.extend(re.findall(r"\s*[^\s]{1," + str(piece) + r"}|\s+", part, re.DOTALL))
    return out


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    },
]

DS_CALLS = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"


def ds_call(name: str, args: str) -> str:
    return f"{DS_CALL}function{DS_SEP}{name}\n```json\n{args}\n```{DS_CALL_END}"


TOOL_CASES: dict[str, list[tuple[str, str]]] = {
    "hermes": [
        ("plain", "The weather is fine today."),
        (
            "one_call",
            'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
        ),
        (
            "two_calls",
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "search", "arguments": {"query": "a \\"quoted\\" word"}}\n</tool_call>',
        ),
        ("unclosed", '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}'),
        ("bad_json", '<tool_call>\n{"name": "search", "arguments": {query}}\n</tool_call>'),
        ("missing_name", '<tool_call>{"arguments": {}}</tool_call>'),
        ("nested", '<tool_call>{"name": "search", "arguments": {"query": {"a": [1, 2.5, null, true]}}}</tool_call>'),
        ("text_after_call", '<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call> and more text'),
    ],
    "llama3_json": [
        ("plain", "No tools needed here."),
        ("one_call", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}'),
        ("python_tag", '<|python_tag|>{"name": "search", "arguments": {"query": "rust"}}'),
        (
            "two_calls",
            '{"name": "get_weather", "arguments": {"city": "Oslo"}}; {"name": "search", "arguments": {"query": "snow"}}',
        ),
        ("bad_json", '{"name": "search", "arguments": {"query": }'),
        ("missing_arguments", '{"name": "search"}'),
        ("text_then_json", 'Sure: {"name": "search", "arguments": {"query": "x"}}'),
        ("empty_arguments", '{"name": "search", "arguments": {}}'),
    ],
    "mistral": [
        ("plain", "Bonjour, tout va bien."),
        ("one_call", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}'),
        ("content_then_call", 'Let me look.[TOOL_CALLS]search[ARGS]{"query": "café"}'),
        (
            "two_calls",
            '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]search[ARGS]{"query": "pizza"}',
        ),
        ("bad_json", "[TOOL_CALLS]search[ARGS]{query: 1"),
    ],
    "qwen3_xml": [
        ("plain", "Nothing to call."),
        (
            "one_call",
            "I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        ),
        (
            "two_calls",
            "<tool_call>\n<function=search>\n<parameter=query>\nline one\nline two\n</parameter>\n</function>\n"
            "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n"
            "<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>",
        ),
        ("unclosed", "<tool_call>\n<function=search>\n<parameter=query>\nopen end"),
        ("no_schema_type", "<tool_call>\n<function=other>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>"),
    ],
    "deepseek_v3": [
        ("plain", "Just text."),
        ("one_call", "Checking." + DS_CALLS + ds_call("get_weather", '{"city": "Paris"}') + DS_CALLS_END),
        (
            "two_calls",
            DS_CALLS
            + ds_call("get_weather", '{"city": "Oslo", "days": 2}')
            + "\n"
            + ds_call("search", '{"query": "fjords"}')
            + DS_CALLS_END,
        ),
        ("pretty_args", DS_CALLS + ds_call("search", '{\n  "query": "multi"\n}') + DS_CALLS_END),
        ("malformed", DS_CALLS + DS_CALL + "function" + DS_SEP + "search no fence" + DS_CALL_END + DS_CALLS_END),
    ],
    "pythonic": [
        ("plain", "Hello there."),
        ("one_call", '[get_weather(city="Paris", days=3)]'),
        (
            "two_calls",
            "[get_weather(city='San Francisco', metric=True), search(query=\"a 'b'\", limit=None)]",
        ),
        ("literals", "[search(query={'a': [1, -2.5, (3, 4)], 'b': None}, flag=False)]"),
        ("no_args", "[search()]"),
        ("not_a_list", 'get_weather(city="Paris")'),
        ("bad_python", "[search(query=)]"),
    ],
}

REASONING_CASES: dict[str, list[tuple[str, str]]] = {
    "deepseek_r1": [
        ("both_tags", "<think>Let me think.</think>The answer is 4."),
        ("no_start_tag", "Adding 2 and 2.</think>\n\n4"),
        ("no_end_tag", "<think>Still thinking"),
        ("empty_content", "<think>done</think>"),
        ("plain", "just text"),
    ],
    "qwen3": [
        ("both_tags", "<think>Let me think.</think>The answer is 4."),
        ("no_start_tag", "Adding 2 and 2.</think>\n\n4"),
        ("no_end_tag", "Still thinking"),
        ("empty_content", "<think>done</think>"),
        ("tool_call_ends_reasoning", 'plan<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'),
        ("repeated_end_tag", "a</think>b</think>c"),
    ],
}


def request(tools: list[dict] | None) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=tools)


def delta_json(delta: Any) -> dict | None:
    if delta is None:
        return None
    out: dict[str, Any] = {}
    if delta.content is not None:
        out["content"] = delta.content
    if getattr(delta, "reasoning", None) is not None:
        out["reasoning"] = delta.reasoning
    calls = []
    for tc in delta.tool_calls or []:
        fn = tc.function
        if isinstance(fn, dict):
            name, arguments = fn.get("name"), fn.get("arguments")
        elif fn is not None:
            name, arguments = fn.name, fn.arguments
        else:
            name = arguments = None
        call: dict[str, Any] = {"index": tc.index}
        if tc.id is not None:
            call["id"] = id_shape(tc.id)
        if tc.type is not None:
            call["type"] = tc.type
        if name is not None:
            call["name"] = name
        if arguments is not None:
            call["arguments"] = arguments
        calls.append(call)
    if calls:
        out["tool_calls"] = calls
    return out or None


def id_shape(tool_call_id: str) -> str:
    """The shape of a random id (the value itself cannot match)."""
    if re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", tool_call_id):
        return "chatcmpl-tool-<16 hex>"
    if re.fullmatch(r"[A-Za-z0-9]{9}", tool_call_id):
        return "<9 alphanumeric>"
    return tool_call_id


def reassemble(deltas: list[dict]) -> dict:
    content, reasoning, calls = "", "", {}
    for d in deltas:
        content += d.get("content", "")
        reasoning += d.get("reasoning", "")
        for tc in d.get("tool_calls", []):
            call = calls.setdefault(tc["index"], {"name": None, "arguments": ""})
            if "name" in tc:
                call["name"] = tc["name"]
            call["arguments"] += tc.get("arguments", "")
    return {
        "content": content,
        "reasoning": reasoning,
        "tool_calls": [calls[i] for i in sorted(calls)],
    }


def stream(parser: Any, text: str, chunks: list[str], tok: MarkerTokenizer, feed) -> list[dict]:
    assert "".join(chunks) == text
    deltas: list[dict] = []
    previous, previous_ids = "", []
    for chunk in chunks:
        current = previous + chunk
        chunk_ids = tok.encode(chunk)
        current_ids = previous_ids + chunk_ids
        out = delta_json(feed(previous, current, chunk, previous_ids, current_ids, chunk_ids))
        if out is not None:
            deltas.append(out)
        previous, previous_ids = current, current_ids
    finish = getattr(parser, "finish_streaming", None)
    if finish is not None:
        out = delta_json(finish())
        if out is not None:
            deltas.append(out)
    return deltas


def tool_case(name: str, case: str, text: str, tok: MarkerTokenizer, piece: int = 3) -> dict:
    req = request(WEATHER_TOOLS)
    parser_cls = ToolParserManager.get_tool_parser(name)
    whole = parser_cls(tok, req.tools).extract_tool_calls(text, req)
    chunks = chunks_of(text, SPECIAL_TOKENS, piece)
    parser = parser_cls(tok, req.tools)

    def feed(prev, cur, delta, prev_ids, cur_ids, delta_ids):
        return parser.extract_tool_calls_streaming(prev, cur, delta, prev_ids, cur_ids, delta_ids, req)

    deltas = stream(parser, text, chunks, tok, feed)
    return {
        "parser": name,
        "case": case,
        "text": text,
        "tools": WEATHER_TOOLS,
        "chunks": chunks,
        "whole": {
            "tools_called": whole.tools_called,
            "content": whole.content,
            "tool_calls": [
                {
                    "id": id_shape(tc.id),
                    "type": tc.type,
                    "name": tc.function.name,
                    "arguments": tc.function.arguments,
                }
                for tc in whole.tool_calls
            ],
        },
        "streamed": {"deltas": deltas, "reassembled": reassemble(deltas)},
    }


def reasoning_case(name: str, case: str, text: str, tok: MarkerTokenizer, piece: int = 3) -> dict:
    req = request(None)
    parser_cls = ReasoningParserManager.get_reasoning_parser(name)
    reasoning, content = parser_cls(tok).extract_reasoning(text, req)
    chunks = chunks_of(text, SPECIAL_TOKENS, piece)
    parser = parser_cls(tok)
    deltas = stream(parser, text, chunks, tok, parser.extract_reasoning_streaming)
    return {
        "parser": name,
        "case": case,
        "text": text,
        "chunks": chunks,
        "whole": {"reasoning": reasoning, "content": content},
        "streamed": {"deltas": deltas, "reassembled": reassemble(deltas)},
    }


def main() -> None:
    if vllm.__version__ != CHECKED_VERSION:
        raise SystemExit(f"vLLM {CHECKED_VERSION} expected, found {vllm.__version__}")
    tok = MarkerTokenizer(SPECIAL_TOKENS)
    fixture = {
        "vllm_version": vllm.__version__,
        "tool_parsers": [
            tool_case(name, case, text, tok) for name, cases in TOOL_CASES.items() for case, text in cases
        ],
        "reasoning_parsers": [
            reasoning_case(name, case, text, tok) for name, cases in REASONING_CASES.items() for case, text in cases
        ],
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
