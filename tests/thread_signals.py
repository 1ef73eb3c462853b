"""Sending a signal to one chosen thread of another process (tgkill(2)), as
the kernel itself does with a kill(2) when the main thread cannot take it."""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

import pytest

from tests.support.wait import wait_until

#: tgkill(2)'s number, which Python's os module does not wrap.
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())


def threads_taking(pid: int, signum: int) -> list[int]:
    """The threads of `pid` other than its main one that do not block `signum`."""
    taking = []
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        blocked = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
        if tid != pid and not blocked & (1 << (signum - 1)):
            taking.append(tid)
    return taking


def signal_another_thread(pid: int, signum: int) -> None:
    """Sends `signum` to a thread of `pid` other than its main one; skips the
    test where there is none that takes it, or tgkill is unknown here."""
    if SYS_TGKILL is None:
        pytest.skip(f"tgkill's syscall number on {platform.machine()} is not known here")
    taking = threads_taking(pid, signum)
    if not taking:
        pytest.skip(f"every thread of pid {pid} but its main one blocks signal {signum}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, taking[0], signum) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {taking[0]}, {signum})")


def wait_for_thread(pid: int, name_prefix: str, timeout_s: float = 30.0) -> None:
    """Returns once `pid` runs a thread whose name starts with `name_prefix`
    (e.g. libzmq's `ZMQbg/` threads, which exist once a socket does)."""
    # /proc offers no notification of a new thread: it is polled.
    wait_until(
        lambda: any(
            Path(f"/proc/{pid}/task/{tid}/comm").read_text().startswith(name_prefix)
            for tid in os.listdir(f"/proc/{pid}/task")
        ),
        f"pid {pid} to start a {name_prefix!r} thread",
        timeout_s,
    )
