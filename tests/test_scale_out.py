"""vLLM 0.33's scale-out routes (render, derender, tokens in / tokens out)
and the LoRA routes, end to end on `python -m vllm_rs serve`.

The scale-out routes are checked against the routes they mirror on the same
server: a rendered prompt is the prompt the chat (or completions) route runs,
`/inference/v1/generate` gives the greedy token ids `/v1/completions` gives
for the same prompt ids, and derender gives back the text those routes
answer. One real-model server (the packaged SmolLM2, `--enable-scale-out`)
for those; an `echo` server without the flag for the 403s."""

from __future__ import annotations

import json
import threading

import pytest
from vllm_rs.model_files import PACKAGED_MODEL_NAME, ModelNotFoundError, packaged_model_path

from tests.support.wait import wait_until
from tests.test_serve import needs_frontend, rust_frontend_available, serving

MODEL = PACKAGED_MODEL_NAME
SCALE_OUT_ROUTES = [
    "/v1/chat/completions/render",
    "/v1/completions/render",
    "/v1/messages/render",
    "/v1/chat/completions/derender",
    "/v1/completions/derender",
    "/v1/responses/render",
    "/inference/v1/generate",
    "/inference/v1/abort_requests",
]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a primary color."}]


def post(server, path: str, body: dict) -> tuple[int, dict | None]:
    status, data = server.http("POST", path, body)
    return status, (json.loads(data) if data else None)


@needs_frontend
def test_without_the_flag_scale_out_is_403_and_lora_400():
    with serving("--model", "echo", "--port", "0", "--host", "127.0.0.1") as serve:
        for route in SCALE_OUT_ROUTES:
            status, body = post(serve, route, {})
            assert (status, body["error"]["type"]) == (403, "PermissionDeniedError"), (route, body)
            assert "--enable-scale-out" in body["error"]["message"], body
        for route in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            status, body = post(serve, route, {"lora_name": "a", "lora_path": "/tmp/a"})
            assert status == 400 and "LoRA" in body["error"]["message"], (route, body)


@pytest.fixture(scope="module")
def server():
    try:
        packaged_model_path()
    except ModelNotFoundError as e:
        pytest.skip(f"the packaged SmolLM2 GGUF is not installed: {e}")
    if not rust_frontend_available():
        pytest.skip("the vllm-rs binary is not built")
    with serving("--port", "0", "--host", "127.0.0.1", "--max-model-len", "2048", "--enable-scale-out") as serve:
        yield serve


def ok(server, path: str, body: dict):
    status, answer = post(server, path, body)
    assert status == 200, (path, answer)
    return answer


def test_chat_render_is_the_prompt_chat_runs_and_generate_its_answer(server):
    request = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 24}
    rendered = ok(server, "/v1/chat/completions/render", request)
    chat = ok(server, "/v1/chat/completions", {**request, "return_token_ids": True})
    assert rendered["token_ids"] == chat["prompt_token_ids"]
    assert rendered["sampling_params"]["temperature"] == 0 and rendered["sampling_params"]["max_tokens"] == 24
    assert rendered["request_id"].startswith("chatcmpl-") and rendered["model"] == MODEL
    generated = ok(server, "/inference/v1/generate", rendered)
    assert generated["request_id"] == f"generate-tokens-{rendered['request_id']}"
    (choice,) = generated["choices"]
    assert choice["token_ids"] == chat["choices"][0]["token_ids"]
    assert choice["finish_reason"] == chat["choices"][0]["finish_reason"]
    derendered = ok(
        server,
        "/v1/chat/completions/derender",
        {"generate_response": generated, "prompt_tokens": len(rendered["token_ids"]), "chat_request": request},
    )
    assert derendered["choices"][0]["message"]["content"] == chat["choices"][0]["message"]["content"]
    assert derendered["usage"]["prompt_tokens"] == chat["usage"]["prompt_tokens"]
    assert derendered["usage"]["completion_tokens"] == chat["usage"]["completion_tokens"]


def test_generate_gives_the_greedy_ids_completions_gives(server):
    prompt_ids = ok(server, "/tokenize", {"model": MODEL, "prompt": "The days of the week are"})["tokens"]
    completion = ok(
        server,
        "/v1/completions",
        {"model": MODEL, "prompt": prompt_ids, "temperature": 0, "max_tokens": 20, "return_token_ids": True},
    )
    generated = ok(
        server,
        "/inference/v1/generate",
        {"token_ids": prompt_ids, "sampling_params": {"temperature": 0, "max_tokens": 20}, "request_id": "g1"},
    )
    assert generated["request_id"] == "generate-tokens-g1"
    assert generated["choices"][0]["token_ids"] == completion["choices"][0]["token_ids"]
    rendered = ok(server, "/v1/completions/render", {"model": MODEL, "prompt": "The days of the week are"})
    assert [r["token_ids"] for r in rendered] == [prompt_ids]
    assert rendered[0]["sampling_params"]["max_tokens"] == 16
    derendered = ok(
        server,
        "/v1/completions/derender",
        {"generate_responses": [generated], "prompt_tokens": [len(prompt_ids)]},
    )
    assert derendered["choices"][0]["text"] == completion["choices"][0]["text"]
    assert derendered["usage"]["completion_tokens"] == completion["usage"]["completion_tokens"]


def test_messages_render_counts_what_count_tokens_counts(server):
    body = {"model": MODEL, "max_tokens": 8, "system": "Be brief.", "messages": [MESSAGES[1]]}
    rendered = ok(server, "/v1/messages/render", body)
    counted = ok(server, "/v1/messages/count_tokens", {k: body[k] for k in ("model", "system", "messages")})
    assert len(rendered["token_ids"]) == counted["input_tokens"]
    chat = ok(server, "/v1/chat/completions/render", {"model": MODEL, "messages": MESSAGES, "max_tokens": 8})
    assert rendered["token_ids"] == chat["token_ids"]
    status, error = post(server, "/v1/messages/render", {"model": MODEL, "messages": [MESSAGES[1]]})
    assert status == 400 and error["type"] == "error" and "max_tokens" in error["error"]["message"], error


def test_responses_render_is_the_chat_prompt_of_its_messages(server):
    body = {"model": MODEL, "instructions": MESSAGES[0]["content"], "input": MESSAGES[1]["content"]}
    rendered = ok(server, "/v1/responses/render", {**body, "max_output_tokens": 12})
    chat = ok(server, "/v1/chat/completions/render", {"model": MODEL, "messages": MESSAGES})
    assert rendered["token_ids"] == chat["token_ids"]
    assert rendered["request_id"].startswith("resp_") and rendered["sampling_params"]["max_tokens"] == 12


def test_generate_refuses_what_it_does_not_serve_by_name(server):
    for body, param in [
        ({"token_ids": [1, 2], "sampling_params": {}, "stream": True}, "stream"),
        ({"token_ids": [1, 2], "sampling_params": {"guided_regex": "a"}}, "sampling_params.guided_regex"),
        ({"token_ids": [1, 2], "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
        ({"token_ids": [], "sampling_params": {}}, "token_ids"),
        ({"token_ids": [10**9], "sampling_params": {}}, "token_ids"),
    ]:
        status, error = post(server, "/inference/v1/generate", body)
        assert (status, error["error"]["param"]) == (400, param), (body, error)


def test_abort_ends_a_generate_request_as_abort(server):
    prompt_ids = ok(server, "/tokenize", {"model": MODEL, "prompt": "Count forever:"})["tokens"]
    max_tokens = 1800
    result = {}

    def run():
        body = {
            "token_ids": prompt_ids,
            "request_id": "long-one",
            "sampling_params": {"max_tokens": max_tokens, "ignore_eos": True},
        }
        result["answer"] = post(server, "/inference/v1/generate", body)

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: ok_load(server) >= 1, "the generate request to be in flight", 60)
    # vLLM's id for it, as its answer would carry it.
    status, body = post(server, "/inference/v1/abort_requests", {"request_ids": ["generate-tokens-long-one"]})
    assert (status, body) == (200, None)
    thread.join(60)
    status, answer = result["answer"]
    assert status == 200, answer
    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "abort" and len(choice["token_ids"]) < max_tokens, choice
    status, error = post(server, "/inference/v1/abort_requests", {})
    assert status == 400 and error["error"]["param"] == "request_ids"


def ok_load(server) -> int:
    status, data = server.http("GET", "/load")
    return json.loads(data)["server_load"] if status == 200 else 0
