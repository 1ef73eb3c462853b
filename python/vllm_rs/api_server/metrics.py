"""Prometheus metrics under vLLM's names, help texts and buckets (the same as the
Rust frontend's), kept and exposed by `prometheus_client` as vLLM's are."""

from __future__ import annotations

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


class Metrics:
    """The server's request metrics, labelled with the model name, in a registry
    of their own (several servers in one process do not collide)."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = ["model_name"]

        def labelled(metric):
            return metric.labels(model_name)

        self.running = labelled(
            Gauge(
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                labels,
                registry=self.registry,
            )
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self.finished = {reason: success.labels(model_name, reason.openai_name) for reason in FinishReason}
        self.prompt_tokens = labelled(
            Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=self.registry)
        )
        self.generation_tokens = labelled(
            Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=self.registry)
        )
        self.time_to_first_token = labelled(
            Histogram(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                labels,
                buckets=TTFT_BUCKETS,
                registry=self.registry,
            )
        )
        self.inter_token_latency = labelled(
            Histogram(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                labels,
                buckets=ITL_BUCKETS,
                registry=self.registry,
            )
        )
        self.e2e_latency = labelled(
            Histogram(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                labels,
                buckets=E2E_BUCKETS,
                registry=self.registry,
            )
        )

    def record_prompt(self, tokens: int) -> None:
        """A request with this many prompt tokens went to an engine."""
        self.prompt_tokens.inc(tokens)

    def record_tokens(self, tokens: int, first: float | None, gap: float | None) -> None:
        """Tokens arrived: the first ones `first` s after the request, or more
        after `gap` s since the previous ones (each token counts `gap / tokens`)."""
        self.generation_tokens.inc(tokens)
        if first is not None:
            self.time_to_first_token.observe(first)
        if gap is not None and tokens > 0:
            for _ in range(tokens):
                self.inter_token_latency.observe(gap / tokens)

    def record_finished(self, reason: FinishReason, elapsed: float) -> None:
        """A request finished for `reason` after `elapsed` s."""
        self.finished[reason].inc()
        self.e2e_latency.observe(elapsed)

    def render(self, running: int, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition and its content type, with `running` requests in flight:
        Prometheus text, or OpenMetrics when `accept` (the request's Accept header)
        asks for it, as vLLM's endpoint answers."""
        self.running.set(running)
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
