"""One generation as the HTTP handlers see it: engine outputs turned into text
deltas, with detokenization, stop strings, usage counts and metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass

from vllm_rs.api_server.engine_client import Failed, RequestStream
from vllm_rs.api_server.metrics import Metrics
from vllm_rs.api_server.stop_strings import StopStrings
from vllm_rs.api_server.tokenizer import ByteDecoder
from vllm_rs.engine.protocol import FinishReason


class GenerationError(RuntimeError):
    """The generation failed after it started (engine ERROR, engine gone or
    hung); `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status


#: The message of a request the engine finished with ERROR.
ENGINE_FAILED_MESSAGE = "the engine failed the request"


@dataclass
class Finish:
    """How a generation ended."""

    reason: FinishReason
    stop_reason: int | str | None = None


@dataclass
class Delta:
    """Text since the previous delta; the last one carries the finish."""

    text: str
    finish: Finish | None = None


class Generation:
    """A running generation."""

    def __init__(
        self,
        stream: RequestStream,
        decoder: ByteDecoder,
        stop: list[str],
        prompt_tokens: int,
        metrics: Metrics,
        started: float,
    ):
        self.stream = stream
        self.decoder = decoder
        self.stops = StopStrings(stop)
        self.metrics = metrics
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        self.started = started
        self.last_tokens_at: float | None = None
        self.finished = False
        metrics.record_prompt(prompt_tokens)

    def usage(self) -> dict[str, int]:
        """Token counts so far."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    async def next_delta(self) -> Delta | None:
        """The next non-empty delta (or the final one); None once finished.
        Outputs that queued up meanwhile are merged into one delta. Raises
        GenerationError when the request fails."""
        while not self.finished:
            event = await self.stream.next_event()
            token_ids: list[int] = []
            finish = None
            while event is not None:
                if isinstance(event, Failed):
                    self._fail()
                    raise GenerationError(event.reason, event.status)
                token_ids.extend(event.token_ids)
                if event.finish_reason is not None:
                    finish = Finish(event.finish_reason, event.stop_reason)
                    break
                event = self.stream.next_queued()
            self._count_tokens(len(token_ids))
            if finish is not None and finish.reason == FinishReason.ERROR:
                self._fail()
                raise GenerationError(ENGINE_FAILED_MESSAGE)
            if finish is not None and finish.reason == FinishReason.STOP:
                # As vLLM: the token that stopped the request (EOS or a stop
                # token id) is counted but left out of the text.
                token_ids = token_ids[:-1]
            text = self.decoder.push(token_ids)
            if finish is not None:
                text += self.decoder.flush()
            emit, matched = self.stops.push(text)
            if matched is not None:
                self.stream.close()
                finish = Finish(FinishReason.STOP, matched)
            elif finish is not None:
                emit += self.stops.flush()
            if finish is not None:
                self._finish(finish.reason)
            if emit or finish is not None:
                return Delta(emit, finish)
        return None

    async def collect(self) -> tuple[str, Finish]:
        """Runs to the end; returns the whole text and the finish."""
        pieces = []
        while (delta := await self.next_delta()) is not None:
            pieces.append(delta.text)
            if delta.finish is not None:
                return "".join(pieces), delta.finish
        raise GenerationError("the generation ended without a finish reason")

    def close(self) -> None:
        """Ends the generation early (client gone): aborts it in the engine."""
        if not self.finished:
            self._finish(FinishReason.ABORT)
        self.stream.close()

    def _count_tokens(self, count: int) -> None:
        if count == 0:
            return
        now = time.monotonic()
        if self.last_tokens_at is None:
            self.metrics.record_tokens(count, now - self.started, None)
        else:
            self.metrics.record_tokens(count, None, now - self.last_tokens_at)
        self.last_tokens_at = now
        self.completion_tokens += count

    def _finish(self, reason: FinishReason) -> None:
        self.finished = True
        self.metrics.record_finished(reason, time.monotonic() - self.started)

    def _fail(self) -> None:
        self._finish(FinishReason.ERROR)
