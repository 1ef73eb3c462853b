"""The request options vLLM 0.33 honours that this project once ignored
(issue 22), against the Rust frontend (`serve --model echo`) with the real
`openai` client: each is honoured as vLLM 0.33 honours it, or refused with a
400 naming it. Also the response shape vLLM 0.33's models give (every key
there, null when empty).

The `echo` model repeats its prompt byte after byte and its tokenizer is
bytes (token id = byte), with the chat template `role: content\\n` per
message and `assistant: ` as the generation prompt; so every answer and
every prompt here is known exactly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.conformance.support import API_KEY, AUTH, assert_error_shape, port_of, send, serving
from tests.test_serve import Serve, rust_frontend_available

pytestmark = pytest.mark.skipif(not rust_frontend_available(), reason="vllm-rs binary not built")

MAX_MODEL_LEN = 64
USER_HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served() -> Iterator[Serve]:
    """echo behind the Rust frontend, `--max-model-len 64`, no request templates."""
    with serving("--max-model-len", str(MAX_MODEL_LEN), env={"VLLM_API_KEY": API_KEY}) as serve:
        yield serve


@pytest.fixture(scope="module")
def trusting() -> Iterator[Serve]:
    """The same with `--trust-request-chat-template`."""
    with serving("--trust-request-chat-template", env={"VLLM_API_KEY": API_KEY}) as serve:
        yield serve


def text_of(ids: list[int]) -> str:
    """The echo tokenizer's text of `ids` (one byte each)."""
    return bytes(ids).decode()


def post(serve: Serve, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """The status and JSON body of one request, keys exactly as sent."""
    return send("POST", port_of(serve), path, body, headers={**AUTH, **(headers or {})})


def chunks(serve: Serve, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every `data:` chunk of a streamed answer, as sent, up to `[DONE]`."""
    status, raw = send("POST", port_of(serve), path, {**body, "stream": True}, headers=AUTH)
    assert status == 200, raw
    events = [line[len(b"data: ") :] for line in raw.split(b"\n\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]", raw
    return [json.loads(event) for event in events[:-1]]


# --- include_stop_str_in_output ---------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_include_stop_str_in_output_keeps_the_stop_string(served, stream):
    client = served.client()
    common = {"model": "echo", "prompt": "hello world hello", "max_tokens": 16, "stop": ["wor"], "stream": stream}

    def text(**extra: Any) -> tuple[str, Any]:
        if not stream:
            choice = client.completions.create(**common, **extra).choices[0]
            return choice.text, choice.model_extra["stop_reason"]
        parts = list(client.completions.create(**common, **extra))
        return "".join(p.choices[0].text for p in parts), parts[-1].choices[0].model_extra["stop_reason"]

    assert text() == ("hello ", "wor")
    assert text(extra_body={"include_stop_str_in_output": True}) == ("hello wor", "wor")


def test_include_stop_str_in_output_in_chat(served):
    client = served.client()
    common = {"model": "echo", "messages": USER_HI, "max_tokens": 16, "stop": [": h"]}
    assert client.chat.completions.create(**common).choices[0].message.content == "user"
    kept = client.chat.completions.create(**common, extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].message.content == "user: h"


# --- return_token_ids -------------------------------------------------------


def test_return_token_ids_in_a_completion(served):
    status, body = post(served, "/v1/completions", {"prompt": "abc", "max_tokens": 5, "return_token_ids": True})
    assert status == 200, body
    choice = body["choices"][0]
    assert text_of(choice["prompt_token_ids"]) == "abc"
    assert text_of(choice["token_ids"]) == choice["text"] == "abcab"
    assert len(choice["token_ids"]) == body["usage"]["completion_tokens"]
    streamed = chunks(served, "/v1/completions", {"prompt": "abc", "max_tokens": 5, "return_token_ids": True})
    assert text_of(streamed[0]["choices"][0]["prompt_token_ids"]) == "abc"
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in streamed[1:]), "only the first chunk has them"
    assert text_of([t for c in streamed for t in c["choices"][0]["token_ids"]]) == "abcab"


def test_return_token_ids_in_a_chat(served):
    status, body = post(
        served, "/v1/chat/completions", {"messages": USER_HI, "max_tokens": 4, "return_token_ids": True}
    )
    assert status == 200, body
    assert text_of(body["prompt_token_ids"]) == "user: hi\nassistant: "
    assert text_of(body["choices"][0]["token_ids"]) == body["choices"][0]["message"]["content"] == "user"
    streamed = chunks(served, "/v1/chat/completions", {"messages": USER_HI, "max_tokens": 4, "return_token_ids": True})
    assert text_of(streamed[0]["prompt_token_ids"]) == "user: hi\nassistant: "
    assert all("prompt_token_ids" not in c for c in streamed[1:])
    assert text_of([t for c in streamed[1:] for t in c["choices"][0]["token_ids"]]) == "user"


def test_without_return_token_ids_the_keys_are_null(served):
    client = served.client()
    choice = client.completions.create(model="echo", prompt="abc", max_tokens=2).choices[0]
    assert choice.model_extra["token_ids"] is None and choice.model_extra["prompt_token_ids"] is None


# --- stream_options.continuous_usage_stats -----------------------------------


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "abcdef", "max_tokens": 6}),
    ("/v1/chat/completions", {"messages": USER_HI, "max_tokens": 6}),
])  # fmt: skip
def test_continuous_usage_stats_put_usage_on_every_chunk(served, path, body):
    options = {"include_usage": True, "continuous_usage_stats": True}
    streamed = chunks(served, path, {**body, "stream_options": options})
    *choice_chunks, last = streamed
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    prompt_tokens = last["usage"]["prompt_tokens"]
    counts = [c["usage"]["completion_tokens"] for c in choice_chunks]
    assert counts == sorted(counts) and counts[-1] == 6, counts
    for chunk in choice_chunks:
        usage = chunk["usage"]
        assert usage["prompt_tokens"] == prompt_tokens
        assert usage["total_tokens"] == prompt_tokens + usage["completion_tokens"]
    # As in vLLM, continuous stats need include_usage.
    alone = chunks(served, path, {**body, "stream_options": {"continuous_usage_stats": True}})
    assert all("usage" not in c for c in alone)


# --- echo in chat -----------------------------------------------------------


def test_chat_echo_prepends_the_last_message_of_the_answers_role(served):
    client = served.client()
    messages = [*USER_HI, {"role": "assistant", "content": "Once"}]
    plain = client.chat.completions.create(model="echo", messages=messages, max_tokens=4)
    echoed = client.chat.completions.create(model="echo", messages=messages, max_tokens=4, extra_body={"echo": True})
    assert echoed.choices[0].message.content == "Once" + plain.choices[0].message.content
    # The last message is the user's, the answer the assistant's: nothing to echo.
    other = client.chat.completions.create(model="echo", messages=USER_HI, max_tokens=4, extra_body={"echo": True})
    assert other.choices[0].message.content == "user"
    streamed = chunks(served, "/v1/chat/completions", {"messages": messages, "max_tokens": 4, "echo": True})
    assert streamed[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert streamed[1]["choices"][0]["delta"] == {"content": "Once"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in streamed) == echoed.choices[0].message.content


# --- chat_template in the request -------------------------------------------


def test_a_request_chat_template_is_refused_unless_trusted(served, trusting):
    body = {"messages": USER_HI, "max_tokens": 2, "return_token_ids": True,
            "chat_template": "{% for m in messages %}[{{ m.content }}]{% endfor %}"}  # fmt: skip
    status, error = post(served, "/v1/chat/completions", body)
    assert_error_shape(status, error, 400, "chat_template")
    assert "--trust-request-chat-template" in error["error"]["message"]
    status, answer = post(trusting, "/v1/chat/completions", body)
    assert status == 200, answer
    assert text_of(answer["prompt_token_ids"]) == "[hi]"
    status, error = post(trusting, "/v1/chat/completions", {**body, "chat_template": "{% for %}"})
    assert_error_shape(status, error, 400, "chat_template")


# --- request_id -------------------------------------------------------------


def test_the_body_request_id_is_the_response_id_and_the_header_wins(served):
    client = served.client()
    answer = client.chat.completions.create(
        model="echo", messages=USER_HI, max_tokens=2, extra_body={"request_id": "mine-1"}
    )
    assert answer.id == "chatcmpl-mine-1"
    completion = client.completions.create(model="echo", prompt="x", max_tokens=2, extra_body={"request_id": "mine-2"})
    assert completion.id == "cmpl-mine-2"
    streamed = chunks(served, "/v1/completions", {"prompt": "x", "max_tokens": 2, "request_id": "mine-3"})
    assert {c["id"] for c in streamed} == {"cmpl-mine-3"}
    status, body = post(served, "/v1/completions", {"prompt": "x", "max_tokens": 2, "request_id": "body"},
                        headers={"x-request-id": "header"})  # fmt: skip
    assert (status, body["id"]) == (200, "cmpl-header")
    status, body = post(served, "/v1/completions", {"prompt": "x", "max_tokens": 2, "request_id": "has space"})
    assert_error_shape(status, body, 400, "request_id")


# --- prompt_embeds, mm_processor_kwargs -------------------------------------


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "x", "prompt_embeds": "AAAA"}, "prompt_embeds"),
    ("/v1/chat/completions", {"messages": USER_HI, "mm_processor_kwargs": {"num_crops": 4}}, "mm_processor_kwargs"),
])  # fmt: skip
def test_options_for_inputs_not_served_are_refused(served, path, body, param):
    status, error = post(served, path, {**body, "max_tokens": 2})
    assert_error_shape(status, error, 400, param)
    with pytest.raises(openai.BadRequestError) as raised:
        client = served.client()
        if path == "/v1/completions":
            client.completions.create(model="echo", prompt="x", max_tokens=2, extra_body={param: body[param]})
        else:
            client.chat.completions.create(
                model="echo", messages=USER_HI, max_tokens=2, extra_body={param: body[param]}
            )
    assert raised.value.status_code == 400 and raised.value.response.json()["error"]["param"] == param


# --- truncate_prompt_tokens -------------------------------------------------


def test_truncate_prompt_tokens_keeps_the_last_tokens(served):
    client = served.client()
    answer = client.completions.create(model="echo", prompt="abcdefghij", max_tokens=4,
                                       extra_body={"truncate_prompt_tokens": 3, "return_token_ids": True})  # fmt: skip
    choice = answer.choices[0]
    assert (answer.usage.prompt_tokens, text_of(choice.model_extra["prompt_token_ids"]), choice.text) == (
        3,
        "hij",
        "hijh",
    )
    right = client.completions.create(model="echo", prompt="abcdefghij", max_tokens=4,
                                      extra_body={"truncate_prompt_tokens": 3, "truncation_side": "right"})  # fmt: skip
    assert right.choices[0].text == "abca"
    # -1: the model length less one token, so a prompt too long for the model still gets an answer.
    long = client.completions.create(
        model="echo", prompt="z" * 200, max_tokens=1, extra_body={"truncate_prompt_tokens": -1}
    )
    assert long.usage.prompt_tokens == MAX_MODEL_LEN - 1
    chat = client.chat.completions.create(model="echo", messages=USER_HI, max_tokens=2,
                                          extra_body={"truncate_prompt_tokens": 4})  # fmt: skip
    assert chat.usage.prompt_tokens == 4


def test_truncate_prompt_tokens_beyond_the_model_length_is_refused(served):
    for value in (MAX_MODEL_LEN + 1, -2):
        status, error = post(
            served, "/v1/completions", {"prompt": "x", "max_tokens": 2, "truncate_prompt_tokens": value}
        )
        assert_error_shape(status, error, 400, "truncate_prompt_tokens")


# --- continue_final_message -------------------------------------------------


@pytest.mark.parametrize("add_generation_prompt", [None, False])
def test_continue_final_message_leaves_the_last_message_open(served, add_generation_prompt):
    body = {"messages": [*USER_HI, {"role": "assistant", "content": "Once"}], "max_tokens": 3,
            "continue_final_message": True, "return_token_ids": True}  # fmt: skip
    if add_generation_prompt is not None:
        body["add_generation_prompt"] = add_generation_prompt
    status, answer = post(served, "/v1/chat/completions", body)
    assert status == 200, answer
    assert text_of(answer["prompt_token_ids"]) == "user: hi\nassistant: Once"
    assert answer["choices"][0]["message"]["role"] == "assistant"


def test_continue_final_message_with_the_generation_prompt_is_refused(served):
    body = {"messages": USER_HI, "max_tokens": 2, "continue_final_message": True, "add_generation_prompt": True}
    status, error = post(served, "/v1/chat/completions", body)
    assert_error_shape(status, error, 400, "continue_final_message")
    assert error["error"]["message"] == "Cannot set both `continue_final_message` and `add_generation_prompt` to True."


# --- response shape ---------------------------------------------------------


def test_a_whole_chat_answer_has_every_key_vllm_sends(served):
    status, body = post(served, "/v1/chat/completions", {"messages": USER_HI, "max_tokens": 2})
    assert status == 200, body
    assert {"prompt_logprobs", "prompt_token_ids", "system_fingerprint"} <= set(body)
    choice = body["choices"][0]
    assert choice["token_ids"] is None and choice["stop_reason"] is None
    assert choice["message"] == {"role": "assistant", "content": "us", "refusal": None, "annotations": None,
                                 "audio": None, "function_call": None, "reasoning": None}  # fmt: skip
    assert body["usage"] == {"prompt_tokens": 20, "total_tokens": 22, "completion_tokens": 2,
                             "prompt_tokens_details": None, "completion_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip


def test_a_whole_completion_has_every_key_vllm_sends(served):
    status, body = post(served, "/v1/completions", {"prompt": "ab", "max_tokens": 2})
    assert status == 200, body
    assert set(body["choices"][0]) >= {"index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids",
                                       "prompt_logprobs", "prompt_token_ids"}  # fmt: skip
    assert "prompt_logprobs" not in body, "completions put prompt logprobs on the choice"


def test_the_streamed_finish_reason_comes_in_a_chunk_of_its_own(served):
    # As vLLM 0.33's bundled frontend streams it: the last tokens, then the
    # finish with an empty delta (test_usage_details.py compares the two).
    streamed = chunks(served, "/v1/chat/completions", {"messages": USER_HI, "max_tokens": 3})
    assert [c["choices"][0]["finish_reason"] for c in streamed][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in streamed[:-1])
    last = streamed[-1]["choices"][0]
    assert last["delta"] == {} and last["stop_reason"] is None and "token_ids" in last
    assert [c["choices"][0]["delta"].get("content") for c in streamed[1:-1]] == ["u", "s", "e"]
    completion = chunks(served, "/v1/completions", {"prompt": "abc", "max_tokens": 3, "stop": ["c"]})
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in completion] == [
        ("a", None),
        ("b", None),
        ("", "stop"),
    ]
    assert completion[-1]["choices"][0]["stop_reason"] == "c"
