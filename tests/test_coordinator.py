"""The data-parallel coordinator (`vllm_rs.serving.coordinator`): its wave rules on
real engine messages, and the process on its real sockets with real ZeroMQ
peers playing two engines and a frontend."""

from __future__ import annotations

import signal

import msgpack
import pytest
import zmq
from vllm_rs.engine.protocol import REQUEST_START_DP_WAVE, EngineCoreOutputs, ProtocolError, encode_outputs
from vllm_rs.engine.stats import SchedulerStats
from vllm_rs.network_utils import PrivateSocketDir
from vllm_rs.serving.coordinator import Coordinator, CoordinatorListeners, CoordinatorProcManager

from tests.thread_signals import signal_another_thread, wait_for_thread

TIMEOUT_MS = 30_000


def stats(engine: int, running: int, waiting: int) -> list[bytes]:
    wire = SchedulerStats(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=0.5).to_wire()
    return [encode_outputs(EngineCoreOutputs(engine_index=engine, scheduler_stats=wire))]


def wave(engine: int, *, complete: int | None = None, start: int | None = None) -> list[bytes]:
    return [encode_outputs(EngineCoreOutputs(engine_index=engine, wave_complete=complete, start_wave=start))]


def test_counts_are_published_per_engine():
    state = Coordinator(2)
    assert state.on_engine_message(stats(1, running=3, waiting=2)) == (False, None)
    assert msgpack.unpackb(state.published()) == [[[0, 0, 0.0], [2, 3, 0.5]], 0, False]
    assert msgpack.unpackb(state.published(with_counts=False)) == [None, 0, False]


def test_wave_rules_are_vllms():
    state = Coordinator(2)
    # An idle engine got a request: the wave starts, the others are told (not the sender).
    assert state.on_engine_message(wave(1, start=0)) == (True, (0, 1))
    assert (state.current_wave, state.engines_running) == (0, True)
    # Starting the running wave again changes nothing.
    assert state.on_engine_message(wave(0, start=0)) == (False, None)
    # Rank 0 reports the wave complete: next wave, paused.
    assert state.on_engine_message(wave(0, complete=0)) == (True, None)
    assert (state.current_wave, state.engines_running) == (1, False)
    # A stale completion is ignored; a start of the paused current wave runs it.
    assert state.on_engine_message(wave(0, complete=0)) == (False, None)
    assert state.on_engine_message(wave(0, start=1)) == (True, (1, 0))
    # An engine ahead of the coordinator moves it forward.
    assert state.on_engine_message(wave(1, start=4)) == (True, (4, 1))
    assert state.current_wave == 4


@pytest.mark.parametrize(
    "frames, named",
    [
        (wave(2, start=0), "engine index 2"),
        ([b"ENGINE_CORE_DEAD"], "only scheduler stats"),
        ([msgpack.packb([0, [], None, 0.0, [1, None, None], None, None, None, None])], "only scheduler stats"),
        ([msgpack.packb([0, [], None, 0.0, None, None, None, None, None])], "empty outputs message"),
        ([msgpack.packb([0, [["r", [1]]], None, 0.0])], "only scheduler stats"),
        ([msgpack.packb([0, [], {"num_running_reqs": -1}, 0.0])], "num_running_reqs is not a count"),
        ([msgpack.packb([0, [], None, 0.0, None, None, "3"])], "wave_complete is not an integer"),
        ([b"\xc1"], "undecodable"),
    ],
)
def test_messages_that_are_not_counts_or_waves_are_refused(frames, named):
    state = Coordinator(2)
    with pytest.raises(ProtocolError, match=named):
        state.on_engine_message(frames)
    assert (state.current_wave, state.engines_running) == (0, False)


def test_the_process_on_its_sockets():
    """Two engines subscribe (READY only once both have), push counts and
    waves; a frontend subscribed to the front socket sees them published, and
    the other engine gets START_DP_WAVE."""
    socket_dir = PrivateSocketDir()
    listeners = CoordinatorListeners.create(socket_dir)
    manager = CoordinatorProcManager(2, listeners)
    ctx = zmq.Context()
    subs, pushes = [], []
    try:
        frontend = ctx.socket(zmq.XSUB)
        frontend.connect(manager.addresses.front_publish)
        frontend.send(b"\x01")
        for _ in range(2):
            sub = ctx.socket(zmq.XSUB)
            sub.connect(manager.addresses.engine_publish)
            sub.send(b"\x01")
            subs.append(sub)
            push = ctx.socket(zmq.PUSH)
            push.connect(manager.addresses.engine_output)
            pushes.append(push)
        for sub in subs:
            assert sub.poll(TIMEOUT_MS) and sub.recv_multipart() == [b"READY"]

        pushes[1].send_multipart(stats(1, running=1, waiting=4))
        while True:  # published within 100 ms of the change
            assert frontend.poll(TIMEOUT_MS)
            counts, current_wave, running = msgpack.unpackb(frontend.recv())
            if counts is not None and counts[1][:2] == [4, 1]:
                break
        assert (current_wave, running) == (0, False)

        pushes[1].send_multipart(wave(1, start=0))
        assert subs[0].poll(TIMEOUT_MS)
        kind, payload = subs[0].recv_multipart()
        assert (kind, msgpack.unpackb(payload)) == (REQUEST_START_DP_WAVE, [0, 1])
        pushes[0].send_multipart(wave(0, complete=0))
        seen = []
        while seen[-1:] != [[None, 1, False]]:
            assert frontend.poll(TIMEOUT_MS), seen
            seen.append(msgpack.unpackb(frontend.recv()))
        assert [None, 0, True] in seen
    finally:
        ctx.destroy(linger=0)  # closes every socket made here
        manager.shutdown(timeout=5)
        for listener in listeners.all():
            listener.cleanup()
        socket_dir.remove()
    assert manager.proc.exitcode == 0


def test_sigterm_to_another_thread_ends_the_wait_for_engines():
    """The kernel may hand a SIGTERM to any thread that does not block it; one
    handed to a thread other than the main one still ends the coordinator's
    wait for engine subscriptions (a poll without timeout) with exit 0."""
    socket_dir = PrivateSocketDir()
    listeners = CoordinatorListeners.create(socket_dir)
    manager = CoordinatorProcManager(2, listeners)
    try:
        wait_for_thread(manager.proc.pid, "ZMQbg/")  # its sockets exist: the handler is installed
        signal_another_thread(manager.proc.pid, signal.SIGTERM)
        manager.proc.join(TIMEOUT_MS / 1000)
        assert manager.proc.exitcode == 0
    finally:
        manager.shutdown(timeout=5)
        for listener in listeners.all():
            listener.cleanup()
        socket_dir.remove()
