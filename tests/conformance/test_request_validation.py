"""The frontend (`vllm-rs frontend`) against vLLM 0.33's request rules and its engine error outputs, over real HTTP
with the engine played by the test on real ZeroMQ sockets:

- every case of tests/fixtures/vllm-0.33/request_validation.json (written by
  scripts/make_vllm_fixtures.py from what vLLM's request models and
  SamplingParams accept or refuse): a refused request is a 400 naming the
  parameter, with vLLM's message, and the engine never receives it; an
  accepted one reaches the engine and is answered;
- the engine finishing a request with ERROR and vLLM's RequestError (the
  fixtures' own messages): 400 for a validation error, 503 for a retryable
  one, 500 for any other, with the engine's message, streamed and not."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from tests.support import frontend_stack
from tests.support.engine_peer import ScriptedEngine
from tests.support.frontend_stack import engine_listeners
from tests.support.http import assert_error_shape, in_background, request
from tests.support.wait import DEADLINE_S, wait_until

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm-0.33"
CASES = json.loads((FIXTURES / "request_validation.json").read_text())
FINISH_LENGTH, FINISH_ERROR = 1, 3
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
PREFIXES = {"completions": "cmpl", "chat": "chatcmpl"}
#: Cases the project once refused (marked `project_limit` in the fixture)
#: that the frontend now serves as vLLM does.
NOW_SERVED = {"n_2", "completion_logprobs", "chat_logprobs", "echo", "truncate_prompt_tokens"}


@contextlib.contextmanager
def rust_frontend(log_path: Path) -> Iterator[SimpleNamespace]:
    """The `vllm-rs frontend` binary for the built-in `toy` model, its engine
    left to the test (the frontend's stderr goes to `log_path`)."""
    os.environ.setdefault("VLLM_ENGINE_READY_TIMEOUT_S", "60")
    listeners = engine_listeners()
    with frontend_stack.rust_frontend(argparse.Namespace(model="toy"), listeners, log_path=log_path) as frontend:
        yield SimpleNamespace(
            port=frontend.port, input_address=listeners.input.address, output_address=listeners.output.address
        )


def healthy(port: int) -> bool:
    """Whether `/health` answers 200 (the engine registered)."""
    try:
        return request("GET", port, "/health", timeout_s=5)[0] == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """The frontend with a scripted engine that registered: `port` and `engine`."""
    with rust_frontend(tmp_path_factory.mktemp("rust") / "frontend.log") as server:
        engine = ScriptedEngine(server, max_model_len=CASES["max_model_len"])
        try:
            wait_until(lambda: healthy(server.port), "the frontend to become healthy")
            yield SimpleNamespace(port=server.port, engine=engine)
        finally:
            engine.close()


def post(served: SimpleNamespace, endpoint: str, body: Any, request_id: str) -> tuple[int, Any]:
    return request("POST", served.port, PATHS[endpoint], body, headers={"x-request-id": request_id})


def answer_next_add(served: SimpleNamespace, expected_id: str) -> tuple[str, dict[str, Any]]:
    """Waits for the next ADD, which must be `expected_id`'s, and finishes it
    with one token. Returns the engine request id and the sampling params."""
    request_id, _prompt, sampling = served.engine.next_add()
    assert request_id.startswith(expected_id + "-"), f"expected {expected_id}, the engine got {request_id}"
    served.engine.send_outputs([[request_id, [65], None, None, None, FINISH_LENGTH]])
    return request_id, sampling


@pytest.mark.parametrize("case", CASES["cases"], ids=[c["name"] for c in CASES["cases"]])
def test_requests_are_checked_as_vllm_checks_them(served, case):
    endpoint, verdict = case["endpoint"], case["vllm"]
    client_id = f"case-{case['name']}"
    limited = case["project_limit"] and case["name"] not in NOW_SERVED
    if verdict["accepted"] and not limited:
        answered = in_background(post, served, endpoint, case["body"], client_id)
        n = case["body"].get("n", 1)
        for index in range(n):
            # n > 1: child requests `{index}_{request id}`, as vLLM's.
            child = f"{index}_" if n > 1 else ""
            _id, sampling = answer_next_add(served, f"{child}{PREFIXES[endpoint]}-{client_id}")
        status, body = answered.result(timeout=DEADLINE_S)
        assert status == 200, body
        if case["body"].get("seed") == -1:
            assert sampling.get("seed") is None, "vLLM reads seed -1 as no seed"
        return
    status, body = post(served, endpoint, case["body"], client_id)
    assert_error_shape(status, body, 400, case["param"])
    if verdict.get("kind") == "validation" and not limited:
        assert body["error"]["message"] == verdict["message"]
    # Nothing reached the engine: the next request it sees is the next one sent.
    sentinel = f"after-{client_id}"
    answered = in_background(post, served, "completions", {"prompt": "ok", "max_tokens": 1}, sentinel)
    answer_next_add(served, f"cmpl-{sentinel}")
    assert answered.result(timeout=DEADLINE_S)[0] == 200


def fixture_output(name: str, request_id: str) -> bytes:
    """The vLLM-encoded outputs fixture `name`, its one output renamed to `request_id`."""
    message = msgpack.unpackb((FIXTURES / f"{name}.msgpack").read_bytes(), raw=False, strict_map_key=False)
    message[1][0][0] = request_id
    message[5] = [request_id]
    return msgpack.packb(message)


def fixture_error(name: str) -> dict[str, Any]:
    message = msgpack.unpackb((FIXTURES / f"{name}.msgpack").read_bytes(), raw=False, strict_map_key=False)
    return message[1][0][18]


@pytest.mark.parametrize(
    "fixture, status, error_type",
    [
        ("outputs_request_error", 400, "BadRequestError"),
        ("outputs_request_error_sampling", 400, "BadRequestError"),
        ("outputs_request_error_paused", 503, "ServiceUnavailableError"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_engine_request_errors_map_as_vllm_maps_them(served, fixture, status, error_type, stream):
    client_id = f"{fixture}-{stream}"
    body = {"prompt": "hi", "max_tokens": 3, "stream": stream}
    answered = in_background(post, served, "completions", body, client_id)
    request_id, _prompt, _sampling = served.engine.next_add()
    assert request_id.startswith(f"cmpl-{client_id}-")
    served.engine.push.send(fixture_output(fixture, request_id))
    got_status, answer = answered.result(timeout=DEADLINE_S)
    expected = {"message": fixture_error(fixture)["message"], "type": error_type, "param": None, "code": status}
    if not stream:
        assert (got_status, answer) == (status, {"error": expected})
        return
    # Streamed: the response started, so the error is the last event before [DONE].
    assert got_status == 200
    events = [line[len("data: ") :] for line in answer.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2]) == {"error": expected}


def test_an_error_the_engine_does_not_call_retryable_or_validation_is_a_500_with_its_message(served):
    client_id = "internal"
    answered = in_background(post, served, "chat", {"messages": [{"role": "user", "content": "x"}]}, client_id)
    request_id, _prompt, _sampling = served.engine.next_add()
    error = {"code": "kv_load_failed", "message": "KV transfer failed", "retryable": False}
    served.engine.push.send(
        msgpack.packb([0, [[request_id, [], None, None, None, FINISH_ERROR, *[None] * 12, error]], None, 1.0])
    )
    status, answer = answered.result(timeout=DEADLINE_S)
    assert (status, answer["error"]["message"], answer["error"]["type"]) == (
        500, "KV transfer failed", "InternalServerError",
    )  # fmt: skip
