"""Stop strings matched in the frontend on the detokenized text. Text that
could still be the start of a stop string is held back until it is not.

Matching runs an Aho-Corasick automaton over the stop strings, so each
character of output costs the same however many or however long the stop
strings are (a naive search per push cost quadratic time in their length)."""

from __future__ import annotations


class _Automaton:
    """Aho-Corasick over `stops`: a state is the longest suffix of the text
    read so far that is a prefix of some stop string."""

    def __init__(self, stops: list[str]):
        self.children: list[dict[str, int]] = [{}]
        self.depth = [0]
        # Per state: (list index, length) of the stop string that ends here
        # and starts earliest (the longest), following suffix links.
        self.match: list[tuple[int, int] | None] = [None]
        for index, stop in enumerate(stops):
            state = 0
            for ch in stop:
                following = self.children[state].get(ch)
                if following is None:
                    following = len(self.children)
                    self.children[state][ch] = following
                    self.children.append({})
                    self.depth.append(self.depth[state] + 1)
                    self.match.append(None)
                state = following
            if self.match[state] is None:
                self.match[state] = (index, len(stop))
        self.fail = [0] * len(self.children)
        queue = list(self.children[0].values())
        for state in queue:  # breadth first: a state's fail link is set before its children's
            for ch, child in self.children[state].items():
                fallback = self.fail[state]
                while fallback and ch not in self.children[fallback]:
                    fallback = self.fail[fallback]
                link = self.children[fallback].get(ch, 0)
                self.fail[child] = link if link != child else 0
                if self.match[child] is None:
                    self.match[child] = self.match[self.fail[child]]
                queue.append(child)

    def step(self, state: int, ch: str) -> int:
        """The state after reading `ch`."""
        children = self.children
        while state and ch not in children[state]:
            state = self.fail[state]
        return children[state].get(ch, 0)


class StopStrings:
    """Matches stop strings across streamed text pieces."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self._pending = ""
        self._automaton = _Automaton(self.stops) if self.stops else None
        self._state = 0
        self._longest = max((len(s) for s in self.stops), default=0)

    def push(self, text: str) -> tuple[str, str | None]:
        """Adds `text`; returns the text safe to emit and the stop string that
        matched, if one did (the text from it onwards is dropped). When
        several match, the one starting first wins, then the one listed first."""
        automaton = self._automaton
        if automaton is None:
            return text, None
        base = len(self._pending)
        self._pending += text
        state = self._state
        first: tuple[int, int] | None = None  # (start, list index)
        for offset, ch in enumerate(text):
            end = base + offset + 1
            if first is not None and end - self._longest > first[0]:
                break  # no later match can start before the one found
            state = automaton.step(state, ch)
            found = automaton.match[state]
            if found is not None:
                candidate = (end - found[1], found[0])
                if first is None or candidate < first:
                    first = candidate
            # A shorter stop ending here may be listed earlier than the
            # longest one; it starts later, so it only matters on a tie,
            # which cannot happen for different lengths ending together.
        if first is not None:
            emit, self._pending = self._pending[: first[0]], ""
            return emit, self.stops[first[1]]
        self._state = state
        cut = len(self._pending) - automaton.depth[state]
        emit, self._pending = self._pending[:cut], self._pending[cut:]
        return emit, None

    def flush(self) -> str:
        """Everything still held back (the stream ended without a match)."""
        out, self._pending = self._pending, ""
        return out
