"""Where a load level's time per output token goes: the engine's own step
times, read from the records an engine writes with `VLLM_RS_STEP_LOG`
(vllm_rs/engine/step_log.py), and the CPU time the hypervisor took from
this machine (its steal time). bench_models.py gives each engine path a
directory of its own and summarizes each level."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path


def fresh_dir(path: Path) -> Path:
    """`path`, emptied: no record of an earlier run can be read as this one's."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _records(log_dir: Path) -> list[list[dict]]:
    """Each engine process's step records, in order."""
    return [[json.loads(line) for line in f.read_text().splitlines() if line]
            for f in sorted(log_dir.glob("engine-*.jsonl"))]  # fmt: skip


def steal_s() -> float | None:
    """CPU seconds the hypervisor has taken from this machine's CPUs since
    boot (all CPUs together; /proc/stat), or None where that is not known."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class Window:
    """A level's span: monotonic start and end, and the machine's steal
    time (`steal_s`) at both."""

    start: float
    steal_at_start: float | None
    end: float | None = None
    steal_at_end: float | None = None

    @classmethod
    def open(cls) -> Window:
        """A window starting now."""
        return cls(time.monotonic(), steal_s())

    def close(self) -> Window:
        """Ends the window now; returns it."""
        self.end, self.steal_at_end = time.monotonic(), steal_s()
        return self

    @property
    def steal(self) -> float | None:
        """CPU seconds the hypervisor took from this machine in the window."""
        if self.steal_at_start is None or self.steal_at_end is None:
            return None
        return self.steal_at_end - self.steal_at_start


def decode_steps(log_dir: Path, start: float, end: float, batch: int) -> dict | None:
    """Medians (ms) over the decode steps of `batch` requests that ran
    between monotonic times `start` and `end`: the step's wall time, its
    thread's CPU time, its wait for a CPU, the rest of its wall time (the
    hypervisor running something else on the CPU, or blocking), and the
    time from the step before (also a full decode step) to it. None without
    such steps."""
    walls, cpus, waits, rests, betweens = [], [], [], [], []
    for steps in _records(log_dir):
        previous = None
        for step in steps:
            full_decode = step["requests"] == batch and step["tokens"] == batch
            if full_decode and start <= step["start"] and step["end"] <= end:
                walls.append(step["end"] - step["start"])
                cpus.append(step["cpu"])
                if step["cpu_wait"] is not None:
                    waits.append(step["cpu_wait"])
                    rests.append(walls[-1] - step["cpu"] - step["cpu_wait"])
                if previous is not None:
                    betweens.append(step["start"] - previous["end"])
            previous = step if full_decode else None
    if not walls:
        return None

    def ms(values: list[float]) -> float | None:
        return statistics.median(values) * 1000 if values else None

    return {"steps": len(walls), "wall_ms": ms(walls), "cpu_ms": ms(cpus), "cpu_wait_ms": ms(waits),
            "rest_ms": ms(rests), "between_ms": ms(betweens)}  # fmt: skip


def describe(summary: dict) -> str:
    """One line for the report."""

    def ms(key: str) -> str:
        return "n/a" if summary[key] is None else f"{summary[key]:.1f} ms"

    return (f"engine decode step, medians of {summary['steps']}: wall {ms('wall_ms')}, CPU {ms('cpu_ms')}, "
            f"waiting for a CPU {ms('cpu_wait_ms')}, other {ms('rest_ms')}; between steps {ms('between_ms')}")  # fmt: skip
