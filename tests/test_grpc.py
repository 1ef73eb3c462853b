"""vLLM's gRPC generate API (`vllm.grpc.engine.VllmEngine`) served by the Rust
frontend on `serve --grpc-port`, driven by a real `grpcio` client with stubs
generated from the project's own .proto files."""

from __future__ import annotations

import importlib
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from tests.test_serve import Serve, rust_frontend_available

grpc = pytest.importorskip("grpc")
grpc_tools = pytest.importorskip("grpc_tools")
from grpc_tools import protoc  # noqa: E402

PROTO_DIR = Path(__file__).resolve().parent.parent / "frontend-bin" / "grpc" / "proto"
MAX_MODEL_LEN = 8192

pytestmark = pytest.mark.skipif(not rust_frontend_available(), reason="vllm-rs binary not built")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    """vllm_engine_pb2 and its gRPC stub module, generated from our .proto files."""
    out = tmp_path_factory.mktemp("grpc_stubs")
    protos = [str(PROTO_DIR / "common.proto"), str(PROTO_DIR / "vllm_engine.proto")]
    grpc_include = str(Path(protoc.__file__).parent / "_proto")
    code = protoc.main(
        ["protoc", f"-I{PROTO_DIR}", f"-I{grpc_include}", f"--python_out={out}", f"--grpc_python_out={out}", *protos]
    )
    assert code == 0
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("vllm_engine_pb2"), importlib.import_module("vllm_engine_pb2_grpc")
    finally:
        sys.path.remove(str(out))


@pytest.fixture(scope="module")
def served():
    port = free_port()
    serve = Serve("--model", "echo", "--port", "0", "--grpc-port", str(port), "--host", "127.0.0.1",
                  "--max-model-len", str(MAX_MODEL_LEN), "--frontend", "rust")  # fmt: skip
    try:
        serve.wait_ready()
        yield serve, f"127.0.0.1:{port}"
        serve.interrupt()
        assert serve.wait(30) == 0, serve.output
    finally:
        serve.kill()


@pytest.fixture
def client(served, stubs):
    pb2, pb2_grpc = stubs
    with grpc.insecure_channel(served[1]) as channel:
        yield pb2, pb2_grpc.VllmEngineStub(channel)


def tokens_request(pb2, request_id, ids, stream=True, **params):
    return pb2.GenerateRequest(
        request_id=request_id,
        tokenized=pb2.TokenizedInput(input_ids=ids),
        sampling_params=pb2.SamplingParams(**params),
        stream=stream,
    )


def echo(prompt: list[int], count: int) -> list[int]:
    """What the echo model generates: the prompt repeated."""
    return [prompt[i % len(prompt)] for i in range(count)]


def test_streamed_generate(client):
    pb2, stub = client
    prompt = list(b"hello")
    responses = list(stub.Generate(tokens_request(pb2, "g-stream", prompt, max_tokens=12), timeout=60))
    chunks = [r.chunk for r in responses[:-1]]
    assert all(r.WhichOneof("response") == "chunk" for r in responses[:-1]) and chunks
    assert responses[-1].WhichOneof("response") == "complete"
    done = responses[-1].complete
    assert [t for c in chunks for t in c.token_ids] == echo(prompt, 12)
    assert chunks[-1].completion_tokens == 12 and chunks[0].prompt_tokens == 5
    assert (done.finish_reason, done.prompt_tokens, done.completion_tokens) == ("length", 5, 12)


def test_non_streamed_generate_with_text_and_stops(client):
    pb2, stub = client
    request = pb2.GenerateRequest(
        request_id="g-text", text="abcdef", sampling_params=pb2.SamplingParams(max_tokens=20), stream=False
    )
    (only,) = list(stub.Generate(request, timeout=60))
    assert only.WhichOneof("response") == "complete"
    assert only.complete.output_ids == echo(list(b"abcdef"), 20) and only.complete.finish_reason == "length"

    by_token = list(
        stub.Generate(
            tokens_request(pb2, "g-tok", list(b"abcdef"), False, max_tokens=20, stop_token_ids=[ord("d")]), timeout=60
        )
    )
    assert by_token[-1].complete.finish_reason == "stop"
    assert by_token[-1].complete.output_ids == list(b"abcd")
    assert by_token[-1].complete.matched_token_id == ord("d")

    by_text = list(
        stub.Generate(tokens_request(pb2, "g-str", list(b"abcdef"), False, max_tokens=20, stop=["cd"]), timeout=60)
    )
    assert by_text[-1].complete.finish_reason == "stop"
    assert by_text[-1].complete.matched_stop_str == "cd"


def test_health_model_and_server_info(client):
    pb2, stub = client
    health = stub.HealthCheck(pb2.HealthCheckRequest(), timeout=10)
    assert health.healthy
    info = stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=10)
    assert info.served_model_name == "echo" and info.is_generation and info.max_context_length == MAX_MODEL_LEN
    assert info.vocab_size > 255
    server = stub.GetServerInfo(pb2.GetServerInfoRequest(), timeout=10)
    assert server.server_type == "vllm-grpc"


def test_standard_health_service_and_reflection(served):
    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_health.v1 import health_pb2_grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(served[1]) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "vllm.grpc.engine.VllmEngine"):
            status = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status
            assert status == health_pb2.HealthCheckResponse.SERVING, name
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        # What grpcurl and vLLM's own tooling read: the services and their schemas.
        database = ProtoReflectionDescriptorDatabase(channel)
        assert {"vllm.grpc.engine.VllmEngine", "grpc.health.v1.Health"} <= set(database.get_services())
        service = DescriptorPool(database).FindServiceByName("vllm.grpc.engine.VllmEngine")
        assert service.FindMethodByName("Generate").input_type.full_name == "vllm.grpc.engine.GenerateRequest"


def test_health_watch_turns_not_serving_when_the_engine_dies():
    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    from grpc_health.v1 import health_pb2_grpc

    port = free_port()
    serve = Serve(
        "--model", "echo", "--port", "0", "--grpc-port", str(port), "--host", "127.0.0.1", "--frontend", "rust"
    )
    try:
        serve.wait_ready()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            engine_pid = int(serve.wait_for_line(r"EngineCore_0 ready \(pid (\d+)\)")[1])
            os.kill(engine_pid, signal.SIGKILL)
            assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert serve.wait(60) != 0, serve.output
    finally:
        serve.kill()


def test_bad_requests_are_invalid_argument(client):
    pb2, stub = client
    cases = [
        (tokens_request(pb2, "b1", [], max_tokens=3), "tokenized.input_ids"),
        (tokens_request(pb2, "b2", [1, 2], max_tokens=3, top_p=2.0), "sampling_params.top_p"),
        (tokens_request(pb2, "b3", [1, 2], max_tokens=MAX_MODEL_LEN), "sampling_params.max_tokens"),
        (tokens_request(pb2, "b4", [1, 2], max_tokens=3, n=2), "sampling_params.n"),
        (pb2.GenerateRequest(request_id="b5"), "input"),
    ]
    for request, field in cases:
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(request, timeout=10))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert field in error.value.details()
    with pytest.raises(grpc.RpcError) as error:
        stub.Embed(pb2.EmbedRequest(), timeout=10)
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED and "Embed" in error.value.details()


def wait_until_idle(pb2, stub) -> None:
    deadline = time.monotonic() + 30
    while stub.GetServerInfo(pb2.GetServerInfoRequest(), timeout=10).active_requests != 0:
        assert time.monotonic() < deadline, "the cancelled request is still running"
        time.sleep(0.05)


def test_abort_ends_the_stream_with_abort(client):
    pb2, stub = client
    max_tokens = MAX_MODEL_LEN - 10
    call = stub.Generate(tokens_request(pb2, "g-abort", list(b"long one"), max_tokens=max_tokens), timeout=120)
    first = next(call)
    assert first.WhichOneof("response") == "chunk"
    stub.Abort(pb2.AbortRequest(request_ids=["g-abort"]), timeout=10)
    last = list(call)[-1]
    assert last.complete.finish_reason == "abort" and last.complete.completion_tokens < max_tokens
    wait_until_idle(pb2, stub)


def test_client_cancel_aborts_the_engine_request(client):
    pb2, stub = client
    call = stub.Generate(
        tokens_request(pb2, "g-cancel", list(b"cancel me"), max_tokens=MAX_MODEL_LEN - 10), timeout=120
    )
    assert next(call).WhichOneof("response") == "chunk"
    call.cancel()
    wait_until_idle(pb2, stub)
    # The server still serves after the cancel.
    responses = list(stub.Generate(tokens_request(pb2, "g-after", [7, 8], max_tokens=3), timeout=60))
    assert responses[-1].complete.finish_reason == "length"


def test_grpc_port_is_refused_with_the_python_frontend():
    serve = Serve("--model", "echo", "--port", "0", "--grpc-port", str(free_port()), "--frontend", "python")
    try:
        assert serve.wait(60) == 2
        assert "--grpc-port" in serve.output and "--frontend rust" in serve.output
    finally:
        serve.kill()
