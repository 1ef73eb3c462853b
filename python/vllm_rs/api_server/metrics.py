"""Prometheus metrics under vLLM's names, help texts and buckets (the same as the
Rust frontend's), kept and exposed by `prometheus_client` as vLLM's are."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from vllm_rs.engine.protocol import FinishReason

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0)


@dataclass(frozen=True)
class EngineSeries:
    """One engine's series of every metric."""

    running: Gauge
    finished: dict[FinishReason, Counter]
    prompt_tokens: Counter
    generation_tokens: Counter
    time_to_first_token: Histogram
    inter_token_latency: Histogram
    e2e_latency: Histogram


class Metrics:
    """The server's request metrics, one series per engine labelled with the
    model name and the engine's index (as vLLM labels them), in a registry of
    their own (several servers in one process do not collide)."""

    def __init__(self, model_name: str, engines: Iterable[int] = (0,)):
        self.registry = registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels,
                        registry=registry)  # fmt: skip
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          [*labels, "finished_reason"], registry=registry)  # fmt: skip
        prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=registry)
        generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels,
                                    registry=registry)  # fmt: skip
        ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels,
                         buckets=TTFT_BUCKETS, registry=registry)  # fmt: skip
        itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels,
                        buckets=ITL_BUCKETS, registry=registry)  # fmt: skip
        e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", labels,
                        buckets=E2E_BUCKETS, registry=registry)  # fmt: skip

        def series(engine: int) -> EngineSeries:
            values = (model_name, str(engine))
            return EngineSeries(
                running=running.labels(*values),
                finished={reason: success.labels(*values, reason.openai_name) for reason in FinishReason},
                prompt_tokens=prompt_tokens.labels(*values),
                generation_tokens=generation_tokens.labels(*values),
                time_to_first_token=ttft.labels(*values),
                inter_token_latency=itl.labels(*values),
                e2e_latency=e2e.labels(*values),
            )

        self._series = {engine: series(engine) for engine in engines}
        #: Prompt and generation tokens so far, over all engines (for the stats log).
        self.prompt_total = 0
        self.generation_total = 0
        self._first = next(iter(self._series.values()))

    def _of(self, engine: int) -> EngineSeries:
        return self._series.get(engine, self._first)

    def record_prompt(self, engine: int, tokens: int) -> None:
        """A request with this many prompt tokens went to `engine`."""
        self._of(engine).prompt_tokens.inc(tokens)
        self.prompt_total += tokens

    def record_tokens(self, engine: int, tokens: int, first: float | None, gap: float | None) -> None:
        """Tokens arrived from `engine`: the first ones `first` s after the
        request, or more after `gap` s since the previous ones (each token
        counts `gap / tokens`)."""
        series = self._of(engine)
        series.generation_tokens.inc(tokens)
        self.generation_total += tokens
        if first is not None:
            series.time_to_first_token.observe(first)
        if gap is not None and tokens > 0:
            for _ in range(tokens):
                series.inter_token_latency.observe(gap / tokens)

    def record_finished(self, engine: int, reason: FinishReason, elapsed: float) -> None:
        """A request on `engine` finished for `reason` after `elapsed` s."""
        series = self._of(engine)
        series.finished[reason].inc()
        series.e2e_latency.observe(elapsed)

    def render(self, running: Callable[[int], int], accept: str | None = None) -> tuple[bytes, str]:
        """The exposition and its content type, with `running(engine)` requests
        in flight on each engine: Prometheus text, or OpenMetrics when `accept`
        (the request's Accept header) asks for it, as vLLM's endpoint answers."""
        for engine, series in self._series.items():
            series.running.set(running(engine))
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
