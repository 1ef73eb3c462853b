"""vLLM's gRPC generate API (`vllm.grpc.engine.VllmEngine`) served by the Rust
frontend on `serve --grpc-port`, driven by a real `grpcio` client with stubs
generated from the project's own .proto files (and with vLLM's own published
stubs, `smg_grpc_proto`, when installed)."""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import signal
import socket
import sys
from pathlib import Path

import pytest

from tests.support.wait import wait_until
from tests.test_serve import Serve, rust_frontend_available, serving

grpc = pytest.importorskip("grpc")
grpc_tools = pytest.importorskip("grpc_tools")
from grpc_tools import protoc  # noqa: E402

PROTO_DIR = Path(__file__).resolve().parent.parent / "rust" / "grpc" / "proto"
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
                  "--max-model-len", str(MAX_MODEL_LEN))  # fmt: skip
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
    serve = Serve("--model", "echo", "--port", "0", "--grpc-port", str(port), "--host", "127.0.0.1")
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
        (tokens_request(pb2, "b4", [1, 2], max_tokens=3, n=20000), "sampling_params.n"),
        (tokens_request(pb2, "b6", [1, 2], max_tokens=3, logprobs=-2), "sampling_params.logprobs"),
        (tokens_request(pb2, "b7", [1, 2], max_tokens=3, prompt_logprobs=100000), "sampling_params.prompt_logprobs"),
        (pb2.GenerateRequest(request_id="b5"), "input"),
    ]
    for request, field in cases:
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(request, timeout=10))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert field in error.value.details()
    with pytest.raises(grpc.RpcError) as error:
        stub.Embed(pb2.EmbedRequest(), timeout=10)
    # A generating model (echo) has no embeddings, as in vLLM's servicer.
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not support Embeddings" in error.value.details()


def test_embed_on_a_pooling_model(stubs, tmp_path):
    """Embed on a BERT embedding model: the vector `/v1/embeddings` gives for the same token ids."""
    pytest.importorskip("transformers")
    from tests.pooling_checkpoints import write_bert

    pb2, pb2_grpc = stubs
    model = write_bert(str(tmp_path / "bert"), st_pooling="mean_tokens", normalize=True)
    port = free_port()
    with serving("--model", model, "--port", "0", "--grpc-port", str(port), "--host", "127.0.0.1") as serve:
        ids = [2, 10, 11, 12, 3]
        status, body = serve.http("POST", "/v1/embeddings", {"input": [ids]})
        assert status == 200, body
        want = json.loads(body)["data"][0]["embedding"]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb2_grpc.VllmEngineStub(channel)
            tokenized = pb2.TokenizedInput(input_ids=ids)
            answer = stub.Embed(pb2.EmbedRequest(request_id="e1", tokenized=tokenized), timeout=60)
            assert (answer.prompt_tokens, answer.embedding_dim) == (len(ids), len(want))
            assert list(answer.embedding) == pytest.approx(want, abs=1e-6)
            with pytest.raises(grpc.RpcError) as error:
                stub.Embed(pb2.EmbedRequest(request_id="e2"), timeout=10)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.RpcError) as error:
                list(stub.Generate(tokens_request(pb2, "g1", ids, max_tokens=2), timeout=10))
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def wait_until_idle(pb2, stub) -> None:
    wait_until(
        lambda: stub.GetServerInfo(pb2.GetServerInfoRequest(), timeout=10).active_requests == 0,
        "the cancelled request to end",
        30,
    )


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


LN2 = math.log(2)


def assert_echo_top(top, token: int, count: int) -> None:
    """The echo model's top logprobs at a position scoring `token`: `token`,
    `token + 1`, ... at -ln 2, -2 ln 2, ... (float32 on the wire)."""
    assert list(top.token_ids) == [token + i for i in range(count)]
    assert list(top.values) == pytest.approx([-(i + 1) * LN2 for i in range(count)], abs=1e-6)


def assert_echo_input_logprobs(input_logprobs, prompt: list[int], count: int) -> None:
    """The prompt's logprobs: none for the first token, -ln 2 for the rest."""
    assert list(input_logprobs.token_ids) == prompt
    first, *rest = input_logprobs.token_logprobs
    assert not first.HasField("value") and len(input_logprobs.top_logprobs[0].token_ids) == 0
    assert [r.value for r in rest] == pytest.approx([-LN2] * len(rest), abs=1e-6)
    for token, top in zip(prompt[1:], input_logprobs.top_logprobs[1:], strict=True):
        assert_echo_top(top, token, count)


def test_whole_generation_with_logprobs(client):
    pb2, stub = client
    prompt = list(b"hello")
    request = tokens_request(pb2, "lp-whole", prompt, False, max_tokens=7, logprobs=2, prompt_logprobs=1)
    (only,) = list(stub.Generate(request, timeout=60))
    done = only.complete
    assert list(done.output_ids) == echo(prompt, 7) and done.index == 0
    assert list(done.output_logprobs.token_ids) == echo(prompt, 7)
    assert list(done.output_logprobs.token_logprobs) == pytest.approx([-LN2] * 7, abs=1e-6)
    for token, top in zip(echo(prompt, 7), done.output_logprobs.top_logprobs, strict=True):
        assert_echo_top(top, token, 2)
    assert_echo_input_logprobs(done.input_logprobs, prompt, 1)
    # logprobs=0: each token's own logprob, no top logprobs (as vLLM's servicer).
    (zero,) = list(stub.Generate(tokens_request(pb2, "lp-zero", prompt, False, max_tokens=3, logprobs=0), timeout=60))
    assert list(zero.complete.output_logprobs.token_ids) == echo(prompt, 3)
    assert len(zero.complete.output_logprobs.top_logprobs) == 0 and not zero.complete.HasField("input_logprobs")
    (plain,) = list(stub.Generate(tokens_request(pb2, "lp-none", prompt, False, max_tokens=3), timeout=60))
    assert not plain.complete.HasField("output_logprobs") and not plain.complete.HasField("input_logprobs")


def test_streamed_generation_with_logprobs(client):
    pb2, stub = client
    prompt = list(b"stream")
    request = tokens_request(pb2, "lp-stream", prompt, True, max_tokens=9, logprobs=3, prompt_logprobs=2)
    responses = list(stub.Generate(request, timeout=60))
    chunks = [r.chunk for r in responses[:-1]]
    assert chunks and responses[-1].WhichOneof("response") == "complete"
    # Each chunk scores its own tokens; the prompt's logprobs come only in the first chunk.
    for chunk in chunks:
        assert list(chunk.output_logprobs.token_ids) == list(chunk.token_ids)
    assert [c.HasField("input_logprobs") for c in chunks] == [True] + [False] * (len(chunks) - 1)
    assert_echo_input_logprobs(chunks[0].input_logprobs, prompt, 2)
    tops = [top for c in chunks for top in c.output_logprobs.top_logprobs]
    for token, top in zip(echo(prompt, 9), tops, strict=True):
        assert_echo_top(top, token, 3)
    done = responses[-1].complete
    assert (done.finish_reason, done.completion_tokens) == ("length", 9)
    assert not done.HasField("output_logprobs") and not done.HasField("input_logprobs")


def test_logprobs_above_the_servers_limit_are_invalid_argument(client):
    pb2, stub = client
    with pytest.raises(grpc.RpcError) as error:
        list(stub.Generate(tokens_request(pb2, "lp-max", [1, 2], max_tokens=2, logprobs=21), timeout=10))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("sampling_params.logprobs:") and "21" in error.value.details()


def success_count(serve: Serve, model: str, reason: str) -> float:
    """`vllm:request_success_total` for `reason`, summed over the engines."""
    status, body = serve.http("GET", "/metrics")
    assert status == 200
    pattern = rf'^vllm:request_success_total{{model_name="{model}",engine="\d+",finished_reason="{reason}"}} (\S+)$'
    return sum(float(m[1]) for m in re.finditer(pattern, body.decode(), re.MULTILINE))


@pytest.mark.parametrize("stream", [True, False])
def test_two_choices_have_their_index(served, client, stream):
    pb2, stub = client
    prompt = list(b"two")
    before = success_count(served[0], "echo", "length")
    request = tokens_request(pb2, f"n2-{stream}", prompt, stream, max_tokens=5, n=2, logprobs=1)
    responses = list(stub.Generate(request, timeout=60))
    completes = [r.complete for r in responses if r.WhichOneof("response") == "complete"]
    assert sorted(c.index for c in completes) == [0, 1]
    for index in (0, 1):
        if stream:
            chunks = [r.chunk for r in responses if r.WhichOneof("response") == "chunk" and r.chunk.index == index]
            assert [t for c in chunks for t in c.token_ids] == echo(prompt, 5)
            assert [t for c in chunks for t in c.output_logprobs.token_ids] == echo(prompt, 5)
        else:
            # Not streamed: one complete per choice, in index order, each with all its tokens.
            assert completes[index].index == index and list(completes[index].output_ids) == echo(prompt, 5)
            assert list(completes[index].output_logprobs.token_ids) == echo(prompt, 5)
        (complete,) = [c for c in completes if c.index == index]
        assert (complete.finish_reason, complete.completion_tokens, complete.prompt_tokens) == ("length", 5, 3)
    # As in vLLM, each choice is a request of its own in the metrics.
    assert success_count(served[0], "echo", "length") == before + 2


def test_vllms_published_stubs_talk_to_ours(served):
    """vLLM's gRPC server imports its stubs from `smg_grpc_proto`; a client
    built on them gets the same answers from this server."""
    smg = pytest.importorskip("smg_grpc_proto")
    from smg_grpc_proto import vllm_engine_pb2 as pb2
    from smg_grpc_proto import vllm_engine_pb2_grpc as pb2_grpc

    assert smg and pb2.DESCRIPTOR.package == "vllm.grpc.engine"
    with grpc.insecure_channel(served[1]) as channel:
        stub = pb2_grpc.VllmEngineStub(channel)
        prompt = list(b"vllm")
        request = tokens_request(pb2, "smg-1", prompt, False, max_tokens=6, n=2, logprobs=1, prompt_logprobs=0)
        completes = [r.complete for r in stub.Generate(request, timeout=60)]
        assert [c.index for c in completes] == [0, 1]
        assert all(list(c.output_ids) == echo(prompt, 6) for c in completes)
        assert list(completes[0].input_logprobs.token_ids) == prompt
        assert stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=10).served_model_name == "echo"


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def toy(stubs):
    """The toy model (random weights) on gRPC, with its client."""
    port = free_port()
    serve = Serve("--model", "toy", "--port", "0", "--grpc-port", str(port), "--host", "127.0.0.1",
                  "--max-model-len", "1024")  # fmt: skip
    try:
        serve.wait_ready()
        pb2, pb2_grpc = stubs
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield pb2, pb2_grpc.VllmEngineStub(channel)
    finally:
        serve.kill()


def text_of(output_ids) -> str:
    """The toy model's byte-level tokens as text (256 is EOS)."""
    return bytes(t for t in output_ids if t < 256).decode()


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_constraint_output_validates(toy, stream):
    jsonschema = pytest.importorskip("jsonschema")
    pb2, stub = toy
    request = pb2.GenerateRequest(
        request_id=f"schema-{stream}",
        text="a person",
        sampling_params=pb2.SamplingParams(max_tokens=300, seed=3, json_schema=json.dumps(SCHEMA)),
        stream=stream,
    )
    responses = list(stub.Generate(request, timeout=120))
    if stream:
        output = [t for r in responses if r.WhichOneof("response") == "chunk" for t in r.chunk.token_ids]
    else:
        output = list(responses[-1].complete.output_ids)
    assert responses[-1].complete.finish_reason == "stop", text_of(output)
    jsonschema.validate(json.loads(text_of(output)), SCHEMA)


def test_choice_and_regex_constraints_hold(toy):
    pb2, stub = toy
    choice = pb2.SamplingParams(max_tokens=20, seed=1, choice=pb2.ChoiceConstraint(choices=["alpha", "beta"]))
    regex = pb2.SamplingParams(max_tokens=20, seed=1, regex="[0-9]{3}-[a-z]{2}")
    for params, check in [
        (choice, lambda t: t in ("alpha", "beta")),
        (regex, re.compile("[0-9]{3}-[a-z]{2}").fullmatch),
    ]:
        request = pb2.GenerateRequest(request_id="c", text="pick", sampling_params=params, stream=False)
        (only,) = list(stub.Generate(request, timeout=60))
        assert check(text_of(only.complete.output_ids)), text_of(only.complete.output_ids)


def test_choices_use_seed_plus_index(toy):
    pb2, stub = toy

    def generate(request_id, n, seed):
        params = pb2.SamplingParams(max_tokens=8, temperature=1.0, seed=seed, n=n)
        request = pb2.GenerateRequest(request_id=request_id, text="seeded", sampling_params=params, stream=False)
        return {r.complete.index: list(r.complete.output_ids) for r in stub.Generate(request, timeout=60)}

    both = generate("seeds-2", 2, 11)
    assert both == {0: generate("seed-11", 1, 11)[0], 1: generate("seed-12", 1, 12)[0]}


def test_bad_schema_is_invalid_argument_naming_it(toy):
    pb2, stub = toy
    for params, field in [
        (pb2.SamplingParams(max_tokens=5, json_schema="{not json"), "sampling_params.json_schema"),
        (pb2.SamplingParams(max_tokens=5, json_schema="[1, 2]"), "sampling_params.json_schema"),
        (pb2.SamplingParams(max_tokens=5, regex="a("), "sampling_params.regex"),
        (pb2.SamplingParams(max_tokens=5, choice=pb2.ChoiceConstraint()), "sampling_params.choice"),
    ]:
        request = pb2.GenerateRequest(request_id="bad-schema", text="x", sampling_params=params, stream=False)
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(request, timeout=10))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert error.value.details().startswith(f"{field}:"), error.value.details()


def test_http_counts_each_choice_as_a_request_too(served):
    serve = served[0]
    before = success_count(serve, "echo", "length")
    result = serve.client().completions.create(model="echo", prompt="abc", max_tokens=4, n=2)
    assert sorted(c.index for c in result.choices) == [0, 1]
    assert success_count(serve, "echo", "length") == before + 2
