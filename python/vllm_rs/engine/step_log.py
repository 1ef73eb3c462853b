"""Opt-in timing of every engine step, for benchmarks. With
`VLLM_RS_STEP_LOG=DIR`, each engine process appends one JSON line per step
that ran requests to `DIR/engine-<pid>.jsonl`:

  start, end    monotonic seconds (the system-wide clock, so comparable with
                a client's `time.monotonic()` in another process);
  cpu           CPU seconds of the engine's thread during the step;
  cpu_wait      seconds the thread was runnable but waiting for a CPU (Linux
                schedstat; null where the kernel does not say);
  requests, tokens  requests and tokens the step computed (a decode-only
                step has as many tokens as requests).

So a step's wall time splits into its own work (`cpu`), sharing a CPU with
other threads (`cpu_wait`), and the rest (blocking; time the hypervisor
took). The time between two steps is the engine loop's (sockets, encoding
outputs) or idle.
"""

from __future__ import annotations

import json
import os
import time
from typing import IO

#: The directory the step records go to (unset: no records).
STEP_LOG_ENV = "VLLM_RS_STEP_LOG"
#: This thread's scheduler counters: run time, wait time (ns), time slices.
_SCHEDSTAT = "/proc/thread-self/schedstat"


class StepLogError(ValueError):
    """`VLLM_RS_STEP_LOG` names a directory that cannot take the records."""


def _cpu_wait_s() -> float | None:
    """Seconds this thread has waited runnable for a CPU since it started,
    or None where the kernel has no schedstat."""
    try:
        with open(_SCHEDSTAT, encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class StepLog:
    """One engine process's step records (see the module docstring)."""

    def __init__(self, out: IO[str]):
        self._out = out

    @classmethod
    def from_env(cls) -> StepLog | None:
        """The log `VLLM_RS_STEP_LOG` asks for, or None when it is unset;
        raises StepLogError when the directory cannot be written."""
        directory = os.environ.get(STEP_LOG_ENV)
        if not directory:
            return None
        path = os.path.join(directory, f"engine-{os.getpid()}.jsonl")
        try:
            # Private to this user (a directory it creates, and the file),
            # and never written through a link someone else put there.
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            # Line-buffered: each record is whole on disk once the step ends.
            return cls(os.fdopen(fd, "a", buffering=1, encoding="utf-8"))
        except OSError as e:
            raise StepLogError(f"{STEP_LOG_ENV}={directory}: cannot write {path}: {e}") from None

    @staticmethod
    def mark() -> tuple[float, float, float | None]:
        """The clocks at the start of a step, for `record`."""
        return time.monotonic(), time.thread_time(), _cpu_wait_s()

    def record(self, mark: tuple[float, float, float | None], requests: int, tokens: int) -> None:
        """Writes the step that started at `mark` and ends now."""
        start, cpu_start, wait_start = mark
        wait_end = _cpu_wait_s()
        cpu_wait = wait_end - wait_start if wait_start is not None and wait_end is not None else None
        entry = {"start": start, "end": time.monotonic(), "cpu": time.thread_time() - cpu_start,
                 "cpu_wait": cpu_wait, "requests": requests, "tokens": tokens}  # fmt: skip
        self._out.write(json.dumps(entry) + "\n")
