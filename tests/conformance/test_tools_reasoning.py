"""Tools, tool_choice and reasoning through `python -m vllm_rs serve`, with
the real `openai` client. The echo model repeats its prompt
(`role: content` lines), so a user message holding hermes `<tool_call>` or
`</think>` text makes it "emit" that text and drives the parsers
deterministically; the stop string `\\nassistant` ends the echo where the
prompt's generation turn begins."""

from __future__ import annotations

import json

import openai
import pytest

from tests.test_serve import Serve

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
CALL_TEXT = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
STOP = ["\nassistant"]


def _serve(model: str, *flags: str):
    serve = Serve("--model", model, "--port", "0", "--max-model-len", "2048", *flags)
    try:
        serve.wait_ready()
        yield serve
    finally:
        serve.kill()


@pytest.fixture(scope="module")
def echo_tools():
    """echo with hermes auto tool choice and the deepseek_r1 reasoning parser."""
    yield from _serve("echo", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                      "--reasoning-parser", "deepseek_r1")  # fmt: skip


@pytest.fixture(scope="module")
def echo_plain():
    """echo without any parser flags."""
    yield from _serve("echo")


@pytest.fixture(scope="module")
def toy_tools():
    """toy (random weights) with a tool parser, for the constrained choices."""
    yield from _serve("toy", "--enable-auto-tool-choice", "--tool-call-parser", "hermes")


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_auto_tool_call_is_parsed_whole(echo_tools):
    result = echo_tools.client().chat.completions.create(
        model="echo", messages=_user("</think>" + CALL_TEXT), tools=[WEATHER], stop=STOP, max_tokens=400
    )
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.message.model_extra["reasoning"] == "user: "


def test_auto_tool_call_streams_argument_deltas(echo_tools):
    chunks = list(
        echo_tools.client().chat.completions.create(
            model="echo", messages=_user("</think>" + CALL_TEXT), tools=[WEATHER], stop=STOP, max_tokens=400,
            stream=True,
        )
    )  # fmt: skip
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for part in chunk.choices[0].delta.tool_calls or []:
            if part.id is not None:
                assert part.type == "function" and part.index not in calls
                calls[part.index] = {"name": part.function.name, "arguments": ""}
            calls[part.index]["arguments"] += part.function.arguments or ""
    assert [c["name"] for c in calls.values()] == ["get_weather"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_reasoning_is_split_whole_and_streamed(echo_tools):
    client = echo_tools.client()
    messages = _user("thinking hard</think>The answer is 4")
    whole = client.chat.completions.create(model="echo", messages=messages, stop=STOP, max_tokens=400)
    message = whole.choices[0].message
    assert (message.model_extra["reasoning"], message.content) == ("user: thinking hard", "The answer is 4")
    assert whole.choices[0].finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(model="echo", messages=messages, stop=STOP, max_tokens=400, stream=True)
    )
    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning") or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert (reasoning, content) == ("user: thinking hard", "The answer is 4")


def test_logprobs_cover_every_token_of_a_parsed_chat(echo_tools):
    """Logprobs with the tool and reasoning parsers: one entry per generated
    token, whichever part of the message its text lands in, whole and streamed."""
    client = echo_tools.client()
    ask = {"model": "echo", "messages": _user("mull</think>" + CALL_TEXT), "tools": [WEATHER], "stop": STOP,
           "max_tokens": 400, "logprobs": True, "top_logprobs": 1}  # fmt: skip
    whole = client.chat.completions.create(**ask)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    tokens = [c.token for c in choice.logprobs.content]
    assert len(tokens) == whole.usage.completion_tokens
    assert "get_weather" in "".join(tokens) and "</think>" in "".join(tokens)
    assert all(len(c.top_logprobs) == 1 for c in choice.logprobs.content)
    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    streamed = [c.token for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
                for c in chunk.choices[0].logprobs.content]  # fmt: skip
    assert len(streamed) == chunks[-1].usage.completion_tokens
    # Tokens the engine made past the stop string (before the abort reached
    # it) vary with timing; up to the stop string both are the same.
    called = "".join(tokens).index("</tool_call>")
    assert "".join(streamed)[:called] == "".join(tokens)[:called]


def test_tool_calling_loop(echo_tools):
    """The model calls a tool through the parser, the client runs it and sends
    the result as a `tool` message, and the model answers with it."""
    client = echo_tools.client()
    messages = _user("</think>What is the weather in Paris? " + CALL_TEXT)
    first = client.chat.completions.create(model="echo", messages=messages, tools=[WEATHER], stop=STOP, max_tokens=400)
    (call,) = first.choices[0].message.tool_calls
    weather = {"city": json.loads(call.function.arguments)["city"], "sky": "sunny"}
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(weather)},
    ]
    answer = client.chat.completions.create(
        model="echo", messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=400, stop=["\nassistant: user"]
    )
    choice = answer.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason == "stop"
    assert f"tool: {json.dumps(weather)}" in choice.message.content


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ("auto", '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'),
        ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
        ({"type": "function", "function": {"name": "get_weather"}},
         'tool_choice=function "get_weather" requires --tool-call-parser to be set'),
    ],
)  # fmt: skip
def test_tool_choice_without_a_parser_is_vllms_400(echo_plain, choice, message):
    with pytest.raises(openai.BadRequestError) as e:
        echo_plain.client().chat.completions.create(
            model="echo", messages=_user("hi"), tools=[WEATHER], tool_choice=choice, max_tokens=4
        )
    assert e.value.body["message"] == message and e.value.body["param"] == "tool_choice"


def test_bad_tool_requests_are_400s_naming_the_field(echo_tools):
    client = echo_tools.client()
    for kwargs, param in [
        ({"tools": []}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="echo", messages=_user("hi"), max_tokens=4, **kwargs)
        assert e.value.body["param"] == param, (kwargs, e.value.body)


@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_tool_choice_give_valid_arguments(toy_tools, stream):
    jsonschema = pytest.importorskip("jsonschema")
    client = toy_tools.client()
    schema = WEATHER["function"]["parameters"]
    for tool_choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        kwargs = dict(model="toy", messages=_user("weather?"), tools=[WEATHER], tool_choice=tool_choice,
                      max_tokens=1000, seed=7, parallel_tool_calls=False)  # fmt: skip
        if stream:
            calls: dict[int, dict] = {}
            finish = None
            for chunk in client.chat.completions.create(stream=True, **kwargs):
                for part in chunk.choices[0].delta.tool_calls or []:
                    if part.id is not None:
                        calls[part.index] = {"name": part.function.name, "arguments": ""}
                    calls[part.index]["arguments"] += part.function.arguments or ""
                finish = chunk.choices[0].finish_reason or finish
            found = list(calls.values())
        else:
            result = client.chat.completions.create(**kwargs)
            finish = result.choices[0].finish_reason
            found = [
                {"name": c.function.name, "arguments": c.function.arguments}
                for c in result.choices[0].message.tool_calls
            ]
        assert finish in ("stop", "tool_calls"), (tool_choice, finish)
        assert found and all(c["name"] == "get_weather" for c in found), (tool_choice, found)
        for call in found:
            jsonschema.validate(json.loads(call["arguments"]), schema)
