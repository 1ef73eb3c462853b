"""What an answer shows besides the text, as vLLM 0.33 renders it: logprobs
(completions' `{tokens, token_logprobs, top_logprobs, text_offset}`, chat's
`content[]`), the echoed prompt of a completion, and prompt logprobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_rs.api_server.generation import Delta
from vllm_rs.api_server.logprobs import (
    Position,
    TokenStrings,
    chat_logprobs,
    completion_logprobs,
    prompt_logprobs_json,
)


@dataclass
class Echo:
    """A completion's prompt, shown before its text (`echo`)."""

    text: str
    token_ids: list[int]
    #: Show the prompt alone, leaving the generated tokens out (vLLM's
    #: `echo` with `max_tokens` 0).
    prompt_only: bool = False


@dataclass
class Rendering:
    """How one request's answer is rendered."""

    #: How logprobs show tokens.
    strings: TokenStrings
    #: Completions' `logprobs`, or chat's `top_logprobs` when chat `logprobs`
    #: is true; None: no logprobs in the answer.
    logprobs: int | None = None
    echo: Echo | None = None
    #: Whether the (non-streamed) answer carries `prompt_logprobs`.
    prompt_logprobs: bool = False

    def prompt_logprobs_json(self, positions: list[Position | None] | None) -> list[dict[str, Any] | None] | None:
        """The `prompt_logprobs` field for the positions the engine sent."""
        return None if positions is None else prompt_logprobs_json(positions)

    def chat_logprobs(self, delta: Delta) -> dict[str, Any] | None:
        """Chat's `logprobs` for the tokens of `delta`, or None when not asked for."""
        if self.logprobs is None:
            return None
        return chat_logprobs(
            delta.token_ids, _padded(delta.logprobs, len(delta.token_ids)), self.logprobs, self.strings
        )


def _padded(positions: list[Position] | list[Position | None] | None, count: int) -> list[Position | None]:
    """`positions` with None for tokens the engine sent no logprobs for."""
    known: list[Position | None] = list(positions or [])
    return known + [None] * (count - len(known))


@dataclass
class CompletionPieces:
    """A completion's text and logprobs, delta by delta: the echoed prompt
    goes first, text offsets run on across deltas (vLLM's streams)."""

    rendering: Rendering
    next_offset: int = 0
    echoed: bool = field(default=False)

    def piece(self, delta: Delta) -> tuple[str, dict[str, Any] | None]:
        """The text and the `logprobs` of the next delta."""
        echo = self.rendering.echo
        text, token_ids = delta.text, delta.token_ids
        positions = _padded(delta.logprobs, len(token_ids))
        if echo is not None and echo.prompt_only:
            # The one token generated for a prompt-only echo is not shown.
            text, token_ids, positions = "", [], []
        if echo is not None and not self.echoed:
            self.echoed = True
            text = echo.text + text
            token_ids = echo.token_ids + token_ids
            positions = _padded(delta.prompt_logprobs, len(echo.token_ids)) + positions
        if self.rendering.logprobs is None:
            return text, None
        logprobs = completion_logprobs(
            token_ids, positions, self.rendering.logprobs, self.rendering.strings, self.next_offset
        )
        if logprobs["tokens"]:
            self.next_offset = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
        return text, logprobs
