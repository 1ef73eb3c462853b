"""Property tests (hypothesis, bounded to run in seconds) of the HTTP surface
of the frontend: any JSON body sent to the completion routes is answered
200 or with a 4xx in the OpenAI error shape, never a 5xx; any bytes on the
HTTP socket get no 5xx and leave the server serving."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conformance.support import assert_error_shape, port_of, send, serving
from tests.test_serve import Serve

# ---- request parsing over HTTP ----

PARAMETERS = [
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "seed", "stop", "stop_token_ids", "logit_bias", "n", "best_of", "stream", "stream_options", "ignore_eos",
    "min_tokens", "echo", "suffix", "logprobs", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "tools", "response_format", "add_generation_prompt", "tool_choice", "structured_outputs", "parallel_tool_calls",
]  # fmt: skip
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=10,
)
near_valid_values = st.one_of(
    json_values,
    st.sampled_from(["echo", "hey", 1, 0, -1, 2**31, 2**63, 0.5, 1.0, True, [104, 105], {"include_usage": True}]),
    st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=8)}), max_size=2
    ),
)
bodies = st.one_of(
    json_values,
    st.dictionaries(st.sampled_from(PARAMETERS), near_valid_values, max_size=8),
    st.fixed_dictionaries({"prompt": st.text(max_size=8)}, optional={p: near_valid_values for p in PARAMETERS[3:]}),
)


@pytest.fixture(scope="module")
def echo_server() -> Iterator[Serve]:
    """echo on 1 engine with `--max-model-len 32` (so that lengths are refused too)."""
    with serving("--max-model-len", "32") as serve:
        yield serve


@settings(max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), bodies)
def test_any_json_body_is_answered_or_refused_in_the_error_shape(echo_server, path, body):
    status, answer = send("POST", port_of(echo_server), path, json.dumps(body).encode(), timeout_s=30)
    if status != 200:
        assert_error_shape(status, answer)


# ---- raw HTTP bytes ----

request_lines = st.sampled_from(
    [b"GET /health HTTP/1.1\r\n", b"POST /v1/completions HTTP/1.1\r\n", b"GET / HTTP/1.0\r\n", b""]
)
request_tails = st.sampled_from([b"", b"\r\n", b"\r\n\r\n", b"\r\nContent-Length: 5\r\n\r\nab"])
raw_requests = st.binary(max_size=200) | st.builds(
    lambda line, junk, tail: line + junk + tail, request_lines, st.binary(max_size=120), request_tails
)


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_requests)
def test_any_bytes_on_the_http_socket_get_no_5xx(echo_server, data):
    with socket.create_connection(("127.0.0.1", port_of(echo_server)), timeout=30) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    statuses = [int(line.split(b" ")[1]) for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.")]
    assert all(status < 500 for status in statuses), answer
    assert send("GET", port_of(echo_server), "/health")[0] == 200
