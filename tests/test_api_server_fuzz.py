"""Property tests (hypothesis, bounded to run in seconds) for the two places
the Python API server reads untrusted input: the engine-output MessagePack
decoder (arbitrary bytes and mutated valid messages raise nothing but
EngineOutputError) and request parsing, driven over HTTP against a real
server and echo engine (any JSON body is answered 200 or with a 4xx in the
OpenAI error shape, never a 5xx; any bytes on the HTTP socket get no 5xx and
leave the server serving)."""

from __future__ import annotations

import json
import socket

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm_rs.api_server.engine_outputs import EngineOutputError, decode_engine_message
from vllm_rs.engine.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
    UtilityOutput,
    encode_outputs,
)

from tests.api_server_harness import api_server, assert_error_shape, request

QUICK = settings(max_examples=150, deadline=None, database=None)

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=12,
)

outputs = st.builds(
    EngineCoreOutput,
    request_id=st.text(min_size=1, max_size=8),
    new_token_ids=st.lists(st.integers(0, 2**32 - 1), max_size=4),
    finish_reason=st.none() | st.sampled_from(FinishReason),
    stop_reason=st.none() | st.integers(0, 300) | st.text(max_size=4),
)
batches = st.builds(
    EngineCoreOutputs,
    engine_index=st.integers(0, 3),
    outputs=st.lists(outputs, min_size=1, max_size=3),
    scheduler_stats=st.none()
    | st.fixed_dictionaries({"num_running_reqs": st.integers(0, 9), "num_waiting_reqs": st.integers(0, 9)}),
    timestamp=st.floats(1, 2e9),
)
utility_replies = st.builds(
    EngineCoreOutputs,
    engine_index=st.integers(0, 3),
    utility_output=st.builds(
        UtilityOutput, call_id=st.integers(0, 2**31), failure_message=st.none() | st.text(max_size=8)
    ),
    timestamp=st.floats(1, 2e9),
)
valid_messages = batches | utility_replies


def decodes_or_refuses(data: bytes) -> None:
    try:
        decode_engine_message([data])
    except EngineOutputError:
        pass


@QUICK
@given(st.binary(max_size=256))
def test_arbitrary_bytes_never_raise_anything_but_the_decoders_error(data):
    decodes_or_refuses(data)


@QUICK
@given(valid_messages)
def test_valid_messages_decode_to_what_was_sent(message):
    decoded = decode_engine_message([encode_outputs(message)])
    assert decoded.engine_index == message.engine_index
    sent = [(o.request_id, o.new_token_ids, o.finish_reason) for o in message.outputs]
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in decoded.outputs] == sent
    if message.utility_output is not None:
        assert decoded.utility_output.call_id == message.utility_output.call_id
        assert decoded.utility_output.failure_message == message.utility_output.failure_message


@QUICK
@given(valid_messages, st.data())
def test_byte_mutations_of_valid_messages_never_raise_anything_but_the_decoders_error(message, data):
    raw = bytearray(encode_outputs(message))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if action == "flip":
            raw[at] ^= data.draw(st.integers(1, 255))
        elif action == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif len(raw) > 1:
            del raw[at]
    decodes_or_refuses(bytes(raw))


def _replace_somewhere(value, replacement, path):
    """`value` with the node at `path` (indices into nested lists) replaced."""
    if not path or not isinstance(value, list) or not value:
        return replacement
    index = path[0] % len(value)
    return [*value[:index], _replace_somewhere(value[index], replacement, path[1:]), *value[index + 1 :]]


@QUICK
@given(valid_messages, msgpack_values, st.lists(st.integers(0, 10), max_size=4))
def test_structural_mutations_of_valid_messages_never_raise_anything_but_the_decoders_error(message, replacement, path):
    mutated = _replace_somewhere(message.to_wire(), replacement, path)
    decodes_or_refuses(msgpack.packb(mutated, use_bin_type=True))


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
def echo_server():
    with api_server(echo_engines=1, max_model_len=32) as server:
        server.wait_until_serving()
        yield server


@settings(max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), bodies)
def test_any_json_body_is_answered_or_refused_in_the_error_shape(echo_server, path, body):
    status, answer = request("POST", echo_server.port, path, json.dumps(body).encode(), timeout_s=30)
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
    with socket.create_connection(("127.0.0.1", echo_server.port), timeout=30) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    statuses = [int(line.split(b" ")[1]) for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.")]
    assert all(status < 500 for status in statuses), answer
    assert request("GET", echo_server.port, "/health")[0] == 200
