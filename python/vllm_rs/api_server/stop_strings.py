"""Stop strings matched in the frontend on the detokenized text. Text that
could still be the start of a stop string is held back until it is not."""

from __future__ import annotations


class StopStrings:
    """Matches stop strings across streamed text pieces."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self._pending = ""

    def push(self, text: str) -> tuple[str, str | None]:
        """Adds `text`; returns the text safe to emit and the stop string that
        matched, if one did (the text from it onwards is dropped)."""
        if not self.stops:
            return text, None
        self._pending += text
        first = None
        for stop in self.stops:
            at = self._pending.find(stop)
            if at >= 0 and (first is None or at < first[0]):
                first = (at, stop)
        if first is not None:
            emit, self._pending = self._pending[: first[0]], ""
            return emit, first[1]
        held = self._held_back_len()
        cut = len(self._pending) - held
        emit, self._pending = self._pending[:cut], self._pending[cut:]
        return emit, None

    def flush(self) -> str:
        """Everything still held back (the stream ended without a match)."""
        out, self._pending = self._pending, ""
        return out

    def _held_back_len(self) -> int:
        """Length of the longest suffix of the pending text that is a proper
        prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:n]):
                    best = n
                    break
        return best
