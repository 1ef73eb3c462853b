"""The Python API server under hostile or broken peers, over real sockets:
engines that send malformed, oversized or forged messages, an engine that
stops (SIGSTOP) or whose identity is claimed by a second connection, HTTP
clients that are silent, slow or send oversized headers, too many
connections, and request bodies with out-of-range values. Each answer is
checked for the OpenAI error shape and for naming what was wrong."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import time

import msgpack
import psutil
import zmq
from zmq.utils.monitor import recv_monitor_message

from tests.api_server_harness import (
    DEADLINE_S,
    FINISH_LENGTH,
    ScriptedEngine,
    api_server,
    assert_error_shape,
    in_background,
    request,
)

COMPLETION = {"prompt": "hey", "max_tokens": 3}


def wait_for_event(monitor: zmq.Socket, event: int) -> None:
    """Returns once the socket monitor reports `event`."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0 and monitor.poll(remaining * 1000), f"monitor event {event} never came"
        if recv_monitor_message(monitor)["event"] == event:
            return


def read_stream(port: int, body: dict) -> list[str]:
    """The `data:` payloads of a streamed completion, in order."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE_S)
    try:
        connection.request(
            "POST", "/v1/completions", body=json.dumps(body), headers={"content-type": "application/json"}
        )
        response = connection.getresponse()
        assert response.status == 200
        text = response.read().decode()
    finally:
        connection.close()
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def wait_for_health(port: int, status: int) -> None:
    """Returns once `/health` answers `status`."""
    deadline = time.monotonic() + DEADLINE_S
    while request("GET", port, "/health")[0] != status:
        assert time.monotonic() < deadline, f"/health never answered {status}"
        time.sleep(0.05)


# ---- engine messages ----


def test_malformed_engine_messages_fail_only_the_requests_they_name():
    with api_server() as server:
        engine = ScriptedEngine(server)
        try:
            server.wait_until_serving()
            for junk in (b"\xc1", msgpack.packb("text"), msgpack.packb([0, []]), msgpack.packb([0, [["x", "tokens"]]]),
                         msgpack.packb([0, [], None, 0.0, [1, None, None], None, 3])):  # fmt: skip
                engine.push.send(junk)
            named = in_background(request, "POST", server.port, "/v1/completions", COMPLETION)
            named_id, _, _ = engine.next_add()
            other = in_background(request, "POST", server.port, "/v1/completions", COMPLETION)
            other_id, _, _ = engine.next_add()
            engine.push.send(msgpack.packb([0, [[named_id, [1.5]]], None, 0.0]))
            status, body = named.result(DEADLINE_S)
            assert_error_shape(status, body, 500)
            assert "malformed output" in body["error"]["message"], body
            engine.send_outputs([[other_id, [104, 105, 33], None, None, None, FINISH_LENGTH, None]])
            status, body = other.result(DEADLINE_S)
            assert status == 200 and body["choices"][0]["text"] == "hi!", body
            assert request("GET", server.port, "/health")[0] == 200
            assert request("GET", server.port, "/load")[1] == {"server_load": 0}
        finally:
            engine.close()


def test_shutting_down_with_requests_on_a_gone_engine_exits_0():
    with api_server() as server:
        engine = ScriptedEngine(server)
        server.wait_until_serving()
        waiting = [in_background(request, "POST", server.port, "/v1/completions", COMPLETION) for _ in range(3)]
        for _ in waiting:
            engine.next_add()
        engine.close()  # the engine's connection ends without a word
        server.manager.processes[0].terminate()
        server.manager.processes[0].join(DEADLINE_S)
        assert server.manager.processes[0].exitcode == 0
        for future in waiting:
            status, body = future.result(DEADLINE_S)
            # 503 "shutting down" for the first; a refused ABORT then fails the rest with 500.
            assert status in (500, 503), (status, body)
            assert_error_shape(status, body, status)


def test_engine_core_dead_still_fails_everything():
    with api_server() as server:
        engine = ScriptedEngine(server)
        try:
            server.wait_until_serving()
            waiting = in_background(request, "POST", server.port, "/v1/completions", COMPLETION)
            engine.next_add()
            engine.push.send(b"ENGINE_CORE_DEAD")
            status, body = waiting.result(DEADLINE_S)
            assert_error_shape(status, body, 500)
            status, body = request("GET", server.port, "/health")
            assert_error_shape(status, body, 503)
            assert "ENGINE_CORE_DEAD" in body["error"]["message"]
            assert_error_shape(*request("POST", server.port, "/v1/completions", COMPLETION), 503)
        finally:
            engine.close()


def test_an_engine_message_past_the_size_limit_drops_that_connection_unread():
    limit = 1024 * 1024
    with api_server(env={"VLLM_RS_MAX_ENGINE_MESSAGE_BYTES": str(limit)}) as server:
        engine = ScriptedEngine(server)
        ctx = zmq.Context()
        big_push = ctx.socket(zmq.PUSH)
        big_push.setsockopt(zmq.LINGER, 0)
        monitor = big_push.get_monitor_socket()
        try:
            server.wait_until_serving()
            waiting = in_background(request, "POST", server.port, "/v1/completions", COMPLETION)
            request_id, _, _ = engine.next_add()
            big_push.connect(server.output_address)
            wait_for_event(monitor, zmq.EVENT_HANDSHAKE_SUCCEEDED)
            rss_before = psutil.Process(server.pid).memory_info().rss
            # A well-formed answer that would finish the request, padded to 64 MiB.
            forged = [
                0,
                [[request_id, [120, 120, 120], None, None, None, FINISH_LENGTH, "x" * (64 * limit)]],
                None,
                0.0,
            ]
            big_push.send(msgpack.packb(forged))
            wait_for_event(monitor, zmq.EVENT_DISCONNECTED)
            engine.send_outputs([[request_id, [104, 101, 121], None, None, None, FINISH_LENGTH, None]])
            status, body = waiting.result(DEADLINE_S)
            assert status == 200 and body["choices"][0]["text"] == "hey", body
            grown = psutil.Process(server.pid).memory_info().rss - rss_before
            assert grown < 32 * limit, f"the server grew by {grown} bytes"
        finally:
            monitor.close(linger=0)
            big_push.close(linger=0)
            ctx.term()
            engine.close()


def test_engine_outputs_never_exceed_max_tokens_and_unknown_ids_are_dropped():
    with api_server() as server:
        engine = ScriptedEngine(server)
        try:
            server.wait_until_serving()
            waiting = in_background(
                request, "POST", server.port, "/v1/completions", {"prompt": "hey", "max_tokens": 16}
            )
            request_id, _, sampling = engine.next_add()
            assert sampling["max_tokens"] == 16
            engine.send_outputs([["someone-else", [98, 98]], [request_id, [97] * 57]])
            status, body = waiting.result(DEADLINE_S)
            assert status == 200, body
            assert body["choices"][0]["text"] == "a" * 16 and body["choices"][0]["finish_reason"] == "length"
            assert body["usage"]["completion_tokens"] == 16
            engine.wait_for_abort(request_id)  # the engine is told to stop generating
            streamed = in_background(read_stream, server.port, {"prompt": "hey", "max_tokens": 4, "stream": True})
            request_id, _, _ = engine.next_add()
            engine.send_outputs([[request_id, [97, 97, 97]]])
            engine.send_outputs([[request_id, [97, 97, 97], None, None, None, FINISH_LENGTH, None]])
            events = streamed.result(DEADLINE_S)
            chunks = [json.loads(e) for e in events[:-1]]
            assert events[-1] == "[DONE]" and "".join(c["choices"][0]["text"] for c in chunks) == "aaaa"
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
            assert request("GET", server.port, "/load")[1] == {"server_load": 0}
        finally:
            engine.close()


def test_a_stopped_engine_is_marked_hung_then_recovers_when_it_answers():
    # Long enough for both requests to be in flight before the engine is marked hung.
    with api_server(echo_engines=1, env={"VLLM_RS_ENGINE_STALL_TIMEOUT_S": "3"}) as server:
        server.wait_until_serving()
        wait_for_health(server.port, 200)
        assert request("POST", server.port, "/v1/completions", COMPLETION)[0] == 200
        engine_pid = server.engines.processes[0].pid
        os.kill(engine_pid, signal.SIGSTOP)
        try:
            streamed = in_background(read_stream, server.port, {**COMPLETION, "stream": True})
            status, body = request("POST", server.port, "/v1/completions", COMPLETION)
            assert_error_shape(status, body, 503)
            assert "engine 0 is not responding" in body["error"]["message"], body
            events = streamed.result(DEADLINE_S)
            assert events[-1] == "[DONE]"
            assert_error_shape(503, json.loads(events[-2]), 503)
            status, body = request("GET", server.port, "/health")
            assert_error_shape(status, body, 503)
            # While it is hung, new requests are refused at once instead of waiting.
            assert_error_shape(*request("POST", server.port, "/v1/completions", COMPLETION), 503)
        finally:
            os.kill(engine_pid, signal.SIGCONT)
        wait_for_health(server.port, 200)
        status, body = request("POST", server.port, "/v1/completions", COMPLETION)
        assert status == 200 and body["choices"][0]["text"] == "hey", body


def test_a_second_connection_claiming_an_engine_identity_cannot_take_it_over():
    # A request sent while the killed engine's connection is still closing is
    # lost with it; the stall timeout ends it.
    with api_server(echo_engines=1, env={"VLLM_RS_ENGINE_STALL_TIMEOUT_S": "2"}) as server:
        server.wait_until_serving()
        wait_for_health(server.port, 200)
        ctx = zmq.Context()
        impostor = ctx.socket(zmq.DEALER)
        impostor.setsockopt(zmq.IDENTITY, (0).to_bytes(2, "little"))
        impostor.setsockopt(zmq.LINGER, 0)
        monitor = impostor.get_monitor_socket()
        try:
            impostor.connect(server.input_address)
            wait_for_event(monitor, zmq.EVENT_HANDSHAKE_SUCCEEDED)
            impostor.send(msgpack.packb({"max_model_len": 4, "num_gpu_blocks": 1, "dp_stats_address": None}))
            for _ in range(3):
                status, body = request("POST", server.port, "/v1/completions", COMPLETION, timeout_s=10)
                assert status == 200 and body["choices"][0]["text"] == "hey", body
            assert not impostor.poll(200), "a request was routed to the impostor"
        finally:
            monitor.close(linger=0)
            impostor.close(linger=0)
            ctx.term()
        # The impostor's connection ending fails nothing.
        assert request("GET", server.port, "/health")[0] == 200
        assert request("POST", server.port, "/v1/completions", COMPLETION)[0] == 200
        # The engine's own connection ending does.
        server.engines.processes[0].kill()
        server.engines.processes[0].join(DEADLINE_S)
        deadline = time.monotonic() + DEADLINE_S
        while (answer := request("POST", server.port, "/v1/completions", COMPLETION))[0] == 200:
            assert time.monotonic() < deadline, "requests still succeed after the engine died"
            time.sleep(0.05)
        status, body = answer
        assert_error_shape(status, body, status)
        message = body["error"]["message"]
        gone = status == 500 and "cannot send to engine 0" in message
        hung = status == 503 and "engine 0 is not responding" in message
        assert gone or hung, answer


# ---- HTTP clients ----


def test_the_connection_limit_keeps_fds_bounded_and_serves_new_clients():
    env = {"VLLM_RS_HTTP_MAX_CONNECTIONS": "16", "VLLM_RS_HTTP_HEADER_TIMEOUT_S": "120"}
    with api_server(env=env) as server:
        engine = ScriptedEngine(server)
        silent = []
        try:
            server.wait_until_serving()
            baseline = psutil.Process(server.pid).num_fds()
            silent = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(300)]
            # Accepted in order: once this answer came, every silent one was accepted.
            assert request("GET", server.port, "/health")[0] == 200
            fds = psutil.Process(server.pid).num_fds()
            assert fds <= baseline + 16 + 4, f"{fds - baseline} more fds with 300 silent connections and a limit of 16"
            answers = [request("GET", server.port, "/health")[0] for _ in range(50)]
            assert answers == [200] * 50
        finally:
            for sock in silent:
                sock.close()
            engine.close()
