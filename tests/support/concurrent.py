"""Calls started together on threads, for the tests that check concurrent
requests against their solo answers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def run_together(calls: list[Callable[[], T]], timeout_s: float = 300) -> list[T | BaseException | None]:
    """Runs every call on its own thread, all released at once by a barrier;
    each call's result, or the exception it raised (to be reported in the
    test's thread), or None if it had not ended within `timeout_s`."""
    results: dict[int, T | BaseException] = {}
    start = threading.Barrier(len(calls))

    def run(i: int) -> None:
        try:
            start.wait(30)
            results[i] = calls[i]()
        except BaseException as e:  # reported by the caller, in the test's thread
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    return [results.get(i) for i in range(len(calls))]
