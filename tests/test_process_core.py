"""The Rust process core through its Python face: spawning, fd inheritance,
handles, exec failures, kill-tree on hard trees, waiting on many sentinels."""

from __future__ import annotations

import errno
import multiprocessing
import os
import select
import signal
import socket
import sys
import time
from multiprocessing import connection

import pytest
from vllm_rs import _core
from vllm_rs.process.core import kill_process_tree, spawn_executable, start_target, wait

from tests.support.trees import TREE_SCRIPT, descendants, is_running, read_pids, survivors, wait_built
from tests.support.wait import wait_until


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_child_gets_exactly_the_given_fds_at_the_same_numbers(tmp_path):
    keep_r, keep_w = os.pipe()
    leak_r, leak_w = os.pipe()
    os.set_inheritable(leak_w, True)  # inheritable, but not passed: must not leak
    out_r, out_w = os.pipe()
    script = f"ls /proc/$$/fd > {tmp_path}/fds; echo through >&{keep_w}"
    proc = spawn_executable(["bash", "-c", script], name="fds", pass_fds=[keep_w, out_w])
    proc.join(10)
    os.close(keep_w)
    os.close(out_w)
    assert proc.exitcode == 0
    assert _read_all(keep_r) == b"through\n"
    listed = sorted(int(x) for x in (tmp_path / "fds").read_text().split())
    # stdio, the two passed fds, and the fd `ls` opened on /proc/PID/fd... of
    # the shell: `ls` runs as a child, so the shell's own table is listed.
    assert listed == sorted({0, 1, 2, keep_w, out_w})
    for fd in (keep_r, leak_r, leak_w, out_r):
        os.close(fd)


def test_env_cwd_and_exit_code(tmp_path):
    out = tmp_path / "out"
    proc = spawn_executable(
        ["sh", "-c", f'printf "%s|%s" "$GREETING" "$PWD" > {out}; exit 7'],
        name="envcwd",
        env={"GREETING": "hi", "PATH": os.environ["PATH"]},
        cwd=tmp_path,
    )
    proc.join(10)
    assert proc.exitcode == 7
    assert out.read_text() == f"hi|{tmp_path}"


def test_exec_failures_name_the_path_and_leave_nothing_running(tmp_path):
    guardian = _guardian_pid_after_warmup()
    before = set(descendants(guardian))
    with pytest.raises(FileNotFoundError) as missing:
        spawn_executable([str(tmp_path / "no-such-program")], name="x")
    assert str(tmp_path / "no-such-program") in str(missing.value)
    with pytest.raises(FileNotFoundError, match="no-such-command-anywhere"):
        spawn_executable(["no-such-command-anywhere"], name="x")
    not_executable = tmp_path / "data.txt"
    not_executable.write_text("not a program")
    with pytest.raises(PermissionError) as denied:
        spawn_executable([str(not_executable)], name="x")
    assert str(not_executable) in str(denied.value)
    with pytest.raises(OSError, match="fd 987"):
        spawn_executable(["true"], name="x", pass_fds=[987])
    with pytest.raises(FileNotFoundError, match="nowhere"):
        spawn_executable(["true"], name="x", cwd=tmp_path / "nowhere")
    with pytest.raises(NotADirectoryError, match="data.txt"):
        spawn_executable(["true"], name="x", cwd=not_executable)
    with pytest.raises(ValueError, match="argv is empty"):
        spawn_executable([], name="x")
    assert set(descendants(guardian)) == before


def test_os_failures_carry_errno_and_filename(tmp_path):
    from vllm_rs.process.core import remove_on_exit

    missing = tmp_path / "no-such-program"
    with pytest.raises(FileNotFoundError) as err:
        spawn_executable([str(missing)], name="x")
    assert (err.value.errno, err.value.filename) == (errno.ENOENT, str(missing))
    data = tmp_path / "data.txt"
    data.write_text("not a program")
    with pytest.raises(PermissionError) as err:
        spawn_executable([str(data)], name="x")
    assert (err.value.errno, err.value.filename) == (errno.EACCES, str(data))
    with pytest.raises(NotADirectoryError) as err:
        spawn_executable(["true"], name="x", cwd=data)
    assert (err.value.errno, err.value.filename) == (errno.ENOTDIR, str(data))
    with pytest.raises(OSError) as err:
        spawn_executable(["true"], name="x", pass_fds=[987])
    assert err.value.errno == errno.EBADF and "fd 987" in str(err.value)
    with pytest.raises(FileNotFoundError) as err:
        remove_on_exit(tmp_path / "missing.sock")
    assert (err.value.errno, err.value.filename) == (errno.ENOENT, str(tmp_path / "missing.sock"))
    proc = spawn_executable(["sleep", "100"], name="sleeper")
    try:
        with pytest.raises(OSError) as err:
            proc.send_signal(1000)  # no such signal
        assert err.value.errno == errno.EINVAL and f"process {proc.pid}" in str(err.value)
    finally:
        proc.kill()
        proc.join(10)


GUARDIAN_THAT_CANNOT_START = """
import json, sys
from vllm_rs import _core
_core.set_guardian_command([sys.argv[1]])
try:
    _core.spawn(["true"], name="x")
except RuntimeError as e:
    cause = e.__cause__
    print(json.dumps([str(e), type(cause).__name__, getattr(cause, "errno", None)]))
"""


@pytest.mark.parametrize(
    "command, message, cause, code",
    [
        ("/no/such/guardian", "cannot start it", "FileNotFoundError", errno.ENOENT),
        ("/bin/true", "exited during start-up", "NoneType", None),
    ],
)
def test_a_guardian_that_cannot_start_is_a_runtime_error_with_its_os_cause(command, message, cause, code):
    import json
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", GUARDIAN_THAT_CANNOT_START, command],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    text, cause_type, cause_errno = json.loads(out.stdout)
    assert message in text and (cause_type, cause_errno) == (cause, code), out


def test_spawn_many_takes_typed_requests():
    requests = [_core.SpawnRequest(["sh", "-c", f"exit {i}"], name=f"r{i}") for i in range(3)]
    requests.append(_core.SpawnRequest(["no-such-command-anywhere"], name="missing", env=[("PATH", "/nowhere")]))
    assert (requests[0].argv, requests[0].name, requests[0].env, requests[0].pass_fds) == (
        ["sh", "-c", "exit 0"],
        "r0",
        None,
        [],
    )
    outcomes = _core.spawn_many(requests)
    for proc in outcomes[:3]:
        proc.join(30)
    assert [p.exitcode for p in outcomes[:3]] == [0, 1, 2]
    assert isinstance(outcomes[3], FileNotFoundError) and outcomes[3].filename == "no-such-command-anywhere"
    with pytest.raises(TypeError, match="SpawnRequest"):
        _core.spawn_many([(["true"], "x", None, None, [], [])])
    # hold_fds get one owner: the same fds twice, or a second start, are refused before anything starts.
    r, w = os.pipe()
    holding = _core.SpawnRequest(["true"], name="holder", hold_fds=[w])
    with pytest.raises(ValueError, match=f"fd {w} is in hold_fds twice"):
        _core.spawn_many([holding, holding])
    (proc,) = _core.spawn_many([holding])
    proc.join(30)
    proc.close()  # closes w
    assert select.select([r], [], [], 30)[0] == [r] and os.read(r, 1) == b""  # the only write end is gone
    os.close(r)
    with pytest.raises(ValueError, match="already started a process"):
        _core.spawn_many([holding])
    with pytest.raises(TypeError, match="name"):
        _core.SpawnRequest(["true"])


def _guardian_pid_after_warmup() -> int:
    spawn_executable(["true"], name="warmup").join(10)
    pid = _core.guardian_pid()
    assert pid is not None
    return pid


def test_handle_surface_signals_and_no_zombies():
    proc = spawn_executable(["sleep", "100"], name="sleeper")
    assert proc.name == "sleeper" and proc.pid > 0 and proc.ident == proc.pid
    assert proc.is_alive() and proc.exitcode is None
    proc.join(0.05)
    assert proc.is_alive()
    assert select.select([proc.sentinel], [], [], 0)[0] == []
    proc.terminate()
    proc.join(10)
    assert not proc.is_alive()
    assert proc.exitcode == -signal.SIGTERM
    assert select.select([proc.sentinel], [], [], 0)[0] == [proc.sentinel]
    # Reaped by the guardian: no zombie anywhere, and the pid is gone.
    assert not os.path.exists(f"/proc/{proc.pid}")
    proc.kill()  # signalling an exited process is a no-op
    proc.close()
    assert "stopped exitcode=-15" in repr(proc)


def test_close_refuses_a_running_process():
    proc = spawn_executable(["sleep", "100"], name="sleeper")
    with pytest.raises(ValueError, match="still running"):
        proc.close()
    proc.kill()
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL


def test_join_releases_the_gil():
    import threading

    proc = spawn_executable(["sleep", "1"], name="sleeper")
    ticks = 0
    done = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    proc.join()
    done.set()
    counter.join()
    assert proc.exitcode == 0
    assert ticks > 50  # the other thread ran while join() waited


def test_sentinels_mix_with_multiprocessing_connections_and_pipes():
    proc = spawn_executable(["sleep", "0.3"], name="sleeper")
    recv, send = multiprocessing.Pipe(duplex=False)
    pipe_r, pipe_w = os.pipe()
    objects = [proc.sentinel, recv, pipe_r]
    assert wait(objects, timeout=0.01) == []
    send.send("x")
    assert wait(objects, timeout=5) == [recv]
    recv.recv()
    os.write(pipe_w, b"y")
    assert wait(objects, timeout=5) == [pipe_r]
    os.read(pipe_r, 1)
    assert wait(objects, timeout=10) == [proc.sentinel]
    # The standard library's wait works on our sentinel too.
    assert connection.wait([proc.sentinel, recv], timeout=5) == [proc.sentinel]
    for fd in (pipe_r, pipe_w):
        os.close(fd)
    send.close()
    recv.close()


def _target_writes(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(f"{value}|{multiprocessing.current_process().name}|{os.getpid()}")


def _target_uses_socket(sock: socket.socket) -> None:
    conn, _ = sock.accept()
    conn.sendall(b"from child")
    conn.close()


def test_python_target_runs_with_spawn_semantics(tmp_path):
    out = tmp_path / "out"
    proc = start_target(_target_writes, name="Writer", args=(str(out), "hello"))
    proc.join(60)
    assert proc.exitcode == 0
    value, name, pid = out.read_text().split("|")
    assert (value, name, int(pid)) == ("hello", "Writer", proc.pid)


def test_sockets_in_arguments_arrive_as_inherited_fds():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    proc = start_target(_target_uses_socket, name="SockUser", args=(listener,))
    with socket.create_connection(listener.getsockname(), timeout=60) as client:
        assert client.recv(100) == b"from child"
    proc.join(60)
    assert proc.exitcode == 0
    listener.close()


def test_unpicklable_target_fails_before_starting_anything():
    guardian = _guardian_pid_after_warmup()
    before = set(descendants(guardian))
    with pytest.raises(Exception, match="pickle|local"):
        start_target(lambda: None, name="Lambda")
    assert set(descendants(guardian)) == before


def test_target_exception_gives_exit_code_1():
    proc = start_target(_raise_value_error, name="Raiser")
    proc.join(60)
    assert proc.exitcode == 1


def _raise_value_error() -> None:
    raise ValueError("boom")


@pytest.mark.parametrize("kind", ["idle", "forking", "daemons"])
def test_kill_process_tree_leaves_no_survivor(tmp_path, kind):
    pidfile = tmp_path / "pids"
    root = spawn_executable(["sh", str(TREE_SCRIPT), kind, str(pidfile)], name=f"tree-{kind}")
    members = wait_built(pidfile, kind)
    if kind == "forking":
        # Kill it while it forks: once it has recorded members beyond the first ones.
        wait_until(lambda: len(read_pids(pidfile)) >= 2 * len(members), "the forking tree to grow", 20)
    assert all(is_running(pid) for pid in members)
    kill_process_tree(root.pid)
    root.join(10)
    assert root.exitcode == -signal.SIGKILL
    assert survivors(pidfile) == []


def test_kill_process_tree_of_a_vanished_pid_returns_quietly():
    proc = spawn_executable(["true"], name="gone")
    proc.join(10)
    kill_process_tree(proc.pid)  # gone (or reused by now: then it is not ours)
    with pytest.raises(ValueError):
        _core.kill_process_tree(0)


def test_non_linux_platforms_import_but_refuse_to_spawn(monkeypatch):
    import vllm_rs.utils  # noqa: F401  (import works everywhere)

    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(NotImplementedError, match="needs Linux"):
        spawn_executable(["true"], name="x")
    with pytest.raises(NotImplementedError, match="needs Linux"):
        kill_process_tree(os.getpid())


def test_spawn_executables_starts_many_and_cleans_up_on_failure(tmp_path):
    from vllm_rs.process.core import spawn_executables

    procs = spawn_executables([["sh", "-c", f"exit {i}"] for i in range(40)], names=[f"n{i}" for i in range(40)])
    for proc in procs:
        proc.join(30)
    assert [p.exitcode for p in procs] == list(range(40))
    assert [p.name for p in procs] == [f"n{i}" for i in range(40)]
    guardian = _guardian_pid_after_warmup()
    before = set(descendants(guardian))
    with pytest.raises(FileNotFoundError, match="missing-program"):
        spawn_executables(
            [["sleep", "100"], [str(tmp_path / "missing-program")], ["sleep", "100"]], names=["a", "b", "c"]
        )
    assert set(descendants(guardian)) == before  # the two sleepers were killed


def test_arguments_exec_cannot_carry_are_value_errors():
    with pytest.raises(ValueError, match=r"argv\[1\] contains a NUL byte"):
        spawn_executable(["echo", "a\0b"], name="x")
    with pytest.raises(ValueError, match='illegal environment variable name "A=B"'):
        spawn_executable(["true"], name="x", env={"A=B": "1"})
    with pytest.raises(ValueError, match='"K" contains a NUL byte'):
        spawn_executable(["true"], name="x", env={"K": "v\0"})


def test_threads_spawning_and_joining_at_once_get_their_own_children():
    import threading

    results: dict[int, list[int]] = {}

    def worker(index: int) -> None:
        procs = [spawn_executable(["sh", "-c", f"exit {index * 10 + j}"], name=f"w{index}-{j}") for j in range(10)]
        for proc in procs:
            proc.join(60)
        results[index] = [proc.exitcode for proc in procs]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert results == {i: [i * 10 + j for j in range(10)] for i in range(8)}


@pytest.mark.parametrize("blocking_call", ["wait", "join"])
def test_a_signal_another_thread_takes_still_interrupts_a_wait(blocking_call):
    """A SIGINT the kernel hands to a thread other than the waiting one (here
    the main thread blocks it) never interrupts the main thread's poll;
    Python only notes it for the main thread, as it does for one handled
    just before the poll began (the race that once hung CI in
    `wait_for_completion_or_failure`). The wait must still end with the
    KeyboardInterrupt, not at its timeout."""
    import threading
    from pathlib import Path

    read, write = os.pipe()
    sleeper = spawn_executable([sys.executable, "-c", "import time; time.sleep(600)"], name="sleeper")
    main = threading.get_native_id()

    def interrupt_once_the_main_thread_polls() -> None:
        # Syscall 7 is poll on x86-64, 271 ppoll; either, for whatever libc uses.
        polling = lambda: Path(f"/proc/self/task/{main}/syscall").read_text().split()[0] in ("7", "271")  # noqa: E731
        wait_until(polling, "the main thread to block in poll")
        os.kill(os.getpid(), signal.SIGINT)

    interrupter = threading.Thread(target=interrupt_once_the_main_thread_polls)
    # Python's own handler even where this run started with SIGINT ignored.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        interrupter.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            if blocking_call == "wait":
                wait([read], timeout=20)
            else:
                sleeper.join(timeout=20)
        assert time.monotonic() - started < 15, "ended by its timeout, not by the signal"
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        signal.signal(signal.SIGINT, inherited)
        interrupter.join()
        sleeper.kill()
        sleeper.join()
        os.close(read)
        os.close(write)
