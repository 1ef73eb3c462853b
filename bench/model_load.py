"""The load of bench_models.py: random token prompts, closed-loop streaming
clients on the OpenAI completions API, and the statistics every measured
path reports (output tokens/s, TTFT p50/p99, TPOT p50)."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import resource
import statistics
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path


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


@functools.cache
def native_client() -> Path:
    """The native streaming client (bench/clients/src/model_load.rs),
    built once per process; returns its executable."""
    from bench.bench_frontend import build_client

    return build_client("model_load")


#: How long one level may take before the server is taken for hung (a
#: 16-stream level of 128-token requests takes under a minute on 2 CPUs).
LEVEL_TIMEOUT_S = 1800


async def run_level(
    base_url: str, model: str, prompts: list[list[int]], concurrency: int, output_tokens: int, warmup: list[int]
) -> LevelResult:
    """`concurrency` clients, each on its own keep-alive connection, each
    sending its share of `prompts` one after another (a closed loop),
    streamed; the summary of every request. A short request on `warmup` (a
    prompt no measured one starts with) goes first, off the clock.

    The clients are the native `model_load` (one thread): on a 2-CPU
    machine the client shares the CPUs with the server it measures, and a
    Python client spent about 5 ms of CPU per 16-token step there. Each
    token's time is when the line of its chunk arrives; a request must
    yield exactly `output_tokens` (its usage chunk says so), else LoadError.
    The client's CPU seconds go to `extra["client_cpu_s"]`."""
    url = urllib.parse.urlsplit(base_url)
    if url.hostname not in ("127.0.0.1", "localhost") or url.port is None:
        raise LoadError(f"the native client serves a local port only, not {base_url}")
    spec = {
        "port": url.port,
        "path": url.path.rstrip("/") + "/completions",
        "model": model,
        "output_tokens": output_tokens,
        "warmup": warmup,
        "queues": [prompts[i::concurrency] for i in range(concurrency)],
    }
    client = native_client()  # built (by cargo, a child too) before the CPU count starts
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = await asyncio.create_subprocess_exec(
        str(client),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(json.dumps(spec).encode()), LEVEL_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise LoadError(f"the level did not end within {LEVEL_TIMEOUT_S} s: the server stopped answering") from None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise LoadError(err.decode(errors="replace").strip() or f"model_load exited {process.returncode}")
    timings = [RequestTiming(**t) for t in json.loads(out)["timings"]]
    result = summarize(concurrency, timings, max(t.last for t in timings))
    result.extra["client_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result
