"""This project's reference engine against vLLM 0.33's own codec: every
message the engine sends decodes with vLLM's `MsgpackDecoder` of the right
type (msgspec is strict), and requests encoded by vLLM's `MsgpackEncoder`
drive the engine, in process and over real ZeroMQ sockets."""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")

import msgspec  # noqa: E402
import zmq  # noqa: E402
from vllm.sampling_params import SamplingParams as VllmSamplingParams  # noqa: E402
from vllm.v1.engine import (  # noqa: E402
    EngineCoreEventType,
    EngineCoreOutputs,
    EngineCoreReadyResponse,
    EngineCoreRequest,
    EngineCoreRequestType,
    FinishReason,
)
from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder  # noqa: E402
from vllm_rs.engine import make_engine_config, run_engine_core  # noqa: E402
from vllm_rs.engine.config import ClientAddresses  # noqa: E402
from vllm_rs.engine.core import EngineCore  # noqa: E402
from vllm_rs.engine.protocol import (  # noqa: E402
    EngineCoreOutputs as OurOutputs,
)
from vllm_rs.engine.protocol import (
    EngineCoreRequest as OurRequest,
)
from vllm_rs.engine.protocol import (
    UtilityOutput as OurUtilityOutput,
)
from vllm_rs.engine.protocol import (
    encode_outputs,
    encode_ready_response,
    engine_identity,
    unpack,
)
from vllm_rs.network_utils import make_zmq_listener, make_zmq_socket  # noqa: E402
from vllm_rs.utils import CoreEngineProcManager  # noqa: E402

DECODE_OUTPUTS = MsgpackDecoder(EngineCoreOutputs)
ENCODE = MsgpackEncoder()


def vllm_request(request_id: str, prompt: bytes, client_index: int = 0, **sampling) -> EngineCoreRequest:
    params = VllmSamplingParams(**sampling)
    params._eos_token_id = 256
    params._all_stop_token_ids.add(256)
    return EngineCoreRequest(
        request_id, list(prompt), None, params, None, 0.0, None, None, None,
        client_index=client_index, external_req_id=request_id,
    )  # fmt: skip


def decode(message: OurOutputs) -> EngineCoreOutputs:
    return DECODE_OUTPUTS.decode(encode_outputs(message))


@pytest.mark.parametrize("model", ["echo", "toy"])
def test_the_ready_response_decodes_as_vllms(model):
    core = EngineCore(make_engine_config(model, max_model_len=128))
    response = msgspec.msgpack.decode(encode_ready_response(core.ready_response()), type=EngineCoreReadyResponse)
    assert (response.max_model_len, response.num_gpu_blocks) == (128, core.num_gpu_blocks)
    assert response.block_size == 16 and response.max_num_seqs >= 1 and response.vllm_version == "0.33.0"


def test_every_message_the_engine_makes_decodes_strictly_as_vllms():
    core = EngineCore(make_engine_config("toy", max_model_len=64))
    core.add_request(OurRequest.from_wire(unpack(ENCODE.encode(vllm_request("a", b"Hello there", max_tokens=2))[0])))
    first = decode(OurOutputs(0, [o for _, o in core.step()], core.scheduler_stats().to_wire()))
    (output,) = first.outputs
    assert [e.type for e in output.events] == [EngineCoreEventType.QUEUED, EngineCoreEventType.SCHEDULED]
    assert isinstance(first.scheduler_stats, SchedulerStats)
    assert isinstance(first.scheduler_stats.prefix_cache_stats, PrefixCacheStats)
    assert first.scheduler_stats.prefix_cache_stats.queries == len(b"Hello there")
    assert first.scheduler_stats.iteration_details.num_ctx_requests == 1
    last = decode(OurOutputs(0, [o for _, o in core.step()], core.scheduler_stats().to_wire(),
                             finished_requests=core.take_finished(0)))  # fmt: skip
    assert last.outputs[0].finish_reason == FinishReason.LENGTH and last.finished_requests == {"a"}
    error = core.add_request(OurRequest.from_wire(unpack(ENCODE.encode(vllm_request("bad", b"x" * 64))[0])))
    rejected = decode(OurOutputs(0, [error], finished_requests=core.take_finished(0)))
    assert rejected.outputs[0].finish_reason == FinishReason.ERROR
    assert rejected.outputs[0].error.code == "validation_error" and "max_model_len" in rejected.outputs[0].error.message
    for method in (
        "is_sleeping",
        "reset_prefix_cache",
        "get_supported_tasks",
        "get_weight_version",
        "sleep",
        "wake_up",
    ):
        result = core.call_utility(method, [])
        reply = decode(OurOutputs(0, utility_output=OurUtilityOutput(3, result=result)))
        assert reply.utility_output.call_id == 3 and reply.utility_output.result.result == result
    failed = decode(OurOutputs(0, utility_output=OurUtilityOutput(4, failure_message="Call to x method failed: no")))
    assert failed.utility_output.failure_message.startswith("Call to x method failed")


@pytest.mark.parametrize(
    ("sampling", "expected_tokens"),
    [({}, 16), ({"max_tokens": 16}, 16), ({"max_tokens": 3}, 3), ({"max_tokens": None}, 64 - 5)],
)
def test_requests_encoded_by_vllm_get_vllms_defaults(sampling, expected_tokens):
    core = EngineCore(make_engine_config("echo", max_model_len=64))
    wire = ENCODE.encode(vllm_request("r", b"hello", **sampling))
    assert core.add_request(OurRequest.from_wire(unpack(wire[0]))) is None
    produced = []
    while core.has_work():
        produced += [t for _, o in core.step() for t in o.new_token_ids]
    assert len(produced) == expected_tokens


def test_an_engine_process_serves_a_frontend_speaking_vllms_codec(tmp_path):
    ctx = zmq.Context()
    inp = make_zmq_listener(f"ipc://{tmp_path}/input", zmq.ROUTER)
    out = make_zmq_listener(f"ipc://{tmp_path}/output", zmq.PULL)
    router = make_zmq_socket(ctx, inp.address, zmq.ROUTER, linger=0, listener=inp)
    pull = make_zmq_socket(ctx, out.address, zmq.PULL, linger=0, listener=out)
    config = make_engine_config("echo", clients=[ClientAddresses(inp.address, out.address)])
    manager = CoreEngineProcManager(run_engine_core, 1, 0, 0, config, True, inp.address, None, True)
    try:
        assert router.poll(60_000), "the engine did not register"
        identity, payload = router.recv_multipart()
        ready = msgspec.msgpack.decode(payload, type=EngineCoreReadyResponse)
        assert identity == engine_identity(0) and ready.max_model_len == config.model_config.max_model_len

        def send(kind: EngineCoreRequestType, value) -> None:
            router.send_multipart([identity, kind.value, *ENCODE.encode(value)])

        def receive() -> EngineCoreOutputs:
            assert pull.poll(30_000), "no message from the engine"
            return DECODE_OUTPUTS.decode(pull.recv_multipart())

        send(EngineCoreRequestType.ADD, vllm_request("r", b"abc"))  # max_tokens omitted: 16
        tokens, finished = [], set()
        while True:
            message = receive()
            tokens += [t for o in message.outputs for t in o.new_token_ids]
            finished |= message.finished_requests or set()
            if message.outputs and message.outputs[-1].finish_reason is not None:
                break
        assert len(tokens) == 16 and finished == {"r"}
        send(EngineCoreRequestType.UTILITY, (0, 9, "sleep", (1, "abort")))
        while (reply := receive()).utility_output is None:
            pass
        assert reply.utility_output.call_id == 9 and reply.utility_output.failure_message is None
        send(EngineCoreRequestType.UTILITY, (0, 10, "wake_up", (None,)))
        while (reply := receive()).utility_output is None:
            pass
        assert reply.utility_output.result.result is True
    finally:
        manager.shutdown(timeout=10)
        router.close(linger=0)
        pull.close(linger=0)
        ctx.term()
        inp.cleanup()
        out.cleanup()
    assert manager.processes[0].exitcode == 0


def test_logprobs_decode_as_vllms_and_feed_its_logprobs_processor():
    import numpy as np
    from vllm.v1.engine.logprobs import LogprobsProcessor
    from vllm.v1.outputs import LogprobsLists, LogprobsTensors

    core = EngineCore(make_engine_config("toy", max_model_len=64))
    wire = ENCODE.encode(vllm_request("lp", b"Hello there", max_tokens=3, logprobs=4, prompt_logprobs=2))
    vllm_side = msgspec.msgpack.decode(wire[0], type=EngineCoreRequest, dec_hook=MsgpackDecoder().dec_hook)
    core.add_request(OurRequest.from_wire(unpack(wire[0])))
    processor = LogprobsProcessor.from_new_request(None, vllm_side)
    while core.has_work():
        ours = [o for _, o in core.step()]
        (output,) = decode(OurOutputs(0, ours)).outputs
        assert isinstance(output.new_logprobs, LogprobsLists)
        assert output.new_logprobs.logprob_token_ids.dtype == np.int32
        np.testing.assert_array_equal(output.new_logprobs.logprob_token_ids, ours[0].new_logprobs.token_ids)
        np.testing.assert_array_equal(output.new_logprobs.sampled_token_ranks, ours[0].new_logprobs.ranks)
        if ours[0].new_prompt_logprobs is not None:
            assert isinstance(output.new_prompt_logprobs_tensors, LogprobsTensors)
            assert output.new_prompt_logprobs_tensors.logprobs.shape == (len(b"Hello there") - 1, 3)
        processor.update_from_output(output)
    # vLLM's processor built one entry per sampled token and per prompt token (None for the first).
    assert len(processor.logprobs) == 3 and processor.cumulative_logprob < 0
    prompt = processor.pop_prompt_logprobs()
    assert prompt[0] is None and len(prompt) == len(b"Hello there")
    assert all(len(position) in (2, 3) for position in prompt[1:])  # top 2, plus the prompt token when not among them


def test_structured_outputs_encoded_by_vllm_are_enforced():
    import json

    from vllm.sampling_params import StructuredOutputsParams

    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}, "required": ["n"]}
    schema["additionalProperties"] = False
    core = EngineCore(make_engine_config("toy", max_model_len=256))
    cases = {
        "json": StructuredOutputsParams(json=schema, disable_any_whitespace=True),
        "choice": StructuredOutputsParams(choice=["alpha", "beta"]),
        "regex": StructuredOutputsParams(regex="[0-9]{4}"),
    }
    for request_id, params in cases.items():
        params._backend = "guidance"  # what vLLM's processor sets before the engine sees it
        request = vllm_request(request_id, b"Go: ", max_tokens=100, temperature=1.0, seed=7)
        request.sampling_params.structured_outputs = params
        assert core.add_request(OurRequest.from_wire(unpack(ENCODE.encode(request)[0]))) is None
    text: dict[str, bytes] = {}
    while core.has_work():
        for _, output in core.step():
            text[output.request_id] = text.get(output.request_id, b"") + bytes(
                t for t in output.new_token_ids if t < 256
            )
    assert json.loads(text["json"])["n"] <= 9
    assert text["choice"] in (b"alpha", b"beta") and len(text["regex"]) == 4 and text["regex"].isdigit()


def struct_fields(cls) -> list[str]:
    """A msgspec Struct's or a dataclass's field names, in wire order."""
    import dataclasses

    return list(getattr(cls, "__struct_fields__", None) or [f.name for f in dataclasses.fields(cls)])


def test_prefill_stats_decode_as_vllms_with_the_prompts_sources():
    from vllm.v1.metrics.stats import PrefillStats as VllmPrefillStats
    from vllm_rs.engine.stats import PrefillStats

    assert struct_fields(PrefillStats) == struct_fields(VllmPrefillStats)
    core = EngineCore(make_engine_config("toy", max_model_len=128, num_gpu_blocks=8, block_size=16))
    prompt = b"The quick brown fox jumps over the lazy d"  # 41 tokens: 2 full blocks can be cached
    seen = {}
    for request_id in ("cold", "warm"):
        core.add_request(OurRequest.from_wire(unpack(ENCODE.encode(vllm_request(request_id, prompt, max_tokens=3))[0])))
        stats = []
        while core.has_work():
            (output,) = decode(OurOutputs(0, [o for _, o in core.step()])).outputs
            stats.append(output.prefill_stats)
        assert all(s is None for s in stats[1:]) and len(stats) == 3, stats
        assert isinstance(stats[0], VllmPrefillStats)
        seen[request_id] = stats[0]
    as_tuple = lambda s: tuple(getattr(s, f) for f in struct_fields(VllmPrefillStats))  # noqa: E731
    # prompt, computed, cached (local + external), local, external, written to
    # the prefix cache: the cold prompt fills 2 blocks, the warm one finds them.
    assert as_tuple(seen["cold"]) == (41, 41, 0, 0, 0, 32)
    assert as_tuple(seen["warm"]) == (41, 9, 32, 32, 0, 0)


def test_a_full_cache_preempts_the_request_admitted_last_and_vllm_reads_the_event():
    core = EngineCore(make_engine_config("toy", max_model_len=128, num_gpu_blocks=8, block_size=16))

    def add(request_id: str, prompt: bytes) -> None:
        request = vllm_request(request_id, prompt, max_tokens=90, ignore_eos=True)
        core.add_request(OurRequest.from_wire(unpack(ENCODE.encode(request)[0])))

    events: dict[str, list] = {"first": [], "second": []}
    tokens = {"first": 0, "second": 0}
    stats = []

    def step() -> None:
        message = decode(OurOutputs(0, [o for _, o in core.step()], core.scheduler_stats().to_wire()))
        stats.append(message.scheduler_stats)
        for output in message.outputs:
            events[output.request_id] += [e.type for e in output.events or []]
            tokens[output.request_id] += len(output.new_token_ids)

    add("first", b"a" * 30)  # 30 + 90 tokens: the whole cache of 8 blocks of 16
    step()
    add("second", b"b" * 30)
    while core.has_work():
        step()
    assert tokens == {"first": 90, "second": 90}
    Q, S, P = EngineCoreEventType.QUEUED, EngineCoreEventType.SCHEDULED, EngineCoreEventType.PREEMPTED  # noqa: N806
    assert events["first"] == [Q, S]
    assert events["second"][:3] == [Q, S, P] and events["second"][3] == S and P in events["second"]
    assert core.scheduler.num_preemptions == events["second"].count(P) >= 1
    assert max(s.kv_cache_usage for s in stats) == 1.0
    assert any(s.num_waiting_reqs == 1 for s in stats) and stats[-1].num_running_reqs == 0
