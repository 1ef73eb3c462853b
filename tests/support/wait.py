"""One way for tests to wait for something to happen: `wait_until` asks a
condition until it holds, with a deadline that fails the test naming what
never came. Tests never sleep a fixed time to let something happen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Generous deadline for anything a test waits on.
DEADLINE_S = 60.0
#: How often a condition is asked again.
POLL_INTERVAL_S = 0.01


class WaitTimeout(AssertionError):
    """The condition did not hold within the deadline (a test failure)."""


def wait_until(condition: Callable[[], T], what: str, timeout_s: float = DEADLINE_S) -> T:
    """Asks `condition` every `POLL_INTERVAL_S` until it returns something
    true, and returns that; raises WaitTimeout saying `what` did not happen
    within `timeout_s`. The condition is asked once more at the deadline, so
    a slow last ask cannot fail it. Exceptions of the condition propagate."""
    deadline = time.monotonic() + timeout_s
    while True:
        past_deadline = time.monotonic() >= deadline
        value = condition()
        if value:
            return value
        if past_deadline:
            raise WaitTimeout(f"waited {timeout_s:g}s for {what}, in vain")
        time.sleep(min(POLL_INTERVAL_S, max(0.0, deadline - time.monotonic())))
