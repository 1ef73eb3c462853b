"""Warnings a peer can trigger at will (malformed messages, refused
connections) must not flood the log: each is reported at most once per
interval, with a count of the ones in between."""

from __future__ import annotations

import logging
import time
from typing import Any


class ThrottledWarning:
    """Logs one recurring warning on `logger` at most once per `interval_s`,
    saying how many occurrences were not logged since the last report."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0):
        self.logger = logger
        self.interval_s = interval_s
        self._last = -interval_s
        self._suppressed = 0

    def __call__(self, message: str, *args: Any) -> None:
        """Logs `message % args` unless one was logged within the interval."""
        now = time.monotonic()
        if now - self._last < self.interval_s:
            self._suppressed += 1
            return
        suffix = f" ({self._suppressed} more since the last report)" if self._suppressed else ""
        self.logger.warning(message + suffix, *args)
        self._last, self._suppressed = now, 0
