"""The routes vLLM 0.33 serves beside the main ones, on `python -m vllm_rs
serve` with the packaged SmolLM2-135M-Instruct: stored responses (none are
stored, as in vLLM by default), SageMaker's `/invocations`, batch chat
completions, generative scoring, `/kv_event_sources`, and the decisions
APIs (vLLM's 501 on a Llama model). Each answer is checked against the
main route that answers the same request, or vLLM's own error.

One server for the whole module. Skipped, saying why, when the packaged
model or the binary is missing."""

from __future__ import annotations

import json
import math
import re

import pytest

from tests.test_serve import API_KEY, serving, skip_module_unless_packaged_model_serves

skip_module_unless_packaged_model_serves()

AUTH = {"authorization": f"Bearer {API_KEY}"}
QUESTIONS = ["What is the capital of France?", "Name a primary colour."]


@pytest.fixture(scope="module")
def server():
    with serving(
        "--port", "0", "--host", "127.0.0.1", "--max-model-len", "1024", env={"VLLM_API_KEY": API_KEY}
    ) as serve:
        yield serve


def call(server, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    status, answer = server.http(method, path, body, headers=AUTH)
    return status, json.loads(answer)


def chat(server, question: str, **fields) -> dict:
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": 12, "temperature": 0, **fields}
    status, answer = call(server, "POST", "/v1/chat/completions", body)
    assert status == 200, answer
    return answer


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/v1/responses/resp_x1"), ("POST", "/v1/responses/resp_x1/cancel")]
)
def test_an_unstored_response_is_vllms_404(server, method, path):
    status, answer = call(server, method, path, {} if method == "POST" else None)
    assert status == 404
    assert answer == {
        "error": {
            "message": "Response with id 'resp_x1' not found.",
            "type": "invalid_request_error",
            "param": "response_id",
            "code": 404,
        }
    }


def test_kv_event_sources_are_none(server):
    assert call(server, "GET", "/kv_event_sources") == (200, {})


def test_invocations_dispatch_by_the_body(server):
    question = {"messages": [{"role": "user", "content": QUESTIONS[0]}], "max_tokens": 12, "temperature": 0}
    status, answer = call(server, "POST", "/invocations", question)
    assert status == 200, answer
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"] == chat(server, QUESTIONS[0])["choices"][0]["message"]["content"]

    prompt = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    status, answer = call(server, "POST", "/invocations", prompt)
    assert status == 200, answer
    assert answer["object"] == "text_completion"
    status, direct = call(server, "POST", "/v1/completions", prompt)
    assert answer["choices"][0]["text"] == direct["choices"][0]["text"]


@pytest.mark.parametrize("body", [{}, {"prompt": ""}, {"input": "x"}])
def test_invocations_of_no_kind_we_run_is_vllms_400(server, body):
    status, answer = call(server, "POST", "/invocations", body)
    assert status == 400
    assert answer["error"]["type"] == "BadRequestError"
    assert answer["error"]["message"] == (
        "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', 'CompletionRequest']"
    )


def test_invocations_of_a_bad_chat_names_the_field(server):
    status, answer = call(server, "POST", "/invocations", {"messages": [{"role": "user", "content": "x"}], "n": 0})
    assert (status, answer["error"]["param"]) == (400, "n")


def test_a_batch_is_each_conversation_answered_alone(server):
    body = {"messages": [[{"role": "user", "content": q}] for q in QUESTIONS], "max_tokens": 12, "temperature": 0}
    status, answer = call(server, "POST", "/v1/chat/completions/batch", body)
    assert status == 200, answer
    assert answer["object"] == "chat.completion"
    singles = [chat(server, q) for q in QUESTIONS]
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    for choice, single in zip(answer["choices"], singles, strict=True):
        assert choice["message"] == single["choices"][0]["message"]
        assert choice["finish_reason"] == single["choices"][0]["finish_reason"]
    for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert answer["usage"][field] == sum(s["usage"][field] for s in singles)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"stream": True}, "stream"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"messages": [[]]}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}]}, "messages"),
        ({"messages": [[{"role": "user", "content": "x"}], [{"role": "user"}], "x"]}, "messages"),
        ({"model": "no-such-model"}, "model"),
    ],
)
def test_a_bad_batch_is_refused_naming_the_field(server, fields, param):
    body = {"messages": [[{"role": "user", "content": QUESTIONS[0]}]], "max_tokens": 4, **fields}
    status, answer = call(server, "POST", "/v1/chat/completions/batch", body)
    assert status in (400, 404), answer
    assert answer["error"]["param"] == param, answer


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/v1/decisions", "The model does not support the Decisions API"),
        ("/v1/systemone", "The model does not support the structured decision API"),
    ],
)
def test_decisions_on_a_model_without_a_decision_reader_are_vllms_501(server, path, message):
    assert call(server, "POST", path, {"question": "x"}) == (
        501,
        {"error": {"message": message, "type": "NotImplementedError", "param": None, "code": 501}},
    )


def next_token_logprobs(server, prompt: list[int]) -> dict[int, float]:
    """The top next-token logprobs of `prompt`, from `/v1/completions`."""
    body = {"prompt": prompt, "max_tokens": 1, "logprobs": 5, "temperature": 0, "return_tokens_as_token_ids": True}
    status, answer = call(server, "POST", "/v1/completions", body)
    assert status == 200, answer
    top = answer["choices"][0]["logprobs"]["top_logprobs"][0]
    return {int(key.removeprefix("token_id:")): value for key, value in top.items()}


def test_generative_scoring_reads_the_next_tokens_probabilities(server):
    """The score is the first label's next-token probability (over the
    vocabulary, or over the labels), as `/v1/completions` logprobs give it."""
    query, items = [1, 504, 3575, 282], [[6312, 314], [4172]]
    for item in items:
        top = sorted(next_token_logprobs(server, query + item).items(), key=lambda kv: -kv[1])
        (first, lp1), (second, lp2) = top[:2]
        for apply_softmax in (False, True):
            body = {"query": query, "items": [item], "label_token_ids": [first, second], "apply_softmax": apply_softmax}
            status, answer = call(server, "POST", "/generative_scoring", body)
            assert status == 200, answer
            assert answer["object"] == "list" and answer["id"].startswith("generative-scoring-")
            assert answer["usage"] == {
                "prompt_tokens": len(query + item),
                "total_tokens": len(query + item) + 1,
                "completion_tokens": 1,
                "prompt_tokens_details": None,
            }
            [score] = answer["data"]
            assert (score["index"], score["object"]) == (0, "score")
            p1, p2 = math.exp(lp1), math.exp(lp2)
            assert score["score"] == pytest.approx(p1 / (p1 + p2) if apply_softmax else p1, rel=1e-4)


def test_generative_scoring_scores_text_items_in_order(server):
    body = {"query": "The capital of France is", "items": [" Paris", " a"], "label_token_ids": [0, 1]}
    status, answer = call(server, "POST", "/generative_scoring", body)
    assert status == 200, answer
    assert [d["index"] for d in answer["data"]] == [0, 1]
    assert all(0 <= d["score"] <= 1 for d in answer["data"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"label_token_ids": [10**9]}, "label_token_id 1000000000 is out of vocabulary range [0, "),
        ({"label_token_ids": []}, "label_token_ids must contain at least one token ID."),
        ({"items": []}, "items must contain at least one item."),
        ({"items": ["a", [1]]}, "items must be all texts or all token id lists"),
        ({"label_token_ids": list(range(21))}, "greater than max allowed: 20"),
        ({"query": None}, "query: Field required"),
    ],
)
def test_bad_generative_scoring_is_a_400(server, fields, message):
    body = {"query": "q", "items": ["a"], "label_token_ids": [1], **fields}
    body = {k: v for k, v in body.items() if v is not None}
    status, answer = call(server, "POST", "/generative_scoring", body)
    assert status == 400, answer
    assert message in answer["error"]["message"]


def test_the_routes_are_counted_by_route(server):
    """Last in the module: every route above has been called by now."""
    call(server, "GET", "/v1/responses/resp_x2")
    status, text = server.http("GET", "/metrics")
    assert status == 200
    for method, handler in [
        ("GET", "/v1/responses/{response_id}"),
        ("POST", "/v1/responses/{response_id}/cancel"),
        ("POST", "/invocations"),
        ("POST", "/v1/chat/completions/batch"),
        ("POST", "/generative_scoring"),
        ("GET", "/kv_event_sources"),
        ("POST", "/v1/decisions"),
    ]:
        line = rf'http_requests_total\{{method="{method}",status="\dxx",handler="{re.escape(handler)}"\}} [1-9]'
        assert re.search(line, text.decode()), handler
