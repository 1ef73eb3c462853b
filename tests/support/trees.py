"""Process trees for kill-tree tests and benchmarks (see tree.sh)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.wait import wait_until

TREE_SCRIPT = Path(__file__).with_name("tree.sh")

#: Members each tree has once fully built (the forking tree keeps growing).
TREE_SIZES = {"idle": 25, "forking": 10, "daemons": 13}


def read_pids(pidfile: Path) -> list[int]:
    """Pids recorded so far (every member writes its own on start)."""
    try:
        text = pidfile.read_text()
    except FileNotFoundError:
        return []
    return [int(line) for line in text.split() if line.isdigit()]


def wait_built(pidfile: Path, kind: str, timeout: float = 20.0) -> list[int]:
    """Waits until the tree has recorded all its members; returns their pids."""

    def built() -> list[int] | None:
        pids = read_pids(pidfile)
        return pids if len(pids) >= TREE_SIZES[kind] else None

    return wait_until(
        built,
        f"the {kind} tree to record its {TREE_SIZES[kind]} members",
        timeout,
    )


def is_running(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def survivors(pidfile: Path) -> list[int]:
    """Recorded members still running."""
    return [pid for pid in read_pids(pidfile) if is_running(pid)]


def descendants(pid: int) -> list[int]:
    """All descendants of `pid` (via /proc/*/task/*/children)."""
    out: list[int] = []
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except FileNotFoundError:
            continue
        for tid in tasks:
            try:
                kids = Path(f"/proc/{current}/task/{tid}/children").read_text().split()
            except FileNotFoundError:
                continue
            for kid in map(int, kids):
                out.append(kid)
                stack.append(kid)
    return out
