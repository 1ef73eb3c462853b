"""Streaming answers as server-sent events: `data: {json}` per chunk, an
error chunk if the generation fails, then `data: [DONE]`. Closing the stream
early (client gone) aborts the request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.responses import StreamingResponse

from vllm_rs.api_server.chat_tools import delta_json
from vllm_rs.api_server.errors import ApiError, dumps
from vllm_rs.api_server.generation import Delta, Generation, GenerationError, total_usage
from vllm_rs.api_server.rendering import CompletionPieces, Rendering

DONE = b"data: [DONE]\n\n"


def event(value: Any) -> bytes:
    """One `data:` event holding `value` as JSON."""
    return b"data: " + dumps(value).encode() + b"\n\n"


@dataclass
class ChunkHeader:
    """What every chunk of one streamed answer repeats."""

    id: str
    object: str
    created: int
    model: str

    def event(self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
        """The event for a chunk with these choices and, when given, usage."""
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = usage
        return event(chunk)


class CompletionChunks:
    """Chunks of `/v1/completions`."""

    def __init__(self, header: ChunkHeader, rendering: Rendering, index: int = 0):
        self.header = header
        self.rendering = rendering
        #: The choice this writer writes (n > 1 streams interleave choices).
        self.index = index
        self.pieces = CompletionPieces(rendering)

    def opening(self) -> bytes | None:
        """Nothing before the text."""
        return None

    def delta(self, delta: Delta) -> bytes:
        """The chunk for one delta."""
        finish = delta.finish
        text, logprobs = self.pieces.piece(delta)
        choice = {
            "index": self.index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish.reason.openai_name if finish else None,
            "stop_reason": finish.stop_reason if finish else None,
        }
        return self.header.event([choice])

    def usage(self, usage: dict[str, int]) -> bytes:
        """The final usage chunk."""
        return self.header.event([], usage)


class ChatChunks(CompletionChunks):
    """Chunks of `/v1/chat/completions`: the assistant role first."""

    def opening(self) -> bytes:
        """The role chunk."""
        delta = {"role": "assistant", "content": ""}
        return self.header.event([{"index": self.index, "delta": delta, "logprobs": None, "finish_reason": None}])

    def delta(self, delta: Delta) -> bytes:
        """The chunk for one delta."""
        # A chunk that only carries logprobs has an empty delta (vLLM's DeltaMessage()).
        content = {"content": delta.text} if delta.text or delta.finish is not None else {}
        logprobs = self.rendering.chat_logprobs(delta)
        choice: dict[str, Any] = {"index": self.index, "delta": content, "logprobs": logprobs, "finish_reason": None}
        if delta.finish is not None:
            choice["finish_reason"] = delta.finish.reason.openai_name
            choice["stop_reason"] = delta.finish.stop_reason
        return self.header.event([choice])


class ParsedChatChunks(ChatChunks):
    """Chunks of `/v1/chat/completions` whose text goes through the request's
    output parser: reasoning, content and tool call deltas as vLLM streams
    them; `finish_reason(engine_reason, calls_made)` names the finish."""

    def __init__(self, header: ChunkHeader, rendering: Rendering, stream: Any, finish_reason: Any, index: int = 0):
        super().__init__(header, rendering, index)
        self.stream = stream
        self.finish_reason = finish_reason

    def delta(self, delta: Delta) -> bytes:
        """The chunk for one delta; nothing while the parser holds text back."""
        parts = [self.stream.push(delta.text)] if delta.text else []
        if delta.finish is not None:
            parts.append(self.stream.finish())
        out: dict[str, Any] = {}
        for part in parts:
            if part is None:
                continue
            for key, value in delta_json(part).items():
                if key == "tool_calls":
                    out.setdefault(key, []).extend(value)
                else:
                    out[key] = out.get(key, "") + value
        logprobs = self.rendering.chat_logprobs(delta)
        if not out and delta.finish is None and logprobs is None:
            return b""
        choice: dict[str, Any] = {"index": self.index, "delta": out, "logprobs": logprobs, "finish_reason": None}
        if delta.finish is not None:
            choice["finish_reason"] = self.finish_reason(delta.finish.reason.openai_name, self.stream.tools_called)
            choice["stop_reason"] = delta.finish.stop_reason
        return self.header.event([choice])


async def _events(generation: Generation, writer: CompletionChunks, include_usage: bool) -> AsyncIterator[bytes]:
    try:
        opening = writer.opening()
        if opening is not None:
            yield opening
        while True:
            try:
                delta = await generation.next_delta()
            except GenerationError as e:
                yield event(ApiError(e.status, str(e)).body())
                break
            if delta is None:
                break
            chunk = writer.delta(delta)
            if not chunk and delta.finish is None:
                continue
            if delta.finish is not None:
                if include_usage:
                    chunk += writer.usage(generation.usage())
                yield chunk + DONE
                return
            yield chunk
        yield DONE
    finally:
        generation.close()


async def _choices_events(
    generations: list[Generation], writers: list[CompletionChunks], include_usage: bool
) -> AsyncIterator[bytes]:
    """n > 1: each choice's chunks as they come, then the usage of all."""
    queue: asyncio.Queue[tuple[int, Delta | GenerationError | None]] = asyncio.Queue()

    async def pump(index: int, generation: Generation) -> None:
        try:
            while (delta := await generation.next_delta()) is not None:
                queue.put_nowait((index, delta))
                if delta.finish is not None:
                    break
        except GenerationError as e:
            queue.put_nowait((index, e))
            return
        queue.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(index, generation)) for index, generation in enumerate(generations)]
    try:
        for writer in writers:
            opening = writer.opening()
            if opening is not None:
                yield opening
        running = len(generations)
        while running:
            index, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, GenerationError):
                yield event(ApiError(item.status, str(item)).body()) + DONE
                return
            else:
                yield writers[index].delta(item)
        yield (writers[0].usage(total_usage(generations)) if include_usage else b"") + DONE
    finally:
        # Client gone, a failure, or done: every child is aborted or finished.
        for task in tasks:
            task.cancel()
        for generation in generations:
            generation.close()


def sse_response(
    generations: list[Generation], writers: list[CompletionChunks], include_usage: bool
) -> StreamingResponse:
    """A `text/event-stream` response streaming each choice's generation
    through its writer."""
    if len(generations) == 1:
        events = _events(generations[0], writers[0], include_usage)
    else:
        events = _choices_events(generations, writers, include_usage)
    return StreamingResponse(
        events, media_type="text/event-stream; charset=utf-8", headers={"cache-control": "no-cache"}
    )
