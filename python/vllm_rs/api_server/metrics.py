"""Prometheus metrics under vLLM's names, rendered as text for `GET /metrics`
(the same names, labels and buckets as the Rust frontend)."""

from __future__ import annotations

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


def format_number(value: float) -> str:
    """Shortest round-trip form, integers without `.0` (as Rust prints f64)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


class Histogram:
    """A cumulative histogram with fixed bucket bounds."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float, times: int = 1) -> None:
        """Adds `times` observations of `seconds`."""
        for i, bound in enumerate(self.bounds):
            if seconds <= bound:
                self.counts[i] += times
                break
        self.sum += seconds * times
        self.count += times

    def render(self, out: list[str], name: str, help_text: str, labels: str) -> None:
        """Appends the exposition lines."""
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} histogram")
        cumulative = 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            cumulative += count
            out.append(f'{name}_bucket{{{labels},le="{format_number(bound)}"}} {cumulative}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {format_number(self.sum)}")
        out.append(f"{name}_count{{{labels}}} {self.count}")


class Metrics:
    """The server's request metrics, labelled with the model name."""

    def __init__(self, model_name: str):
        escaped = model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        self.labels = f'model_name="{escaped}"'
        self.finished = {reason: 0 for reason in FinishReason}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.time_to_first_token = Histogram(TTFT_BUCKETS)
        self.inter_token_latency = Histogram(ITL_BUCKETS)
        self.e2e_latency = Histogram(E2E_BUCKETS)

    def record_prompt(self, tokens: int) -> None:
        """A request with this many prompt tokens went to an engine."""
        self.prompt_tokens += tokens

    def record_tokens(self, tokens: int, first: float | None, gap: float | None) -> None:
        """Tokens arrived: the first ones `first` s after the request, or more
        after `gap` s since the previous ones."""
        self.generation_tokens += tokens
        if first is not None:
            self.time_to_first_token.observe(first)
        if gap is not None and tokens > 0:
            self.inter_token_latency.observe(gap / tokens, tokens)

    def record_finished(self, reason: FinishReason, elapsed: float) -> None:
        """A request finished for `reason` after `elapsed` s."""
        self.finished[reason] += 1
        self.e2e_latency.observe(elapsed)

    def render(self, running: int) -> str:
        """The Prometheus text exposition, with `running` requests in flight."""
        labels = self.labels
        out = [
            "# HELP vllm:num_requests_running Number of requests in flight in the engines.",
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{labels}}} {running}",
            "# HELP vllm:request_success_total Count of finished requests by finish reason.",
            "# TYPE vllm:request_success_total counter",
        ]
        for reason, count in self.finished.items():
            out.append(f'vllm:request_success_total{{{labels},finished_reason="{reason.openai_name}"}} {count}')
        out += [
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            f"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{{{labels}}} {self.prompt_tokens}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            f"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{{labels}}} {self.generation_tokens}",
        ]
        self.time_to_first_token.render(
            out, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels
        )
        self.inter_token_latency.render(
            out, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels
        )
        self.e2e_latency.render(
            out, "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", labels
        )
        return "\n".join(out) + "\n"
