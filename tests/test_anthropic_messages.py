"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`)
end to end: the official `anthropic` SDK against `python -m vllm_rs serve`
on the packaged SmolLM2-135M-Instruct, with the hermes tool parser. The
reference for every answer is the chat-completions route of the same
server, which the Messages route is converted to.

One server for the whole module, started with an API key (the SDK sends it
as `x-api-key`). Skipped, saying why, when the packaged model, the binary or
the SDK is missing."""

from __future__ import annotations

import json

import pytest
from vllm_rs.model_files import PACKAGED_MODEL_NAME

from tests.test_serve import API_KEY, serving, skip_module_unless_packaged_model_serves

anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed (requirements-dev.txt)")
skip_module_unless_packaged_model_serves()

MODEL = PACKAGED_MODEL_NAME
SYSTEM = "You are a concise assistant."
QUESTION = "What is the capital of France? Answer in one sentence."
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def server():
    args = ("--port", "0", "--host", "127.0.0.1", "--max-model-len", "2048")
    tools = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    with serving(*args, *tools, env={"VLLM_API_KEY": API_KEY}) as serve:
        yield serve


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.wait_ready(), api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def openai_client(server):
    return server.client()


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def greedy(client, **kwargs):
    """A Messages answer with temperature 0 (the SDK takes sampling fields through `extra_body`)."""
    return client.messages.create(model=MODEL, extra_body={"temperature": 0}, **kwargs)


def test_a_greedy_message_is_the_chat_answer_token_for_token(client, openai_client):
    message = greedy(client, max_tokens=48, system=SYSTEM, messages=[{"role": "user", "content": QUESTION}])
    chat = openai_client.chat.completions.create(
        model=MODEL,
        temperature=0,
        max_tokens=48,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        extra_body={"return_token_ids": True},
    )
    choice = chat.choices[0]
    assert text_of(message) == choice.message.content
    assert message.usage.input_tokens == chat.usage.prompt_tokens
    assert message.usage.output_tokens == chat.usage.completion_tokens == len(choice.token_ids)
    assert message.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[choice.finish_reason]
    assert (message.type, message.role, message.model) == ("message", "assistant", MODEL)
    # top_k and top_p that leave only the greedy token change nothing.
    narrowed = client.messages.create(
        model=MODEL,
        max_tokens=48,
        system=SYSTEM,
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"top_k": 1, "top_p": 0.5},
    )
    assert text_of(narrowed) == text_of(message)


def test_system_blocks_are_the_system_string(client):
    plain = greedy(client, max_tokens=24, system=SYSTEM, messages=[{"role": "user", "content": QUESTION}])
    halves = [{"type": "text", "text": SYSTEM[:10]}, {"type": "text", "text": SYSTEM[10:]}]
    blocks = greedy(client, max_tokens=24, system=halves, messages=[{"role": "user", "content": QUESTION}])
    assert text_of(blocks) == text_of(plain)
    assert blocks.usage.input_tokens == plain.usage.input_tokens


def test_a_stop_sequence_ends_the_answer_where_it_appears(client):
    whole = text_of(greedy(client, max_tokens=48, messages=[{"role": "user", "content": QUESTION}]))
    words = whole.split()
    assert len(words) > 2, whole
    stop = words[2]
    cut = greedy(client, max_tokens=48, stop_sequences=[stop], messages=[{"role": "user", "content": QUESTION}])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert text_of(cut) == whole[: whole.index(stop)]


def test_a_streamed_message_reassembles_to_the_whole_one(client):
    request = {"max_tokens": 40, "system": SYSTEM, "messages": [{"role": "user", "content": QUESTION}]}
    whole = greedy(client, **request)
    kinds = []
    with client.messages.stream(model=MODEL, extra_body={"temperature": 0}, **request) as stream:
        for event in stream:
            kinds.append(event.type)
        streamed = stream.get_final_message()
    assert text_of(streamed) == text_of(whole)
    assert (streamed.stop_reason, streamed.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)
    assert streamed.usage.input_tokens == whole.usage.input_tokens
    # The SDK adds its own `text` events beside the wire's; the wire's come in Anthropic's order.
    wire = [k for k in kinds if k != "text"]
    assert wire[:2] == ["message_start", "content_block_start"]
    assert wire[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(wire[2:-3]) == {"content_block_delta"}


def test_count_tokens_is_the_answers_input_tokens(client):
    conversation = {
        "system": SYSTEM,
        "messages": [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello. How can I help?"},
            {"role": "user", "content": [{"type": "text", "text": QUESTION}]},
        ],
    }
    counted = client.messages.count_tokens(model=MODEL, **conversation)
    answer = greedy(client, max_tokens=4, **conversation)
    assert counted.input_tokens == answer.usage.input_tokens > 0


def test_a_tool_round_trip(client):
    question = {"role": "user", "content": "What is the weather in Paris?"}
    called = greedy(
        client,
        max_tokens=64,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[question],
    )
    uses = [block for block in called.content if block.type == "tool_use"]
    assert called.stop_reason == "tool_use" and len(uses) == 1, called
    use = uses[0]
    assert use.name == "get_weather" and isinstance(use.input.get("city"), str), use
    # The same call streamed: its input arrives as JSON pieces that add up to the input.
    with client.messages.stream(
        model=MODEL,
        extra_body={"temperature": 0},
        max_tokens=64,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[question],
    ) as stream:
        pieces = [
            e.delta.partial_json
            for e in stream
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        ]
        streamed = stream.get_final_message()
    assert json.loads("".join(pieces)) == use.input
    assert [b.input for b in streamed.content if b.type == "tool_use"] == [use.input]
    follow_up = [
        question,
        {"role": "assistant", "content": [block.model_dump() for block in called.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C"}]},
    ]
    answer = greedy(client, max_tokens=48, tools=[WEATHER_TOOL], tool_choice={"type": "none"}, messages=follow_up)
    assert answer.stop_reason in ("end_turn", "max_tokens") and text_of(answer), answer
    assert [b.type for b in answer.content] == ["text"]
    counted = client.messages.count_tokens(
        model=MODEL, tools=[WEATHER_TOOL], tool_choice={"type": "none"}, messages=follow_up
    )
    assert counted.input_tokens == answer.usage.input_tokens


def raw(server, body: dict, path: str = "/v1/messages", key: str = API_KEY) -> tuple[int, dict]:
    status, data = server.http("POST", path, body, headers={"x-api-key": key})
    return status, json.loads(data)


def assert_anthropic_400(status: int, body: dict, *mentions: str) -> None:
    assert status == 400, body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    for mention in mentions:
        assert mention in body["error"]["message"], body


def test_bad_input_gets_anthropic_shaped_400s(server, client):
    user = {"role": "user", "content": "Hi"}
    status, body = raw(server, {"model": MODEL, "messages": [user]})
    assert_anthropic_400(status, body, "max_tokens", "Field required")
    status, body = raw(
        server, {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}
    )
    assert_anthropic_400(status, body, "messages.0.content.0", "hologram")
    orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}
    status, body = raw(server, {"model": MODEL, "max_tokens": 4, "messages": [orphan]})
    assert_anthropic_400(status, body, "messages.0.content.0.tool_use_id", "toolu_1")
    # What the chat pipeline refuses comes back under the Messages field's name.
    status, body = raw(server, {"model": MODEL, "max_tokens": 4, "messages": [user], "stop_sequences": [""]})
    assert_anthropic_400(status, body, "stop_sequences")
    status, body = raw(server, {"model": MODEL, "max_tokens": 4, "messages": [user], "temperature": -1})
    assert_anthropic_400(status, body, "temperature")
    status, body = raw(server, {"model": MODEL, "max_tokens": 4, "messages": [user], "container": "c"})
    assert_anthropic_400(status, body, "container")
    status, body = raw(
        server,
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
        "/v1/messages/count_tokens",
    )
    assert_anthropic_400(status, body, "messages.0.content.0", "image")
    status, body = raw(server, {"model": "no-such-model", "max_tokens": 4, "messages": [user]})
    assert (status, body["error"]["type"]) == (404, "not_found_error")
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [{"type": "hologram"}]}]
        )


def test_the_key_comes_as_x_api_key_or_bearer(server, client):
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    status, answer = raw(server, body, key="wrong")
    assert (status, answer["type"], answer["error"]["type"]) == (401, "error", "authentication_error")
    status, _ = server.http("POST", "/v1/messages", body, headers={"authorization": f"Bearer {API_KEY}"})
    assert status == 200
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.wait_ready(), api_key="wrong", max_retries=0).messages.create(
            model=MODEL, **{k: body[k] for k in ("max_tokens", "messages")}
        )
    # x-api-key opens the other routes too.
    status, _ = server.http("GET", "/v1/models", headers={"x-api-key": API_KEY})
    assert status == 200


def test_messages_requests_are_counted_in_metrics(server, client):
    greedy(client, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    status, text = server.http("GET", "/metrics")
    assert status == 200
    for handler in ("/v1/messages", "/v1/messages/count_tokens"):
        assert f'http_requests_total{{method="POST",status="2xx",handler="{handler}"}}' in text.decode(), handler


def test_the_request_id_header_names_the_message(client):
    message = client.messages.create(
        model=MODEL,
        max_tokens=2,
        messages=[{"role": "user", "content": "Hi"}],
        extra_headers={"X-Request-Id": "abc123"},
    )
    assert message.id == "chatcmpl-abc123"
