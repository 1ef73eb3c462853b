"""The reference engine core: scheduling, stop conditions and sampling in
process (echo and toy), then the engine process over real ZeroMQ sockets with
two clients: registration, ADD/ABORT/UTILITY, routing by client_index,
scheduler stats, SIGTERM, and ENGINE_CORE_DEAD on failure."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import zmq
from vllm_rs.engine import make_engine_config, run_engine_core
from vllm_rs.engine.config import ClientAddresses
from vllm_rs.engine.core import FAIL_AT_STEP_ENV, EngineCore
from vllm_rs.engine.model_loader.registry import BYTE_EOS_TOKEN_ID, ModelPathError, resolve_model, write_model_dir
from vllm_rs.engine.protocol import (
    ENGINE_CORE_DEAD,
    REQUEST_ABORT,
    REQUEST_ADD,
    REQUEST_UTILITY,
    EngineCoreEventType,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    UtilityCall,
    UtilityOutput,
    decode_registration,
    encode_abort,
    encode_add,
    encode_outputs,
    encode_ready_response,
    encode_utility,
    engine_identity,
    pack,
    unpack,
)
from vllm_rs.engine.sample.logprobs import LogprobsRows
from vllm_rs.engine.sched.request import SamplingParams
from vllm_rs.network_utils import make_zmq_listener, make_zmq_socket
from vllm_rs.utils import CoreEngineProcManager

from tests.thread_signals import signal_another_thread


def request(request_id: str, prompt: bytes | list[int], **sampling) -> EngineCoreRequest:
    tokens = list(prompt) if isinstance(prompt, bytes) else prompt
    return EngineCoreRequest(request_id, tokens, sampling)


def run_to_end(core: EngineCore, max_steps: int = 10_000) -> dict[str, list]:
    """Steps until idle; request id -> list of outputs."""
    outputs: dict[str, list] = {}
    for _ in range(max_steps):
        if not core.has_work():
            return outputs
        for _, output in core.step():
            outputs.setdefault(output.request_id, []).append(output)
    raise AssertionError("the engine did not finish")


def tokens(outputs: list) -> list[int]:
    return [t for o in outputs for t in o.new_token_ids]


# ---- scheduling and stop conditions (echo: no torch) ----


def test_echo_repeats_the_prompt_and_stops_at_max_tokens():
    core = EngineCore(make_engine_config("echo"))
    core.add_request(request("a", b"hello", max_tokens=7))
    out = run_to_end(core)["a"]
    assert bytes(tokens(out)) == b"hellohe"
    assert [o.finish_reason for o in out] == [None] * 6 + [FinishReason.LENGTH]


def test_stop_token_eos_min_tokens_and_ignore_eos():
    core = EngineCore(make_engine_config("echo"))
    core.add_request(request("stop", b"abcabc", max_tokens=50, stop_token_ids=[ord("c")]))
    core.add_request(request("eos", [65, 66, BYTE_EOS_TOKEN_ID], max_tokens=50, _eos_token_id=BYTE_EOS_TOKEN_ID))
    core.add_request(request("min", b"abcabc", max_tokens=50, stop_token_ids=[ord("c")], min_tokens=4))
    core.add_request(
        request("ignore", [65, BYTE_EOS_TOKEN_ID], max_tokens=5, _eos_token_id=BYTE_EOS_TOKEN_ID, ignore_eos=True)
    )
    out = run_to_end(core)
    assert bytes(tokens(out["stop"])) == b"abc"
    assert (out["stop"][-1].finish_reason, out["stop"][-1].stop_reason) == (FinishReason.STOP, ord("c"))
    assert tokens(out["eos"]) == [65, 66, BYTE_EOS_TOKEN_ID]
    assert (out["eos"][-1].finish_reason, out["eos"][-1].stop_reason) == (FinishReason.STOP, None)
    assert bytes(tokens(out["min"])) == b"abcabc"  # the first c came before min_tokens
    assert len(tokens(out["ignore"])) == 5 and out["ignore"][-1].finish_reason == FinishReason.LENGTH


def test_new_requests_join_the_running_batch_within_the_limits():
    core = EngineCore(make_engine_config("echo", max_num_seqs=2, max_num_batched_tokens=8))
    core.add_request(request("a", b"xy", max_tokens=100))
    core.step()
    assert core.scheduler_stats().num_running_reqs == 1
    core.add_request(request("b", b"xy", max_tokens=100))
    core.add_request(request("c", b"xy", max_tokens=100))
    produced = {o.request_id for _, o in core.step()}
    assert produced == {"a", "b"}  # b joined at once, c waits for a seat
    stats = core.scheduler_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (2, 1)
    core.abort_requests(["a"])
    assert {o.request_id for _, o in core.step()} == {"b", "c"}


def test_long_prompts_are_prefilled_in_chunks_of_the_token_budget():
    core = EngineCore(make_engine_config("echo", max_num_batched_tokens=8))
    core.add_request(request("long", b"x" * 20, max_tokens=2))
    assert core.step() == [] and core.step() == []  # 8 + 8 prompt tokens
    assert [o.new_token_ids for _, o in core.step()] == [[ord("x")]]  # the last 4, then a token
    assert core.totals["prompt_tokens_computed"] == 20


def test_invalid_requests_finish_with_error():
    core = EngineCore(make_engine_config("echo", max_model_len=16))
    too_long = core.add_request(request("long", b"x" * 16))
    bad_token = core.add_request(request("bad", [1, 999]))
    bad_param = core.add_request(request("temp", b"x", temperature="hot"))
    for output in (too_long, bad_token, bad_param):
        assert output is not None and output.finish_reason == FinishReason.ERROR
        assert output.stop_reason is None and output.error.code == "validation_error"
    assert "max_model_len is 16" in too_long.error.message
    assert "temperature" in bad_param.error.message
    assert core.take_finished(0) == ["long", "bad", "temp"]
    assert not core.has_work()


def test_outputs_carry_queued_and_scheduled_events_on_the_first_token_only():
    core = EngineCore(make_engine_config("echo"))
    core.add_request(request("a", b"xyz", max_tokens=3))
    first, second, third = (o for step in range(3) for _, o in core.step())
    assert [e.type for e in first.events] == [EngineCoreEventType.QUEUED, EngineCoreEventType.SCHEDULED]
    assert first.events[0].timestamp <= first.events[1].timestamp <= time.monotonic()
    assert second.events is None and third.events is None
    assert core.take_finished(0) == ["a"]


def test_scheduler_stats_have_vllms_fields_and_prefix_cache_deltas():
    core = EngineCore(make_engine_config("toy", max_model_len=256))
    prompt = b"0123456789abcdef" * 3
    core.add_request(request("a", prompt, max_tokens=1, temperature=0.0))
    run_to_end(core)
    first = core.scheduler_stats()
    assert first.prefix_cache_stats.requests == 1 and first.prefix_cache_stats.hits == 0
    assert first.prefix_cache_stats.queries == len(prompt)
    core.add_request(request("b", prompt, max_tokens=1, temperature=0.0))
    run_to_end(core)
    second = core.scheduler_stats().to_wire()
    assert second["prefix_cache_stats"]["requests"] == 1 and second["prefix_cache_stats"]["hits"] == 32
    assert core.scheduler_stats().prefix_cache_stats.requests == 0  # reported once
    assert second["iteration_details"]["num_ctx_requests"] == 1


def test_utilities_answer_with_vllms_signatures_and_unknown_ones_raise():
    core = EngineCore(make_engine_config("echo"))
    assert core.call_utility("reset_prefix_cache", [False, False]) is True
    assert core.call_utility("sleep", [1, "abort"]) is None and core.call_utility("is_sleeping", []) is True
    assert core.call_utility("wake_up", [None]) is True and core.call_utility("is_sleeping", []) is False
    assert core.call_utility("sleep", [0, "keep"]) is None and core.call_utility("is_scheduler_paused", []) is True
    assert core.call_utility("wake_up", [["scheduling"]]) is True and not core.is_sleeping()
    assert core.call_utility("get_supported_tasks", []) == ["generate"]
    assert core.call_utility("get_weight_version", []) == "default"
    assert core.call_utility("get_stats", [])["model"] == "echo"
    with pytest.raises(ValueError, match="Invalid pause mode: nap"):
        core.call_utility("sleep", [1, "nap"])
    with pytest.raises(ValueError, match="sleep level"):
        core.call_utility("sleep", ["deep"])
    with pytest.raises(ValueError, match="no utility method 'nope'"):
        core.call_utility("nope", [])


def test_omitted_max_tokens_is_vllms_16_and_nil_is_up_to_max_model_len():
    core = EngineCore(make_engine_config("echo", max_model_len=64))
    core.add_request(request("omitted", b"abc"))
    core.add_request(EngineCoreRequest("nil", list(b"abc"), {"max_tokens": None}))
    out = run_to_end(core)
    assert len(tokens(out["omitted"])) == 16
    assert len(tokens(out["nil"])) == 64 - 3


def test_sleep_modes_abort_queue_and_freeze_like_vllm():
    core = EngineCore(make_engine_config("echo"))
    core.add_request(request("running", b"ab", max_tokens=50))
    core.step()
    assert core.sleep(1, "abort") is None
    aborted = core.take_pending_outputs()
    assert [(o.request_id, o.finish_reason) for _, o in aborted] == [("running", FinishReason.ABORT)]
    assert core.take_finished(0) == ["running"]
    core.add_request(request("queued", b"cd", max_tokens=2))
    assert not core.has_work() and core.step() == []  # paused: new requests wait
    assert core.wake_up() is True
    assert bytes(tokens(run_to_end(core)["queued"])) == b"cd"

    core.add_request(request("drains", b"ef", max_tokens=3))
    core.step()
    pending = core.sleep(0, "wait")
    assert pending is not None  # answered once nothing runs
    core.add_request(request("later", b"gh", max_tokens=1))
    out = run_to_end(core)
    assert set(out) == {"drains"} and out["drains"][-1].finish_reason == FinishReason.LENGTH
    assert core.scheduler.num_waiting == 1 and core.is_sleeping()


def test_model_directories_are_validated(tmp_path):
    with pytest.raises(ModelPathError, match="not a built-in model .*, a model directory or a .gguf file"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ModelPathError, match="no config.json"):
        resolve_model(str(tmp_path))
    write_model_dir(str(tmp_path), "gpt")
    with pytest.raises(ModelPathError, match="model_type"):
        resolve_model(str(tmp_path))
    spec = resolve_model(write_model_dir(str(tmp_path / "m"), "toy", hidden_size=32, num_layers=1))
    assert (spec.model_type, spec.hparams["hidden_size"], spec.hparams["num_layers"]) == ("toy", 32, 1)


# ---- the toy model ----


@pytest.fixture(scope="module")
def toy_config():
    return make_engine_config("toy", max_model_len=256, max_num_seqs=8)


def test_toy_binds_one_kv_cache_per_layer(toy_config):
    core = EngineCore(toy_config)
    runner = core.runner
    layers = runner.executor.model.attention_layers()
    assert len(runner.executor.kv_caches) == len(layers) == toy_config.model_config.spec.hparams["num_layers"]
    for index, (_, attention) in enumerate(sorted(layers.items())):
        # Bound through the layer's own bind_kv_cache: the tensor itself, as in vLLM 0.33.
        assert attention.kv_cache is runner.executor.kv_caches[index]
        assert runner.executor.kv_caches[index].shape[:3] == (
            2,
            runner.num_gpu_blocks,
            toy_config.cache_config.block_size,
        )


def test_toy_seeded_sampling_is_reproducible_whatever_the_batch(toy_config):
    prompt = b"Once upon a time"
    alone = EngineCore(toy_config)
    alone.add_request(request("s", prompt, max_tokens=24, temperature=0.9, top_p=0.95, top_k=50, seed=1234))
    reference = tokens(run_to_end(alone)["s"])

    batched = EngineCore(toy_config)
    batched.add_request(request("other", b"something else entirely", max_tokens=30, temperature=1.0))
    batched.step()
    batched.add_request(request("s", prompt, max_tokens=24, temperature=0.9, top_p=0.95, top_k=50, seed=1234))
    batched.add_request(request("s2", prompt, max_tokens=24, temperature=0.9, top_p=0.95, top_k=50, seed=99))
    out = run_to_end(batched)
    assert tokens(out["s"]) == reference
    assert tokens(out["s2"]) != reference


def test_toy_top_k_1_is_greedy_and_greedy_is_deterministic(toy_config):
    core = EngineCore(toy_config)
    core.add_request(request("greedy", b"abc", max_tokens=16, temperature=0.0))
    core.add_request(request("topk", b"abc", max_tokens=16, temperature=1.5, top_k=1))
    out = run_to_end(core)
    assert tokens(out["greedy"]) == tokens(out["topk"])


def test_toy_chunked_prefill_and_prefix_cache_do_not_change_the_result():
    prompt = b"The quick brown fox jumps over the lazy dog. " * 3
    plain = EngineCore(make_engine_config("toy", max_model_len=256, enable_prefix_caching=False))
    chunked = EngineCore(make_engine_config("toy", max_model_len=256, max_num_batched_tokens=7, max_num_seqs=2))
    results = []
    for core in (plain, chunked):
        for i in range(3):
            core.add_request(request(f"r{i}", prompt + bytes([65 + i]), max_tokens=20, temperature=0.0))
        results.append({k: tokens(v) for k, v in run_to_end(core).items()})
    assert results[0] == results[1]
    assert chunked.scheduler.kv_cache_manager.block_pool.hits > 0
    assert chunked.call_utility("reset_prefix_cache", []) is True
    chunked.add_request(request("again", prompt, max_tokens=1, temperature=0.0))
    hits_before = chunked.scheduler.kv_cache_manager.block_pool.hits
    run_to_end(chunked)
    assert chunked.scheduler.kv_cache_manager.block_pool.hits == hits_before  # nothing cached any more


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # the Rust decode kernel; torch's masked batch
def test_attention_reads_only_the_slots_its_sequences_wrote(dtype):
    """The KV cache is not zeroed (its pages become resident when written):
    a slot that no live sequence wrote may hold anything, NaN included. With
    every slot NaN once the warm-up request is gone, a batch of a short and
    a long sequence (the short one padded in the decode batch) generates
    what it generates over an untouched cache."""
    config = make_engine_config("toy", max_model_len=256, max_num_seqs=8, dtype=dtype, enable_prefix_caching=False)

    def generate(poison: bool) -> dict[str, list[int]]:
        core = EngineCore(config)
        core.add_request(request("warm-up", b"the first blocks", max_tokens=4, temperature=0.0))
        run_to_end(core)
        if poison:
            for cache in core.runner.executor.kv_caches:
                cache.fill_(math.nan)
        core.add_request(request("short", b"Hi", max_tokens=12, temperature=0.0))
        core.add_request(
            request(
                "long",
                b"A prompt longer than two blocks of the cache, to pad the other",
                max_tokens=12,
                temperature=0.0,
            )
        )
        return {k: tokens(v) for k, v in run_to_end(core).items()}

    assert generate(poison=True) == generate(poison=False)


def test_runner_keeps_its_own_state_of_each_request_until_it_finishes(toy_config):
    """The runner's state of a request (its seeded generator, the prompt
    positions scored) is made when the request is first scheduled and
    dropped once a plan says it finished or was aborted."""
    core = EngineCore(toy_config)
    core.add_request(request("seeded", b"hello", max_tokens=3, temperature=1.0, seed=7))
    core.add_request(request("aborted", b"world", max_tokens=100, prompt_logprobs=1))
    core.step()
    states = core.runner.requests
    assert set(states) == {"seeded", "aborted"}
    assert states["seeded"].generator is not None and states["aborted"].generator is None
    assert states["aborted"].num_prompt_scored == len(b"world") - 1
    core.abort_requests(["aborted"])
    run_to_end(core)
    assert "aborted" not in core.runner.requests
    core.step()  # nothing to compute; the plan still tells the runner "seeded" finished
    assert core.runner.requests == {}


def test_toy_abort_frees_the_blocks(toy_config):
    core = EngineCore(toy_config)
    pool = core.scheduler.kv_cache_manager.block_pool
    free = pool.num_free_blocks
    core.add_request(request("a", b"hello", max_tokens=100))
    core.step()
    assert pool.num_free_blocks < free
    assert core.abort_requests(["a", "unknown"]) == 1
    assert pool.num_free_blocks == free and not core.has_work()


def test_freed_blocks_are_reused_before_blocks_never_used():
    """A freed block's pages are resident already; a never-used one's are
    not until written: the pool hands out freed ones first."""
    from vllm_rs.engine.kv_cache.block_pool import BlockPool

    pool = BlockPool(16, enable_caching=True)
    first = pool.allocate([], 3)
    pool.release(first)
    assert pool.num_free_blocks == 16 and pool.can_allocate([], 16) and not pool.can_allocate([], 17)
    second = pool.allocate([], 4)
    assert set(first) < set(second) and pool.num_blocks_ever_used == 4
    assert pool.num_free_blocks == 12 and pool.usage == 0.25
    everything = pool.allocate([], 12)
    assert sorted(second + everything) == list(range(16)) and pool.num_free_blocks == 0


def test_requests_one_after_another_write_only_the_blocks_one_of_them_needs(toy_config):
    """Ten requests with different prompts, one after the other: the blocks
    ever written are what one request held (+ its prefix-cache neighbours),
    not the pool, whose never-used blocks stay untouched memory."""
    core = EngineCore(toy_config)
    pool = core.scheduler.kv_cache_manager.block_pool
    block_size = toy_config.cache_config.block_size
    for i in range(10):
        core.add_request(request(f"r{i}", bytes([65 + i]) * 40, max_tokens=24, temperature=0.0))
        run_to_end(core)
    assert pool.num_free_blocks == pool.num_blocks
    assert pool.num_blocks_ever_used <= -(-(40 + 24) // block_size) + 1 < pool.num_blocks


# ---- the engine process over ZeroMQ ----


def read_message(frames: list[bytes]) -> SimpleNamespace:
    """What the fake frontend reads of one output-socket message: the stats,
    each output's request id, new token ids and finish reason, and a utility reply."""
    items = unpack(frames[0])
    utility = items[4] if len(items) > 4 else None
    outputs = [
        SimpleNamespace(
            request_id=o[0],
            new_token_ids=o[1] or [],
            finish_reason=None if len(o) < 6 or o[5] is None else FinishReason(o[5]),
        )
        for o in items[1] or []
    ]
    reply = None if utility is None else UtilityOutput(utility[0], utility[1], utility[2] and utility[2][1])
    return SimpleNamespace(scheduler_stats=items[2], outputs=outputs, utility_output=reply)


class FakeFrontend:
    """One client: a ROUTER and a PULL adopted from listeners, like a frontend."""

    def __init__(self, ctx: zmq.Context, index: int):
        self.index = index
        self.input = make_zmq_listener("tcp://127.0.0.1:0", zmq.ROUTER)
        self.output = make_zmq_listener("tcp://127.0.0.1:0", zmq.PULL)
        self.addresses = ClientAddresses(self.input.address, self.output.address)
        self.skipped: list = []  # messages `call` passed over
        self.router = make_zmq_socket(ctx, self.input.address, zmq.ROUTER, linger=0, listener=self.input)
        self.pull = make_zmq_socket(ctx, self.output.address, zmq.PULL, linger=0, listener=self.output)

    def registration(self, timeout_s: float = 60):
        assert self.router.poll(timeout_s * 1000), "the engine did not register"
        identity, payload = self.router.recv_multipart()
        return identity, decode_registration(payload)

    def send(self, kind: bytes, payload: bytes, engine: int = 0) -> None:
        self.router.send_multipart([engine_identity(engine), kind, payload])

    def receive(self, timeout_s: float = 30):
        assert self.pull.poll(timeout_s * 1000), "no message from the engine"
        return self.pull.recv_multipart()

    def collect(self, request_id: str, timeout_s: float = 30):
        """Outputs of one request until it finishes, and every stats map seen."""
        outputs, stats = [], []
        while True:
            message = read_message(self.receive(timeout_s))
            stats.append(message.scheduler_stats)
            outputs += [o for o in message.outputs if o.request_id == request_id]
            if outputs and outputs[-1].finish_reason is not None:
                return outputs, stats

    def call(self, call_id: int, method: str, *args):
        """The reply to a utility call (request outputs meanwhile are skipped)."""
        self.send(REQUEST_UTILITY, encode_utility(self.index, call_id, method, list(args)))
        while (message := read_message(self.receive())).utility_output is None:
            self.skipped.append(message)
        reply = message.utility_output
        assert reply.call_id == call_id
        return reply

    def wait_for_idle_stats(self, timeout_s: float = 10):
        """The first stats-only message saying nothing runs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = self.skipped.pop(0) if self.skipped else read_message(self.receive(timeout_s))
            stats = message.scheduler_stats
            if not message.outputs and stats is not None and stats["num_running_reqs"] == 0:
                return stats
        raise AssertionError("the engine never said it was idle")

    def close(self) -> None:
        self.router.close(linger=0)
        self.pull.close(linger=0)


@pytest.fixture
def frontends():
    ctx = zmq.Context()
    pair = [FakeFrontend(ctx, 0), FakeFrontend(ctx, 1)]
    yield pair
    for f in pair:
        f.close()
    ctx.term()


def start_engine(frontends, model: str = "echo", **config):
    engine_config = make_engine_config(model, clients=[f.addresses for f in frontends], **config)
    return CoreEngineProcManager(
        run_engine_core, 1, 0, 0, engine_config, True, frontends[0].addresses.input_address, None, True
    )


def test_engine_process_serves_two_clients(frontends):
    manager = start_engine(frontends)
    try:
        for frontend in frontends:
            identity, registration = frontend.registration()
            assert identity == engine_identity(0)
            assert registration.max_model_len == 8192 and registration.num_gpu_blocks == 0
        first, second = frontends
        add = request("r1", b"hi there", max_tokens=5)
        add.client_index = 1
        second.send(REQUEST_ADD, encode_add(add))
        outputs, stats = second.collect("r1")
        assert bytes(tokens(outputs)) == b"hi th" and outputs[-1].finish_reason == FinishReason.LENGTH
        assert all(s is not None and "num_running_reqs" in s and "num_waiting_reqs" in s for s in stats)
        assert not first.pull.poll(200)  # client 0 gets nothing of client 1's request

        assert first.call(7, "reset_prefix_cache").result is True
        assert first.call(8, "sleep", 1).failure_message is None
        assert first.call(9, "wake_up", None).failure_message is None
        assert first.call(10, "get_stats").result["requests_finished"] == 1
        assert "no utility method" in second.call(11, "no_such_method").failure_message

        long_request = request("long", b"ab", max_tokens=1_000_000)
        first.send(REQUEST_ADD, encode_add(long_request))
        first.receive()
        first.send(REQUEST_ABORT, encode_abort(["long"]))
        assert first.call(12, "get_stats").result["requests_aborted"] == 1
        assert first.wait_for_idle_stats()["num_waiting_reqs"] == 0
    finally:
        manager.shutdown(timeout=10)
    assert manager.processes[0].exitcode == 0  # SIGTERM is a clean exit


def test_sleep_wait_is_answered_once_the_running_requests_finished(frontends):
    manager = start_engine(frontends)
    try:
        first = frontends[0]
        first.registration()
        first.send(REQUEST_ADD, encode_add(request("drains", b"abc", max_tokens=40)))
        read_message(first.receive())  # it runs
        first.send(REQUEST_UTILITY, encode_utility(0, 21, "sleep", [0, "wait"]))
        first.send(REQUEST_ADD, encode_add(request("queued", b"q", max_tokens=1)))
        seen, reply = [], None
        while reply is None:
            message = read_message(first.receive())
            if message.utility_output is not None:
                reply = message.utility_output
            seen += [(o.request_id, o.finish_reason) for o in message.outputs]
        assert reply.call_id == 21 and reply.failure_message is None
        assert seen[-1] == ("drains", FinishReason.LENGTH) and "queued" not in {i for i, _ in seen}
        assert first.call(22, "wake_up", None).result is True
        assert bytes(tokens(first.collect("queued")[0])) == b"q"
    finally:
        manager.shutdown(timeout=10)


def test_engine_failure_sends_engine_core_dead_to_every_client(frontends, monkeypatch):
    monkeypatch.setenv(FAIL_AT_STEP_ENV, "1")
    manager = start_engine(frontends)
    try:
        for frontend in frontends:
            frontend.registration()
        frontends[0].send(REQUEST_ADD, encode_add(request("doomed", b"x", max_tokens=3)))
        for frontend in frontends:
            assert frontend.receive() == [ENGINE_CORE_DEAD]
        manager.processes[0].join(30)
        assert manager.processes[0].exitcode == 1
    finally:
        manager.shutdown(timeout=5)


def test_engine_ignores_sigint_and_stops_on_sigterm(frontends):
    manager = start_engine(frontends)
    try:
        frontends[0].registration()
        proc = manager.processes[0]
        os.kill(proc.pid, signal.SIGINT)
        # The signal is pending or discarded once kill() returns: the engine
        # serving a request after it has had it, and lived.
        frontends[0].send(REQUEST_ADD, encode_add(request("after", b"ok", max_tokens=2)))
        assert bytes(tokens(frontends[0].collect("after")[0])) == b"ok"
        assert proc.is_alive()
    finally:
        manager.shutdown(timeout=10)
    assert manager.processes[0].exitcode == 0


def test_engine_stops_on_sigterm_delivered_to_another_thread(frontends):
    # kill() lets the kernel pick any thread not blocking the signal; send it
    # to such a thread on purpose, as the kernel sometimes does.
    manager = start_engine(frontends)
    try:
        frontends[0].registration()
        proc = manager.processes[0]
        signal_another_thread(proc.pid, signal.SIGTERM)
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        manager.shutdown(timeout=5)


# ---- vLLM 0.33 on the wire: the golden fixtures (scripts/make_vllm_fixtures.py) ----

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.33"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


def fixture(name: str):
    return unpack((FIXTURES / f"{name}.msgpack").read_bytes())


def fixtures_of_kind(kind: str) -> list[str]:
    return sorted(n.removesuffix(".msgpack") for n, f in MANIFEST["files"].items() if f["kind"] == kind)


def assert_same_shape(ours, theirs, path: str = "$") -> None:
    """Same map keys and array lengths all the way down, and the same types
    wherever both sides hold a value (nil is allowed where vLLM's field is
    optional, which the fixture cannot tell: both sides may hold either)."""
    if ours is None or theirs is None:
        return
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), f"{path}: a map in vLLM, {type(ours).__name__} here"
        assert set(ours) == set(theirs), f"{path}: keys differ: {set(ours) ^ set(theirs)}"
        for key in theirs:
            assert_same_shape(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list), f"{path}: an array in vLLM, {type(ours).__name__} here"
        for index, (mine, vllms) in enumerate(zip(ours, theirs)):
            assert_same_shape(mine, vllms, f"{path}[{index}]")
    else:
        assert type(ours) is type(theirs), f"{path}: {type(theirs).__name__} in vLLM, {type(ours).__name__} here"


def test_the_fixtures_come_from_vllm_0_33():
    assert MANIFEST["vllm_version"] == "0.33.0"
    assert {f["kind"] for f in MANIFEST["files"].values()} >= {"ready_response", "outputs", "request", "utility_call"}


@pytest.mark.parametrize("model", ["echo", "toy"])
def test_ready_response_has_every_field_of_vllms(model):
    core = EngineCore(make_engine_config(model, max_model_len=256))
    ours, theirs = unpack(encode_ready_response(core.ready_response())), fixture("ready_response")
    assert list(ours) == list(theirs)  # every field, in vLLM's order
    assert_same_shape(ours, theirs)
    required = ("max_model_len", "num_gpu_blocks", "block_size", "dtype", "vllm_version", "instance_id", "max_num_seqs")
    assert all(ours[key] is not None for key in required)
    assert (ours["max_model_len"], ours["vllm_version"]) == (256, "0.33.0")
    assert decode_registration(encode_ready_response(core.ready_response())).max_model_len == 256


def our_messages() -> dict[str, list]:
    """The engine's own messages, one per fixture kind, from a real EngineCore."""
    core = EngineCore(make_engine_config("echo", max_model_len=32))
    messages = {}

    def batch(outputs, stats=True, finished_client=0):
        finished = core.take_finished(finished_client) or None
        stats_map = core.scheduler_stats().to_wire() if stats else None
        return unpack(encode_outputs(EngineCoreOutputs(0, outputs, stats_map, finished_requests=finished)))

    core.add_request(request("r1", b"Hi!", max_tokens=3, stop_token_ids=[7]))
    messages["outputs_first_token_events"] = batch([o for _, o in core.step()])
    messages["outputs_tokens"] = batch([o for _, o in core.step()])
    last = [o for _, o in core.step()]
    messages["outputs_finish_length"] = batch(last)
    core.add_request(request("s", [7], max_tokens=5, stop_token_ids=[7]))
    messages["outputs_finish_stop_token"] = batch([o for _, o in core.step()])
    core.add_request(request("e", [256], max_tokens=5, _eos_token_id=256))
    messages["outputs_finish_eos"] = batch([o for _, o in core.step()])
    messages["outputs_request_error"] = batch([core.add_request(request("bad", b"x" * 40))], stats=False)
    messages["outputs_request_error_sampling"] = batch(
        [core.add_request(request("bad2", b"x", logprobs=-2))], stats=False
    )
    core.add_request(request("r2", b"ab", max_tokens=9))
    core.step()
    core.sleep(1, "abort")
    messages["outputs_abort"] = batch([o for _, o in core.take_pending_outputs()], stats=False)
    messages["outputs_scheduler_stats"] = batch([])
    for name, result in (("outputs_utility_result", True), ("outputs_utility_none", None)):
        messages[name] = unpack(encode_outputs(EngineCoreOutputs(0, utility_output=UtilityOutput(5, result=result))))
    failure = UtilityOutput(7, failure_message="Call to nope method failed: engine core has no utility method 'nope'")
    messages["outputs_utility_failure"] = unpack(encode_outputs(EngineCoreOutputs(0, utility_output=failure)))
    return messages


# Not made by this engine: wave messages (engines without a coordinator send
# none), and the retryable error of a paused vLLM engine (this engine queues
# requests while paused, as vLLM's "keep" mode does, and never refuses them).
NOT_MADE_HERE = ("outputs_wave_complete", "outputs_request_error_paused")


@pytest.mark.parametrize("name", [n for n in fixtures_of_kind("outputs") if n not in NOT_MADE_HERE])
def test_every_message_kind_the_engine_sends_has_vllms_shape(name):
    ours, theirs = our_messages()[name], fixture(name)
    assert len(ours) == len(theirs) == 9
    assert len(ours[1]) >= 1 or len(theirs[1]) == 0
    for mine in ours[1]:  # vLLM's decoder fills in trailing defaults
        assert 2 <= len(mine) <= len(theirs[1][0]) == 19
    assert_same_shape(ours, theirs)
    # Set where vLLM sets them: the utility reply exactly; stats and
    # finished_requests at least (the engine sends them with every batch).
    assert (ours[4] is None) == (theirs[4] is None), f"utility_output of {name}"
    for index in (2, 5):
        assert theirs[index] is None or ours[index] is not None, f"slot {index} of {name}"
    if theirs[1]:
        mine, vllms = ours[1][0] + [None] * (19 - len(ours[1][0])), theirs[1][0]
        for slot in (5, 18):  # finish_reason, error
            assert (mine[slot] is None) == (vllms[slot] is None), f"output slot {slot} of {name}"
        assert vllms[7] is None or mine[7] is not None, f"events of {name}"
    assert isinstance(ours[3], float) and ours[3] <= time.monotonic()  # monotonic, like vLLM's


@pytest.mark.parametrize("name", fixtures_of_kind("request"))
def test_every_request_encoded_by_vllm_is_honoured(name):
    expect = MANIFEST["files"][f"{name}.msgpack"]["expect"]
    wire = EngineCoreRequest.from_wire(fixture(name))
    sampling = SamplingParams.from_wire(wire.sampling_params)
    for key, value in expect.items():
        got = getattr(sampling, key)
        assert (list(got) if isinstance(got, tuple) else got) == value, key
    assert sampling.eos_token_id == 256 and wire.external_req_id is not None
    core = EngineCore(make_engine_config("echo", max_model_len=64))
    assert core.add_request(wire) is None
    produced = tokens(run_to_end(core)[wire.request_id])
    room = 64 - len(wire.prompt_token_ids)
    if not sampling.stop_token_ids:
        assert len(produced) == min(expect["max_tokens"] or room, room)


#: What each utility call of vLLM's fixtures answers on a fresh engine, and
#: whether the engine is asleep (paused) afterwards.
UTILITY_EFFECTS = {
    "utility_get_supported_tasks": (["generate"], False),
    "utility_is_sleeping": (False, False),
    "utility_reset_prefix_cache": (True, False),
    "utility_sleep": (None, True),
    "utility_sleep_level0_keep": (None, True),
    "utility_wake_up": (True, False),
    "utility_wake_up_tags": (True, False),
}


@pytest.mark.parametrize("name", fixtures_of_kind("utility_call"))
def test_every_utility_call_encoded_by_vllm_is_answered(name):
    call = UtilityCall.from_wire(fixture(name))
    core = EngineCore(make_engine_config("echo"))
    if call.method == "wake_up":
        core.sleep(1, "abort")  # something to wake up from
    result = core.call_utility(call.method, call.args)
    assert (result, core.is_sleeping()) == UTILITY_EFFECTS[name]
    assert unpack(pack([None, result])) == [None, result]  # the result travels as msgpack


def test_outputs_carry_events_and_errors_on_the_wire():
    core = EngineCore(make_engine_config("echo", max_model_len=8))
    core.add_request(request("a", b"xy", max_tokens=1))
    error = core.add_request(request("bad", b"x" * 8))
    frame = encode_outputs(EngineCoreOutputs(0, [o for _, o in core.step()] + [error]))
    first, rejected = unpack(frame)[1]
    assert (first[0], rejected[0]) == ("a", "bad")
    # Events (slot 7) and the error (slot 18) are what vLLM's frontend reads.
    assert [e["type"] for e in first[7]] == [EngineCoreEventType.QUEUED, EngineCoreEventType.SCHEDULED]
    assert rejected[18]["code"] == "validation_error" and rejected[5] == FinishReason.ERROR


def test_the_registration_reader_reads_vllms_ready_response():
    registration = decode_registration((FIXTURES / "ready_response.msgpack").read_bytes())
    assert (registration.max_model_len, registration.num_gpu_blocks, registration.dp_stats_address) == (2048, 512, None)


# ---- logprobs, in vLLM 0.33's layout (column 0 the scored token, then the top k) ----


def test_echo_logprobs_are_deterministic_and_prompt_logprobs_come_with_the_first_token():
    core = EngineCore(make_engine_config("echo", max_model_len=64))
    prompt = b"Hello"
    core.add_request(request("r", prompt, max_tokens=3, logprobs=2, prompt_logprobs=1))
    outputs = run_to_end(core)["r"]
    first, *rest = outputs
    prompt_rows = first.new_prompt_logprobs
    assert prompt_rows.token_ids[:, 0].tolist() == list(prompt[1:])  # the first prompt token has none
    assert prompt_rows.token_ids.shape == (len(prompt) - 1, 2) and prompt_rows.ranks.tolist() == [1] * 4
    assert all(o.new_prompt_logprobs is None for o in rest)
    for output in outputs:
        (token,) = output.new_token_ids
        rows = output.new_logprobs
        assert rows.token_ids.tolist() == [[token, token, (token + 1) % 257]]
        assert rows.logprobs[0].tolist() == pytest.approx([-math.log(2), -math.log(2), -2 * math.log(2)])
        assert rows.ranks.tolist() == [1]
    whole = EngineCore(make_engine_config("echo", max_model_len=64))
    whole.add_request(request("v", b"ab", max_tokens=1, logprobs=-1))
    (only,) = run_to_end(whole)["v"]
    assert only.new_logprobs.token_ids.shape == (1, 258)  # the scored token, then all 257
    assert sum(math.exp(x) for x in only.new_logprobs.logprobs[0, 1:]) == pytest.approx(1.0)


def test_outputs_without_logprobs_stay_two_slots_and_logprobs_round_trip_the_wire():
    core = EngineCore(make_engine_config("echo", max_model_len=64))
    core.add_request(request("plain", b"xy", max_tokens=2))
    core.add_request(request("lp", b"xy", max_tokens=2, logprobs=3, prompt_logprobs=0))
    sent = [o for _, o in core.step()]
    wire = unpack(encode_outputs(EngineCoreOutputs(0, sent)))[1]
    by_id = {items[0]: items for items in wire}
    assert by_id["plain"][2:4] in ([], [None, None])  # events may ride along, never logprobs
    assert by_id["lp"][2] is not None and by_id["lp"][3] is not None
    (original,) = [o for o in sent if o.request_id == "lp"]
    for decoded, sent_rows in (
        (LogprobsRows.from_wire(by_id["lp"][2]), original.new_logprobs),
        (LogprobsRows.from_wire(by_id["lp"][3]), original.new_prompt_logprobs),
    ):
        for field in ("token_ids", "logprobs", "ranks"):
            assert getattr(decoded, field).tolist() == getattr(sent_rows, field).tolist()


def test_invalid_logprobs_values_are_refused():
    core = EngineCore(make_engine_config("echo", max_model_len=64))
    error = core.add_request(request("bad", b"x", logprobs=-2))
    assert error.finish_reason == FinishReason.ERROR and "logprobs" in error.error.message


def test_toy_logprobs_are_the_models_raw_distribution(toy_config):
    import torch

    core = EngineCore(toy_config)
    prompt = b"The quick brown fox"
    core.add_request(request("g", prompt, max_tokens=4, temperature=0.0, logprobs=5, prompt_logprobs=3))
    core.add_request(request("t", prompt, max_tokens=4, temperature=1.7, seed=3, logprobs=-1))
    out = run_to_end(core)
    for output in out["g"]:
        rows = output.new_logprobs
        (token,) = output.new_token_ids
        # Greedy: the sampled token is the most likely one, and first among the top 5.
        assert rows.token_ids[0, 0] == rows.token_ids[0, 1] == token and rows.ranks.tolist() == [1]
        assert list(rows.logprobs[0, 1:]) == sorted(rows.logprobs[0, 1:], reverse=True)
    for output in out["t"]:
        rows = output.new_logprobs
        assert rows.token_ids.shape == (1, 258)
        # Raw logprobs (before temperature): a full distribution, whatever was sampled.
        assert torch.tensor(rows.logprobs[0, 1:]).exp().sum().item() == pytest.approx(1.0, abs=1e-4)
        scored = rows.logprobs[0, 0]
        assert rows.ranks[0] == int((rows.logprobs[0, 1:] >= scored).sum())
    # Prompt logprobs do not depend on chunking, and the prefix cache is not read for them.
    chunked = EngineCore(make_engine_config("toy", max_model_len=256, max_num_batched_tokens=5, max_num_seqs=2))
    chunked.add_request(request("warm", prompt, max_tokens=1, temperature=0.0))
    run_to_end(chunked)
    chunked.add_request(request("g", prompt, max_tokens=4, temperature=0.0, logprobs=5, prompt_logprobs=3))
    again = run_to_end(chunked)["g"][0].new_prompt_logprobs
    reference = out["g"][0].new_prompt_logprobs
    assert again.token_ids.tolist() == reference.token_ids.tolist()
    assert again.token_ids[:, 0].tolist() == list(prompt[1:])
    assert again.logprobs.ravel().tolist() == pytest.approx(reference.logprobs.ravel().tolist(), abs=1e-5)
