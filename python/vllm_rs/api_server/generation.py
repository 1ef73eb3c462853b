"""One generation as the HTTP handlers see it: engine outputs turned into text
deltas, with detokenization, stop strings, usage counts and metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from vllm_rs.api_server.engine_client import Failed, RequestStream
from vllm_rs.api_server.logprobs import Decode, Position, PositionReader
from vllm_rs.api_server.metrics import Metrics
from vllm_rs.api_server.stop_strings import StopStrings
from vllm_rs.api_server.tokenizer import TextDecoder
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
    """Text since the previous delta; the last one carries the finish.
    `token_ids` are the tokens that arrived with it and `logprobs` their
    positions (when the request asked for logprobs); `prompt_logprobs` come
    once, with the first delta, when asked for (the first token's is None)."""

    text: str
    finish: Finish | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Position] | None = None
    prompt_logprobs: list[Position | None] | None = None


def _no_text(token_ids: list[int]) -> str:
    return ""


def total_usage(generations: list[Generation]) -> dict[str, int]:
    """Usage of one request's choices: its prompt once, the completions
    summed (as vLLM counts n > 1)."""
    prompt = generations[0].prompt_tokens
    completion = sum(g.completion_tokens for g in generations)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Generation:
    """A running generation."""

    def __init__(
        self,
        stream: RequestStream,
        decoder: TextDecoder,
        stop: list[str],
        prompt_tokens: int,
        metrics: Metrics,
        started: float,
        every_token: bool = False,
        decode: Decode | None = None,
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
        #: A delta for every output with tokens, even without new text
        #: (logprobs belong to tokens, as in vLLM's streams).
        self.every_token = every_token
        # Logprob positions and their token strings, as vLLM's LogprobsProcessor
        # reads them (each keeps the scored tokens before as context).
        self._sample_positions = PositionReader(decode or _no_text)
        self._prompt_positions = PositionReader(decode or _no_text)
        metrics.record_prompt(stream.engine, prompt_tokens)

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
            logprobs: list[Position] | None = None
            prompt_logprobs: list[Position | None] | None = None
            finish = None
            while event is not None:
                if isinstance(event, Failed):
                    self._fail()
                    raise GenerationError(event.reason, event.status)
                token_ids.extend(event.token_ids)
                if event.logprobs is not None:
                    logprobs = (logprobs or []) + self._sample_positions.read(event.logprobs)
                if event.prompt_logprobs is not None:
                    prompt_logprobs = [None, *self._prompt_positions.read(event.prompt_logprobs)]
                if event.finish_reason is not None:
                    finish = Finish(event.finish_reason, event.stop_reason)
                    break
                event = self.stream.next_queued()
            self._count_tokens(len(token_ids))
            if finish is not None and finish.reason == FinishReason.ERROR:
                self._fail()
                raise GenerationError(ENGINE_FAILED_MESSAGE)
            # As in vLLM, the token that stopped generation in the engine (EOS,
            # a stop token id) is counted but left out of the text.
            stopped_in_engine = finish is not None and finish.reason == FinishReason.STOP
            text = self.decoder.push(token_ids[:-1] if stopped_in_engine else token_ids)
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
            if emit or finish is not None or (self.every_token and token_ids):
                return Delta(emit, finish, token_ids, logprobs, prompt_logprobs)
        return None

    async def collect(self) -> Delta:
        """Runs to the end; returns all of it as one delta."""
        whole = Delta("")
        pieces = []
        while (delta := await self.next_delta()) is not None:
            pieces.append(delta.text)
            whole.token_ids += delta.token_ids
            if delta.logprobs is not None:
                whole.logprobs = (whole.logprobs or []) + delta.logprobs
            if delta.prompt_logprobs is not None:
                whole.prompt_logprobs = delta.prompt_logprobs
            if delta.finish is not None:
                whole.text, whole.finish = "".join(pieces), delta.finish
                return whole
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
            self.metrics.record_tokens(self.stream.engine, count, now - self.started, None)
        else:
            self.metrics.record_tokens(self.stream.engine, count, None, now - self.last_tokens_at)
        self.last_tokens_at = now
        self.completion_tokens += count

    def _finish(self, reason: FinishReason) -> None:
        self.finished = True
        self.metrics.record_finished(self.stream.engine, reason, time.monotonic() - self.started)

    def _fail(self) -> None:
        self._finish(FinishReason.ERROR)
