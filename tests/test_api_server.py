"""The Python API server's own parts: stop strings, streaming UTF-8
decoding, parameter validation, and its start-up against real processes and
sockets (registration timeout naming the missing engines, a signal while
waiting for engines)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_rs.api_server.errors import ApiError
from vllm_rs.api_server.openai_routes import parse_chat, parse_completion
from vllm_rs.api_server.params import parse_json_object
from vllm_rs.api_server.stop_strings import StopStrings
from vllm_rs.api_server.tokenizer import ByteLevelTokenizer, ChatMessage, DecodeOptions
from vllm_rs.engine import make_engine_config, run_engine_core
from vllm_rs.engine.config import ClientAddresses
from vllm_rs.network_utils import make_zmq_listener
from vllm_rs.utils import APIServerProcessManager, CoreEngineProcManager


def test_stop_strings_hold_back_possible_starts():
    s = StopStrings(["STOP"])
    assert s.push("hello ST") == ("hello ", None)
    assert s.push("O") == ("", None)
    assert s.push("P!") == ("", "STOP")
    s = StopStrings(["STOP"])
    assert s.push("ST") == ("", None)
    assert s.push("AR") == ("STAR", None)
    assert s.push("S") == ("", None) and s.flush() == "S"
    assert StopStrings(["world", "lo"]).push("hello world") == ("hel", "lo")
    assert StopStrings([]).push("abc") == ("abc", None)


class NaiveStopStrings:
    """The obvious quadratic matcher, the reference StopStrings must agree with."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def push(self, text):
        if not self.stops:
            return text, None
        self.pending += text
        first = None
        for stop in self.stops:
            at = self.pending.find(stop)
            if at >= 0 and (first is None or at < first[0]):
                first = (at, stop)
        if first is not None:
            emit, self.pending = self.pending[: first[0]], ""
            return emit, first[1]
        held = max(
            (n for stop in self.stops for n in range(1, len(stop)) if self.pending.endswith(stop[:n])), default=0
        )
        cut = len(self.pending) - held
        emit, self.pending = self.pending[:cut], self.pending[cut:]
        return emit, None


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.text("abc", max_size=5), max_size=5), st.lists(st.text("abc", max_size=4), max_size=8))
def test_stop_strings_agree_with_the_naive_matcher(stops, pieces):
    fast, naive = StopStrings(stops), NaiveStopStrings(stops)
    for piece in pieces:
        got = fast.push(piece)
        assert got == naive.push(piece), (stops, pieces)
        if got[1] is not None:
            return
    assert fast.flush() == naive.pending


def test_byte_decoder_never_splits_a_character():
    tokenizer = ByteLevelTokenizer()
    decoder = tokenizer.decoder([], DecodeOptions())
    pieces = [decoder.push([t]) for t in tokenizer.encode("añ€😀")]
    assert "".join(pieces) == "añ€😀" and sum(1 for p in pieces if p) == 4
    decoder = tokenizer.decoder([], DecodeOptions())
    assert decoder.push([0x61, 0xFF, 0x62, tokenizer.eos_token_id, 0xE2, 0x82]) == "a\ufffdb"
    assert decoder.flush() == "\ufffd"
    assert tokenizer.apply_chat_template([ChatMessage("user", "hi")], True) == "user: hi\nassistant: "


@pytest.mark.parametrize(
    "body, param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"n": 0}, "n"),
        ({"stop": 3}, "stop"),
        ({"stop": ["a"] * 5}, "stop"),
        ({"stop_token_ids": [1] * 1025}, "stop_token_ids"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": "yes"}, "stream"),
        ({"seed": 1.5}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"messages": [{"content": "no role"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"reasoning_effort": 2}, "reasoning_effort"),
    ],
)
def test_invalid_parameters_name_the_parameter(body, param):
    with pytest.raises(ApiError) as error:
        parse_chat({"messages": [{"role": "user", "content": "hi"}], **body})
    assert (error.value.status, error.value.param) == (400, param)


def test_parameters_are_read():
    c, messages, add_generation_prompt, effort = parse_chat(
        {
            "model": "toy",
            "reasoning_effort": "xhigh",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "max_tokens": 5,
            "max_completion_tokens": 9,
            "temperature": 0,
            "top_k": 3,
            "seed": -1,
            "stop": "x",
            "stop_token_ids": [1, 2],
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "unknown": {"ignored": True},
        }
    )  # fmt: skip
    assert (c.model, c.max_tokens, c.max_tokens_param, c.stop, c.stop_token_ids, c.ignore_eos) == (
        "toy", 9, "max_completion_tokens", ["x"], [1, 2], True,
    )  # fmt: skip
    assert c.sampling == {"temperature": 0.0, "top_k": 3} and c.stream and c.include_usage
    assert messages == [ChatMessage("user", "ab")] and add_generation_prompt and effort == "xhigh"
    common, prompt, echo, _ = parse_completion({"prompt": [[5, 6]], "min_tokens": 1})
    assert (prompt, common.max_tokens, common.sampling, echo) == ([5, 6], None, {"min_tokens": 1}, False)
    with pytest.raises(ApiError, match="must be a JSON object"):
        parse_json_object(b"[1]")
    with pytest.raises(ApiError, match="not valid JSON"):
        parse_json_object(b"{")


# ---- start-up of a real API server process ----


def start_api_server(engines: int, with_engines: bool = False):
    """One API server process for `engines` echo engines, started too when
    `with_engines` (output goes to the test's captured fds). Returns the API
    server manager, the engine manager or None, and the HTTP port."""
    http = socket.socket()
    http.bind(("127.0.0.1", 0))
    http.listen()
    listeners = make_zmq_listener("tcp://127.0.0.1:0", zmq.ROUTER), make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL)
    engine_manager = None
    if with_engines:
        config = make_engine_config("echo", clients=[ClientAddresses(listeners[0].address, listeners[1].address)])
        engine_manager = CoreEngineProcManager(
            run_engine_core, engines, 0, 0, config, True, listeners[0].address, None, True
        )
    args = argparse.Namespace(model="echo", data_parallel_size=engines, api_key=None, max_model_len=None)
    manager = APIServerProcessManager("http://127.0.0.1", http, args, 1, [listeners[0]], [listeners[1]])
    port = http.getsockname()[1]
    http.close()
    return manager, engine_manager, port


def post_completion(port: int, timeout_s: float = 30) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=b'{"prompt": "hey", "max_tokens": 3}',
        headers={"content-type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class CapturedOutput:
    """Everything the children printed so far (they share the test's fds)."""

    def __init__(self, capfd):
        self.capfd = capfd
        self.text = ""

    def read(self) -> str:
        captured = self.capfd.readouterr()
        self.text += captured.out + captured.err
        return self.text

    def wait_for(self, needle: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while needle not in self.read():
            assert time.monotonic() < deadline, f"{needle!r} never appeared in:\n{self.text}"
            time.sleep(0.05)


def test_registration_timeout_names_the_missing_engines(capfd, monkeypatch):
    monkeypatch.setenv("VLLM_ENGINE_READY_TIMEOUT_S", "1")
    manager, _, _ = start_api_server(engines=2)
    try:
        manager.processes[0].join(60)
        assert manager.processes[0].exitcode == 1
        CapturedOutput(capfd).wait_for("missing engine(s): 0, 1")
    finally:
        manager.shutdown(timeout=5)


@pytest.mark.parametrize(
    "name, value", [("VLLM_RS_ENGINE_STALL_TIMEOUT_S", "inf"), ("VLLM_RS_HTTP_BODY_TIMEOUT_S", "-1"),
                    ("VLLM_RS_MAX_ENGINE_MESSAGE_BYTES", "1e6"), ("VLLM_RS_HTTP_MAX_CONNECTIONS", "0")],
)  # fmt: skip
def test_a_bad_limit_variable_exits_1_naming_it(capfd, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    manager, _, _ = start_api_server(engines=1)
    try:
        manager.processes[0].join(60)
        assert manager.processes[0].exitcode == 1
        CapturedOutput(capfd).wait_for(f"{name} must be")
    finally:
        manager.shutdown(timeout=5)


def test_a_signal_while_waiting_for_engines_exits_0(capfd):
    output = CapturedOutput(capfd)
    manager, _, _ = start_api_server(engines=1)
    try:
        output.wait_for("waiting for engines")
        os.kill(manager.processes[0].pid, signal.SIGTERM)
        manager.processes[0].join(30)
        assert manager.processes[0].exitcode == 0
        output.wait_for("stopped before every engine registered")
    finally:
        manager.shutdown(timeout=5)


def test_an_engine_gone_without_a_word_fails_requests_instead_of_hanging(capfd, monkeypatch):
    # A request sent before the connection's end reaches libzmq is lost with
    # it: the stall timeout ends that one.
    monkeypatch.setenv("VLLM_RS_ENGINE_STALL_TIMEOUT_S", "2")
    output = CapturedOutput(capfd)
    manager, engines, port = start_api_server(engines=1, with_engines=True)
    try:
        output.wait_for("serving the OpenAI API")
        status, body = post_completion(port)
        assert status == 200 and body["choices"][0]["text"] == "hey", body
        engines.processes[0].kill()  # no ENGINE_CORE_DEAD: nobody tells the server
        engines.processes[0].join(10)
        deadline = time.monotonic() + 60
        while status == 200:
            assert time.monotonic() < deadline, "requests still succeed after the engine died"
            status, body = post_completion(port)
        message = body["error"]["message"]
        gone = status == 500 and "cannot send to engine 0" in message
        hung = status == 503 and "engine 0 is not responding" in message
        assert gone or hung, body
    finally:
        manager.shutdown(timeout=5)
        engines.shutdown(timeout=5)
