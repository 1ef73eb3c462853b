"""The OpenAI API as the frontend serves it, with the `openai` client:
completions and chat, streamed and not, stop strings and stop token ids,
errors in the OpenAI shape, the API key, the small routes, and requests
pinned to an engine."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests.conformance.support import API_KEY


def test_api_key_is_on_no_command_line_and_is_required(stack):
    for process in stack.stack_processes():
        assert API_KEY.encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes(), process.cmdline()
    assert stack.http("GET", "/v1/models")[0] == 401
    assert stack.http("GET", "/v1/models", headers={"authorization": "Bearer wrong"})[0] == 401
    assert stack.http("GET", "/v1/models", headers={"authorization": f"Bearer {API_KEY}"})[0] == 200


def test_completion(stack):
    result = stack.client().completions.create(model="echo", prompt="hello", max_tokens=7)
    choice = result.choices[0]
    assert choice.text == "hellohe" and choice.finish_reason == "length"
    assert result.id.startswith("cmpl-") and result.model == "echo"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (5, 7, 12)


def test_streamed_completion_with_usage(stack):
    chunks = list(
        stack.client().completions.create(
            model="echo", prompt="stream me", max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == "stream mestr"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) <= {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_and_streamed_chat(stack):
    client = stack.client()
    messages = [{"role": "user", "content": "hi"}]
    reply = client.chat.completions.create(model="echo", messages=messages, max_tokens=11)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "user: hi\nas"
    assert reply.id.startswith("chatcmpl-")
    chunks = list(client.chat.completions.create(model="echo", messages=messages, max_completion_tokens=4, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "user"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_strings_and_stop_token_ids(stack):
    client = stack.client()
    by_string = client.completions.create(model="echo", prompt="hello world", max_tokens=30, stop=["wor"])
    assert by_string.choices[0].text == "hello "
    assert by_string.choices[0].finish_reason == "stop" and by_string.choices[0].model_extra["stop_reason"] == "wor"
    by_token = client.completions.create(
        model="echo", prompt="hello", max_tokens=30, extra_body={"stop_token_ids": [ord("l")]}
    )
    # As in vLLM, the stop token itself is left out of the text.
    assert by_token.choices[0].text == "he"
    assert by_token.choices[0].model_extra["stop_reason"] == ord("l")


def test_errors_have_the_openai_shape(stack):
    client = stack.client()
    with pytest.raises(openai.AuthenticationError):
        stack.client(api_key="wrong").completions.create(model="echo", prompt="x", max_tokens=1)
    with pytest.raises(openai.NotFoundError) as not_found:
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    assert not_found.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="echo", prompt="x", max_tokens=1, temperature=-1)
    assert bad.value.body["param"] == "temperature" and bad.value.body["type"] == "BadRequestError"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model="echo", prompt="x" * 10, max_tokens=600)
    assert "maximum context length is 512" in too_long.value.body["message"]
    status, body = stack.http(
        "POST", "/v1/completions", {"prompt": "x"}, {"authorization": f"Bearer {API_KEY}", "x-data-parallel-rank": "7"}
    )
    assert status == 400 and json.loads(body)["error"]["param"] == "x-data-parallel-rank"
    status, body = stack.http("GET", "/no/such/route", headers={"authorization": f"Bearer {API_KEY}"})
    assert status == 404 and json.loads(body)["error"]["code"] == 404


def test_small_routes_and_open_paths(stack):
    assert stack.http("GET", "/health")[0] == 200  # open without a key
    status, metrics = stack.http("GET", "/metrics")
    assert status == 200
    for name in ("vllm:num_requests_running", "vllm:request_success_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_count", "vllm:e2e_request_latency_seconds_sum"):  # fmt: skip
        assert name in metrics.decode(), name
    assert stack.http("GET", "/load")[0] == 401
    auth = {"authorization": f"Bearer {API_KEY}"}
    assert json.loads(stack.http("GET", "/load", headers=auth)[1]) == {"server_load": 0}
    assert "version" in json.loads(stack.http("GET", "/version", headers=auth)[1])
    for path in ("/reset_prefix_cache", "/sleep?level=1", "/wake_up"):
        assert stack.http("POST", path, headers=auth)[0] == 200, path
    models = stack.client().models.list().data
    assert [m.id for m in models] == ["echo"] and models[0].model_extra["max_model_len"] == 512


def test_requests_pinned_to_each_engine(stack):
    client = stack.client()
    for rank in ("0", "1"):
        result = client.completions.create(
            model="echo", prompt="pin", max_tokens=3, extra_headers={"X-data-parallel-rank": rank}
        )
        assert result.choices[0].text == "pin"
