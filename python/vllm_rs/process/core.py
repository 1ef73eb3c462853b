"""Starting and watching processes through the Rust core.

Every child is started by this process's guardian (see `rust/core/src/guardian.rs`):
it inherits exactly the fds it is given, dies when this process dies (SIGKILL
included) and takes its descendants with it. Handles are `vllm_rs._core.Process`
objects with the `multiprocessing.BaseProcess` surface.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from multiprocessing import context as mp_context
from multiprocessing import popen_spawn_posix, reduction
from multiprocessing import spawn as mp_spawn
from typing import Any

from vllm_rs import _core

if hasattr(_core, "Process"):
    Process = _core.Process
else:  # not Linux: nothing can be started, so no handle ever exists

    class Process:  # type: ignore[no-redef]
        """Stand-in for `_core.Process`, which exists only on Linux."""


# Run by the guardian: load this very extension file and enter its loop.
_GUARDIAN_BOOT = (
    "import sys, importlib.util as u\n"
    "spec = u.spec_from_file_location('vllm_rs._core', sys.argv[1])\n"
    "core = u.module_from_spec(spec)\n"
    "spec.loader.exec_module(core)\n"
    "core.guardian_main(int(sys.argv[2]), int(sys.argv[3]))\n"
)
_CHILD_BOOT = "from vllm_rs.process.child_entry import main; main()"
_configured = False


def _require_linux() -> None:
    if not sys.platform.startswith("linux") or not getattr(_core, "SUPPORTED", False):
        raise NotImplementedError(
            f"vllm_rs process management needs Linux (pidfd, prctl, /proc); this is {sys.platform}"
        )


def _configure() -> None:
    global _configured
    _require_linux()
    if not _configured:
        _core.set_guardian_command([sys.executable, "-I", "-S", "-c", _GUARDIAN_BOOT, _core.__file__])
        _configured = True


def spawn_executable(
    argv: Sequence[str | os.PathLike],
    *,
    name: str,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    pass_fds: Iterable[int] = (),
) -> Process:
    """Starts `argv` with exactly `pass_fds` inherited at the same numbers.
    Raises the `OSError` subclass of the failure (`FileNotFoundError`,
    `PermissionError`, ...) with `errno` set and `filename` naming the program
    or working directory, or naming a bad fd in its message; nothing is left
    running on failure."""
    _configure()
    return _core.spawn(
        [os.fsdecode(a) for a in argv],
        name=name,
        env=None if env is None else list(env.items()),
        cwd=None if cwd is None else os.fsdecode(cwd),
        pass_fds=list(pass_fds),
    )


def spawn_executables(
    argvs: Sequence[Sequence[str | os.PathLike]],
    *,
    names: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> list[Process]:
    """Starts many executables at once, pipelining the requests to the
    guardian; same guarantees as `spawn_executable`. If any fails to start,
    the others are killed and the first error is raised."""
    _configure()
    if len(argvs) != len(names):
        raise ValueError(f"spawn_executables: {len(argvs)} commands but {len(names)} names")
    env_items = None if env is None else list(env.items())
    cwd_str = None if cwd is None else os.fsdecode(cwd)
    requests = [
        _core.SpawnRequest([os.fsdecode(a) for a in argv], name=name, env=env_items, cwd=cwd_str)
        for argv, name in zip(argvs, names)
    ]
    outcomes = _core.spawn_many(requests)
    failures = [o for o in outcomes if not isinstance(o, Process)]
    if failures:
        for proc in outcomes:
            if isinstance(proc, Process):
                proc.kill()
                proc.join()
        raise failures[0]
    return outcomes


class _ChildFds:
    """Stands in for multiprocessing's spawning Popen while a target is
    pickled: every fd the pickle needs (sockets, connections, queues) is
    collected so the child inherits it at the same number."""

    DupFd = popen_spawn_posix._DupFd

    def __init__(self) -> None:
        self.fds: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        if fd not in self.fds:
            self.fds.append(fd)
        return fd


class PreparedTarget:
    """A Python callable pickled for a fresh interpreter, with the fds its
    arguments need. Pickling happens here, so a target that cannot be pickled
    fails before any process starts."""

    def __init__(
        self,
        target: Callable[..., Any],
        *,
        name: str,
        args: tuple = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        _require_linux()
        self.name = name
        process_obj = mp_context.SpawnProcess(target=target, name=name, args=args, kwargs=dict(kwargs or {}))
        child_fds = _ChildFds()
        buf = io.BytesIO()
        mp_context.set_spawning_popen(child_fds)
        try:
            reduction.dump(mp_spawn.get_preparation_data(name), buf)
            reduction.dump(process_obj, buf)
        finally:
            mp_context.set_spawning_popen(None)
        self.payload = buf.getvalue()
        self.fds = child_fds.fds

    def start(self) -> Process:
        """Starts a fresh interpreter running the target, with the spawn start
        method's semantics (a target from `__main__` or a test module works)."""
        return start_targets([self])[0]


def start_targets(targets: Sequence[PreparedTarget]) -> list[Process]:
    """Starts every prepared target at once (requests pipelined to the
    guardian). If any fails to start, the others are killed and the first
    error is raised."""
    _configure()
    pipes = [os.pipe() for _ in targets]
    boot = [sys.executable, *subprocess._args_from_interpreter_flags(), "-c", _CHILD_BOOT]
    # Each handle keeps its pipe's write end open for the child's lifetime, so
    # that multiprocessing.parent_process() in the child sees us alive.
    requests = [
        _core.SpawnRequest([*boot, str(data_r)], name=t.name, pass_fds=[data_r, *t.fds], hold_fds=[data_w])
        for t, (data_r, data_w) in zip(targets, pipes)
    ]
    try:
        outcomes = _core.spawn_many(requests)
    except BaseException:
        for _, data_w in pipes:
            os.close(data_w)  # not handed over: spawn_many checks before it takes them
        raise
    finally:
        for data_r, _ in pipes:
            os.close(data_r)
    procs = [o for o in outcomes if isinstance(o, Process)]
    failures = [o for o in outcomes if not isinstance(o, Process)]
    if failures:
        for proc in procs:
            proc.kill()
            proc.join()
        raise failures[0]
    for target, (_, data_w) in zip(targets, pipes):
        try:
            with open(data_w, "wb", closefd=False) as pipe:
                pipe.write(target.payload)
        except BrokenPipeError:
            pass  # the child died before reading; its exit code tells why
    return procs


def start_target(
    target: Callable[..., Any], *, name: str, args: tuple = (), kwargs: Mapping[str, Any] | None = None
) -> Process:
    """Pickles and starts `target(*args, **kwargs)` in a fresh interpreter."""
    return PreparedTarget(target, name=name, args=args, kwargs=kwargs).start()


def _fileno(obj: Any) -> int:
    return obj if isinstance(obj, int) else obj.fileno()


def wait(objects: Iterable[Any], timeout: float | None = None) -> list[Any]:
    """Like `multiprocessing.connection.wait`: blocks (without the GIL) until
    some of `objects` (fds, or objects with `fileno()`: sentinels, pipe ends,
    sockets) are readable, or `timeout` passes. Returns the ready objects."""
    objects = list(objects)
    by_fd: dict[int, list[Any]] = {}
    for obj in objects:
        by_fd.setdefault(_fileno(obj), []).append(obj)
    ready = set(_core.wait_fds(list(by_fd), timeout))
    return [obj for obj in objects if _fileno(obj) in ready]


def remove_on_exit(path: str | os.PathLike) -> None:
    """Has this process's guardian remove `path` once this process is gone,
    however it ends, SIGKILL included, provided the path still names the same
    file or directory then. A file (a socket this process created) is
    unlinked; a directory goes once the registered files are gone, with any
    sockets left in it, but stays as it is if it holds anything else
    (docs/process-core.md). Returns once the guardian has the registration,
    so a SIGKILL right after still removes the path. `FileNotFoundError`
    (with `filename`) if `path` does not exist."""
    _configure()
    _core.remove_on_exit(os.fspath(path))


def cancel_remove_on_exit(path: str | os.PathLike) -> None:
    """Undoes `remove_on_exit(path)`: for a caller that removes `path` itself
    on a clean exit, so that a later file at that path is never at risk. A
    no-op if `path` was never registered."""
    _require_linux()
    _core.cancel_remove_on_exit(os.fspath(path))


def kill_process_tree(pid: int) -> None:
    """SIGKILLs `pid` and every descendant, including ones forking meanwhile
    and, below children started by vllm_rs, ones that detached. Returns
    quietly if `pid` is gone."""
    _require_linux()
    _core.kill_process_tree(pid)
