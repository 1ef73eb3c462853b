"""The Rust frontend's answers judged by vLLM 0.33's own response models:
whole answers and every streamed chunk of `/v1/completions` and
`/v1/chat/completions`, with the options of issue 22 on (`return_token_ids`,
`echo`, `continuous_usage_stats`, `include_stop_str_in_output`,
`request_id`, `truncate_prompt_tokens`, `continue_final_message`), must
validate as `CompletionResponse`, `ChatCompletionResponse`,
`CompletionStreamResponse`, `ChatCompletionStreamResponse` and `UsageInfo`;
and a whole answer must have every key vLLM's `model_dump()` gives, except
those of features this frontend does not serve (listed below, with why).

Runs `python -m vllm_rs serve --model echo` (the Rust frontend) from the vLLM
0.33 venv, as README.md says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")

from vllm.entrypoints.openai.chat_completion.protocol import (  # noqa: E402
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
)
from vllm.entrypoints.openai.completion.protocol import (  # noqa: E402
    CompletionResponse,
    CompletionStreamResponse,
)
from vllm.entrypoints.serve.engine.protocol import UsageInfo  # noqa: E402

from tests.conformance.support import API_KEY, AUTH, port_of, send, serving  # noqa: E402
from tests.test_serve import Serve, rust_frontend_available  # noqa: E402

pytestmark = pytest.mark.skipif(not rust_frontend_available(), reason="vllm-rs binary not built")

#: Keys of vLLM's whole answers this frontend leaves out, and why.
NOT_SERVED = {
    "service_tier": "no service tiers",
    "kv_transfer_params": "no KV transfer (disaggregated serving)",
    "ec_transfer_params": "no encoder cache transfer",
    "metrics": "per-request metrics are not served (enable_per_request_metrics is refused)",
    "prompt_text": "return_prompt_text is not served",
    "routed_experts": "no expert routing export",
    "weight_versions": "return_weight_versions is not served",
}

USER_HI = [{"role": "user", "content": "hi"}]
CHAT_BODIES = [
    {"messages": USER_HI, "max_tokens": 3},
    {"messages": USER_HI, "max_tokens": 3, "return_token_ids": True, "request_id": "compat-1"},
    {"messages": [*USER_HI, {"role": "assistant", "content": "Once"}], "max_tokens": 3, "echo": True},
    {"messages": [*USER_HI, {"role": "assistant", "content": "Once"}], "max_tokens": 3,
     "continue_final_message": True},
    {"messages": USER_HI, "max_tokens": 8, "stop": [": h"], "include_stop_str_in_output": True},
    {"messages": USER_HI, "max_tokens": 3, "logprobs": True, "top_logprobs": 2, "prompt_logprobs": 1},
    {"messages": USER_HI, "max_tokens": 3, "truncate_prompt_tokens": 4, "n": 2, "temperature": 1.0},
]  # fmt: skip
COMPLETION_BODIES = [
    {"prompt": "abc", "max_tokens": 3},
    {"prompt": "abc", "max_tokens": 3, "return_token_ids": True, "echo": True},
    {"prompt": "abc", "max_tokens": 3, "logprobs": 2, "prompt_logprobs": 1},
    {"prompt": "hello world", "max_tokens": 9, "stop": ["wor"], "include_stop_str_in_output": True},
    {"prompt": "abcdefgh", "max_tokens": 3, "truncate_prompt_tokens": 3, "request_id": "compat-2"},
]


@pytest.fixture(scope="module")
def served() -> Iterator[Serve]:
    with serving("--max-model-len", "64", env={"VLLM_API_KEY": API_KEY}) as serve:
        yield serve


def post(serve: Serve, path: str, body: dict[str, Any]) -> Any:
    status, answer = send("POST", port_of(serve), path, body, headers=AUTH)
    assert status == 200, answer
    return answer


def stream(serve: Serve, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every chunk of `body` streamed with usage on every chunk (prompt
    logprobs left out: vLLM refuses them in a stream)."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {key: value for key, value in body.items() if key != "prompt_logprobs"}
    status, raw = send("POST", port_of(serve), path, {**body, "stream": True, "stream_options": options}, headers=AUTH)
    assert status == 200, raw
    events = [line[len(b"data: ") :] for line in raw.split(b"\n\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]", raw
    return [json.loads(event) for event in events[:-1]]


def missing_keys(ours: dict[str, Any], dumped: dict[str, Any], where: str) -> list[str]:
    """The keys of vLLM's dump of `ours` that `ours` lacks (nested through
    choices, message and usage), less those of NOT_SERVED."""
    missing = [f"{where}.{key}" for key in dumped if key not in ours and key not in NOT_SERVED]
    for key in ("message", "usage"):
        if isinstance(dumped.get(key), dict) and isinstance(ours.get(key), dict):
            missing += missing_keys(ours[key], dumped[key], f"{where}.{key}")
    for index, (mine, theirs) in enumerate(zip(ours.get("choices", []), dumped.get("choices", []))):
        missing += missing_keys(mine, theirs, f"{where}.choices[{index}]")
    return missing


#: (path, whole answer model, chunk model, body) of every case.
CASES = [("/v1/chat/completions", ChatCompletionResponse, ChatCompletionStreamResponse, b) for b in CHAT_BODIES] + [
    ("/v1/completions", CompletionResponse, CompletionStreamResponse, b) for b in COMPLETION_BODIES
]


@pytest.mark.parametrize(
    "path, whole_model, chunk_model, body", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_answers_are_vllms_models(served, path, whole_model, chunk_model, body):
    answer = post(served, path, body)
    model = whole_model.model_validate(answer)
    # `tool_calls` is left out when empty, by vLLM's own serializer too.
    assert missing_keys(answer, model.model_dump(), "response") == []
    UsageInfo.model_validate(answer["usage"])
    for chunk in stream(served, path, body):
        chunk_model.model_validate(chunk)
        UsageInfo.model_validate(chunk["usage"])


def test_the_options_show_in_what_vllms_models_read(served):
    chat = ChatCompletionResponse.model_validate(post(served, "/v1/chat/completions", CHAT_BODIES[1]))
    assert chat.id == "chatcmpl-compat-1"
    assert bytes(chat.prompt_token_ids).decode() == "user: hi\nassistant: "
    assert bytes(chat.choices[0].token_ids).decode() == chat.choices[0].message.content == "use"
    echoed = ChatCompletionResponse.model_validate(post(served, "/v1/chat/completions", CHAT_BODIES[2]))
    assert echoed.choices[0].message.content.startswith("Once")
    completion = CompletionResponse.model_validate(post(served, "/v1/completions", COMPLETION_BODIES[4]))
    assert (completion.id, completion.usage.prompt_tokens, completion.choices[0].text) == ("cmpl-compat-2", 3, "fgh")
