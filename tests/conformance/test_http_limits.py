"""HTTP below the OpenAI API, as the frontend serves it over raw sockets:
clients that are silent, slow or send oversized headers, bodies that do not
arrive in time, bytes that are not HTTP, unknown routes and methods, and
request bodies, query strings and headers with bad values. Each refusal is
in the OpenAI error shape and names what was wrong."""

from __future__ import annotations

import json
import select
import socket

import pytest

from tests.conformance.support import assert_error_shape, known_difference, port_of, raw_exchange, send

COMPLETION = {"prompt": "hey", "max_tokens": 3}


def parse_response(raw: bytes) -> tuple[int, dict]:
    """Status and JSON body of one raw HTTP response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends on `sock` until it closes the connection."""
    sock.settimeout(60)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


# ---- HTTP clients ----


def test_silent_and_slow_header_clients_are_dropped(open_stack):
    port = port_of(open_stack)
    assert raw_exchange(open_stack, b"") == b""  # silent: closed once the header deadline passes
    with socket.create_connection(("127.0.0.1", port)) as slow:
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        closed = False
        for i in range(400):  # would take 80 s in full
            readable, _, _ = select.select([slow], [], [], 0.2)
            if readable:
                closed = read_until_closed(slow) == b""
                break
            slow.sendall(b"X-Slow-%d: y\r\n" % i)
        assert closed, "the server kept a client that never finished its headers"
    assert send("GET", port, "/health")[0] == 200


#: Requests refused before any route sees them, and the status each gets.
UNREADABLE_HEADS = {
    "one large header": (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (100 * 1024) + b"\r\n\r\n", 431),
    "a long query": (b"GET /health?" + b"q" * (100 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n", 431),
    "many headers": (b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Many: y\r\n" * 20000 + b"\r\n", 431),
    "not HTTP": (b"NOT HTTP AT ALL\r\n\r\n", 400),
}


def test_oversized_or_unreadable_heads_are_refused_and_a_large_allowed_one_is_served(open_stack):
    for name, (head, status) in UNREADABLE_HEADS.items():
        answer = raw_exchange(open_stack, head)
        assert answer.startswith(b"HTTP/1.1 %d " % status), (name, answer[:200])
    assert send("GET", port_of(open_stack), "/health", headers={"x-big": "a" * (60 * 1024)})[0] == 200


def test_refused_heads_are_answered_in_the_error_shape(request, open_stack):
    known_difference(request, "hyper answers a head it cannot read itself, with an empty body")
    for head, status in UNREADABLE_HEADS.values():
        assert_error_shape(*parse_response(raw_exchange(open_stack, head)), status)


def test_a_body_that_does_not_arrive_in_time_gets_408(open_stack):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    assert_error_shape(*parse_response(raw_exchange(open_stack, head + b'{"prompt"')), 408)
    # A route that never reads its body answers, then the connection closes.
    unread = raw_exchange(open_stack, b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab")
    assert unread.startswith(b"HTTP/1.1 200"), unread
    assert send("GET", port_of(open_stack), "/health")[0] == 200


def test_an_upgrade_request_is_served_as_plain_http(open_stack):
    headers = {"connection": "Upgrade", "upgrade": "h2c"}
    assert send("GET", port_of(open_stack), "/health", headers=headers)[0] == 200


def test_unknown_routes_and_methods_answer_in_the_error_shape(open_stack):
    port = port_of(open_stack)
    assert_error_shape(*send("GET", port, "/nope"), 404)
    assert_error_shape(*send("GET", port, "/v1/completions"), 405)


# ---- request bodies, query strings and headers ----


def body_with(raw: bytes) -> bytes:
    return b'{"prompt": "hi", ' + raw + b"}"


BAD_BODIES = [
    ("/v1/completions", b"[" * 100_000 + b"]" * 100_000, None),
    ("/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),
    ("/v1/completions", body_with(b'"seed": ' + b"9" * 5000), "seed"),
    ("/v1/completions", body_with(b'"seed": %d' % 2**64), "seed"),
    ("/v1/completions", body_with(b'"seed": %d' % -(2**63 + 1)), "seed"),
    ("/v1/completions", body_with(b'"top_k": %d' % 2**70), "top_k"),
    ("/v1/completions", body_with(b'"top_k": -2'), "top_k"),
    ("/v1/completions", body_with(b'"max_tokens": %d' % 2**40), "max_tokens"),
    ("/v1/completions", body_with(b'"min_tokens": %d' % 2**40), "min_tokens"),
    ("/v1/completions", body_with(b'"temperature": 1e400'), "temperature"),
    ("/v1/completions", body_with(b'"top_p": -1e400'), "top_p"),
    ("/v1/completions", body_with(b'"repetition_penalty": 1e400'), "repetition_penalty"),
    ("/v1/completions", body_with(b'"temperature": NaN'), None),
    ("/v1/completions", body_with(b'"presence_penalty": Infinity'), None),
    ("/v1/completions", body_with(b'"n": 0'), "n"),
    ("/v1/completions", body_with(b'"model": "\\ud800"'), None),
    ("/v1/completions", b'{"prompt": [%d]}' % 2**40, "prompt"),
    ("/v1/completions", b'{"prompt": [' + b"9" * 5000 + b"]}", "prompt"),
    ("/v1/completions", body_with(b'"stop": ' + json.dumps(["x"] * 1025).encode()), "stop"),
    ("/v1/completions", body_with(b'"stop": ["' + b"a" * 40_000 + b'"]'), "stop"),
    ("/v1/completions", body_with(b'"stop_token_ids": ' + json.dumps([1] * 1025).encode()), "stop_token_ids"),
    (
        "/v1/completions",
        body_with(b'"logit_bias": ' + json.dumps({str(i): 1 for i in range(1025)}).encode()),
        "logit_bias",
    ),
    ("/v1/completions", body_with(b'"logit_bias": {"abc": 1}'), "logit_bias"),
    ("/v1/completions", body_with(b'"logit_bias": {"1": 1e400}'), "logit_bias"),
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user"}], "max_completion_tokens": %d}' % 2**40,
        "max_completion_tokens",
    ),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', "messages"),
    ("/v1/completions", b"{", None),
]


#: BAD_BODIES cases with a number beyond what a 64-bit float holds: the Rust
#: frontend's JSON reader refuses the whole body (param null) instead of
#: naming the field.
NUMBERS_BEYOND_F64 = {2, 9, 10, 11, 17, 23}


@pytest.mark.parametrize("case", range(len(BAD_BODIES)))
def test_bad_request_bodies_are_4xx_naming_the_parameter(request, open_stack, case):
    path, body, param = BAD_BODIES[case]
    if case in NUMBERS_BEYOND_F64:
        known_difference(request, "serde_json refuses a number beyond f64 as invalid JSON")
    status, answer = send("POST", port_of(open_stack), path, body, timeout_s=30)
    assert_error_shape(status, answer, 400, param)


@pytest.mark.parametrize(
    "method, path, headers, param",
    [
        ("POST", "/sleep?level=abc", {}, "level"),
        ("POST", "/sleep?level=%C2%B2", {}, "level"),
        ("POST", "/sleep?level=" + "9" * 5000, {}, "level"),
        ("POST", "/v1/completions", {"x-data-parallel-rank": "²"}, "x-data-parallel-rank"),
        ("POST", "/v1/completions", {"x-data-parallel-rank": "9" * 5000}, "x-data-parallel-rank"),
        ("POST", "/v1/completions", {"x-data-parallel-rank": "7"}, "x-data-parallel-rank"),
    ],
)
def test_bad_query_and_header_values_are_4xx_naming_the_parameter(open_stack, method, path, headers, param):
    encoded = {name: value.encode().decode("latin-1") for name, value in headers.items()}
    status, answer = send(method, port_of(open_stack), path, COMPLETION, headers=encoded, timeout_s=30)
    assert_error_shape(status, answer, 400, param)
