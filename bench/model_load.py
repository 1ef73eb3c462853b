"""The load of bench_models.py: random token prompts, closed-loop streaming
clients on the OpenAI completions API, and the statistics every measured
path reports (output tokens/s, TTFT p50/p99, TPOT p50)."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from openai import APIError


class LoadError(RuntimeError):
    """A server answered a request wrongly (an error, or not every token)."""


@dataclass
class RequestTiming:
    """One request as its client saw it: seconds from `start` (monotonic)."""

    start: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0

    def ttft(self) -> float:
        """Seconds from sending to the first token."""
        return self.first - self.start

    def tpot(self) -> float | None:
        """Seconds per output token after the first (None for one token)."""
        return (self.last - self.first) / (self.tokens - 1) if self.tokens > 1 else None


@dataclass
class LevelResult:
    """A load level's summary (times in ms)."""

    concurrency: int
    requests: int
    output_tokens: int
    seconds: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """JSON-ready."""
        return asdict(self)


def percentile(values: list[float], q: int) -> float:
    """The q-th percentile (inclusive method; the value itself for one sample)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summarize(concurrency: int, timings: list[RequestTiming], seconds: float) -> LevelResult:
    """The level's tokens/s over `seconds` (first send to last token) and its
    latency percentiles."""
    tokens = sum(t.tokens for t in timings)
    ttfts = [t.ttft() * 1000 for t in timings]
    tpots = [x * 1000 for t in timings if (x := t.tpot()) is not None]
    return LevelResult(
        concurrency=concurrency,
        requests=len(timings),
        output_tokens=tokens,
        seconds=seconds,
        tokens_per_s=tokens / seconds,
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p99_ms=percentile(ttfts, 99),
        tpot_p50_ms=statistics.median(tpots) if tpots else float("nan"),
    )


@dataclass
class GgufFacts:
    """What the load needs from the GGUF: its normal (non-control) token ids
    and the KV-cache bytes one token takes at float32."""

    normal_token_ids: list[int]
    kv_bytes_per_token_f32: int

    @classmethod
    def read(cls, gguf_path: Path) -> GgufFacts:
        """Reads them from the file's metadata."""
        import gguf

        reader = gguf.GGUFReader(str(gguf_path))
        types = reader.fields["tokenizer.ggml.token_type"]
        normal = [i for i, part in enumerate(types.data) if int(types.parts[part][0]) == gguf.TokenType.NORMAL]

        def key(name: str) -> int:
            arch = reader.fields["general.architecture"].contents()
            return int(reader.fields[f"{arch}.{name}"].contents())

        head_dim = key("embedding_length") // key("attention.head_count")
        return cls(normal, 2 * key("block_count") * key("attention.head_count_kv") * head_dim * 4)

    def random_prompts(self, count: int, length: int, seed: int) -> list[list[int]]:
        """`count` prompts of `length` normal token ids (seeded): no control
        tokens, so no prompt holds an end-of-sequence or chat marker, and
        every server sees the same ids."""
        rng = random.Random(seed)
        return [[rng.choice(self.normal_token_ids) for _ in range(length)] for _ in range(count)]


async def one_request(client, model: str, prompt: list[int], output_tokens: int) -> RequestTiming:
    """Streams one completion; the time of every chunk that carries a
    token is a token arrival (not a closing chunk: no text, a finish
    reason). Raises LoadError for a failed request or unless exactly
    `output_tokens` came (counted from the usage chunk when there is one)."""
    timing = RequestTiming(start=time.monotonic())
    try:
        return await _stream_one(client, model, prompt, output_tokens, timing)
    except APIError as e:
        raise LoadError(f"the server failed a request: {e}") from e


async def _stream_one(
    client, model: str, prompt: list[int], output_tokens: int, timing: RequestTiming
) -> RequestTiming:
    chunks = 0
    usage_tokens = None
    # Greedy, and exactly `output_tokens`: `ignore_eos` (vLLM and llama.cpp)
    # and `min_tokens` (vLLM) keep the model going past an end-of-sequence.
    # The raw event stream, read with `json.loads`: on a 2-CPU machine the
    # client shares the CPUs with the server it measures, and the SDK's
    # typed chunk objects cost it several times the CPU of the frontend.
    request = client.completions.with_streaming_response.create(
        model=model,
        prompt=prompt,
        max_tokens=output_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_tokens": output_tokens, "ignore_eos": True},
    )
    async with request as response:
        async for line in response.iter_lines():
            now = time.monotonic()
            if not line.startswith("data:"):
                continue  # blank separators, comments, event names
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise LoadError(f"the server failed a request mid-stream: {chunk['error']}")
            choices = chunk.get("choices") or []
            if choices and (choices[0].get("text") or choices[0].get("finish_reason") is None):
                chunks += 1
                timing.first = timing.first or now
                timing.last = now
            if chunk.get("usage") is not None:
                usage_tokens = chunk["usage"]["completion_tokens"]
    timing.tokens = usage_tokens if usage_tokens is not None else chunks
    if timing.tokens != output_tokens or timing.first is None:
        raise LoadError(f"asked for {output_tokens} tokens, got {timing.tokens} in {chunks} chunks")
    return timing


async def run_level(
    base_url: str, model: str, prompts: list[list[int]], concurrency: int, output_tokens: int, warmup: list[int]
) -> LevelResult:
    """`concurrency` clients, each sending its share of `prompts` one after
    another (a closed loop); the summary of every request. A short request
    on `warmup` (a prompt no measured one starts with) goes first."""
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url, api_key="unused", timeout=1800, max_retries=0) as client:
        await one_request(client, model, warmup, 4)  # first-step costs off the clock
        queues = [prompts[i::concurrency] for i in range(concurrency)]

        async def worker(queue: list[list[int]]) -> list[RequestTiming]:
            return [await one_request(client, model, p, output_tokens) for p in queue]

        started = time.monotonic()
        per_worker = await asyncio.gather(*(worker(q) for q in queues))
        timings = [t for ts in per_worker for t in ts]
    return summarize(concurrency, timings, max(t.last for t in timings) - started)
