"""The API server's /metrics exposition, read back with prometheus_client's own
parser, in vLLM's names, types and help."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families as parse_text
from vllm_rs.api_server.metrics import Metrics
from vllm_rs.engine.protocol import FinishReason

#: vLLM 0.33's families (v1/metrics/loggers.py): type and help text.
VLLM_FAMILIES = {
    "vllm:num_requests_running": ("gauge", "Number of requests in model execution batches."),
    "vllm:request_success": ("counter", "Count of successfully processed requests."),
    "vllm:prompt_tokens": ("counter", "Number of prefill tokens processed."),
    "vllm:generation_tokens": ("counter", "Number of generation tokens processed."),
    "vllm:time_to_first_token_seconds": ("histogram", "Histogram of time to first token in seconds."),
    "vllm:inter_token_latency_seconds": ("histogram", "Histogram of inter-token latency in seconds."),
    "vllm:e2e_request_latency_seconds": ("histogram", "Histogram of e2e request latency in seconds."),
}


def recorded() -> Metrics:
    metrics = Metrics('to"y', range(2))
    metrics.record_prompt(1, 5)
    metrics.record_tokens(1, 2, 0.003, None)
    metrics.record_tokens(1, 2, None, 0.004)
    metrics.record_finished(1, FinishReason.LENGTH, 0.02)
    metrics.record_prompt(0, 7)
    return metrics


def samples(families) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_prometheus_text_has_vllms_families_and_the_recorded_values():
    metrics = recorded()
    assert (metrics.prompt_total, metrics.generation_total) == (12, 4)
    body, content_type = metrics.render(running=lambda engine: engine)
    assert content_type.startswith("text/plain; version=0.0.4")
    families = list(parse_text(body.decode()))
    by_name = {f.name: f for f in families}
    for name, (kind, help_text) in VLLM_FAMILIES.items():
        assert (by_name[name].type, by_name[name].documentation) == (kind, help_text), name
    values = samples(families)
    model = ("model_name", 'to"y')
    one, zero = ("engine", "1"), ("engine", "0")
    assert values[("vllm:num_requests_running", (one, model))] == 1
    assert values[("vllm:num_requests_running", (zero, model))] == 0
    assert values[("vllm:request_success_total", (one, ("finished_reason", "length"), model))] == 1
    assert values[("vllm:request_success_total", (one, ("finished_reason", "abort"), model))] == 0
    assert values[("vllm:request_success_total", (zero, ("finished_reason", "length"), model))] == 0
    assert values[("vllm:prompt_tokens_total", (one, model))] == 5
    assert values[("vllm:prompt_tokens_total", (zero, model))] == 7
    assert values[("vllm:generation_tokens_total", (one, model))] == 4
    assert values[("vllm:time_to_first_token_seconds_bucket", (one, ("le", "0.005"), model))] == 1
    assert values[("vllm:time_to_first_token_seconds_bucket", (one, ("le", "0.001"), model))] == 0
    assert values[("vllm:inter_token_latency_seconds_count", (one, model))] == 2
    assert values[("vllm:e2e_request_latency_seconds_bucket", (one, ("le", "+Inf"), model))] == 1


def test_openmetrics_when_the_client_asks_for_it():
    body, content_type = recorded().render(
        running=lambda engine: 0, accept="application/openmetrics-text; version=1.0.0"
    )
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    # prometheus_client 0.26 writes OpenMetrics sample names with `_` for `:`
    # (so does vLLM's endpoint, the same library); its own parser then refuses them.
    assert b"# TYPE vllm:prompt_tokens counter\n" in body
    assert b'vllm_prompt_tokens_total{engine="1",model_name="to\\"y"} 5.0\n' in body


def test_two_servers_in_one_process_keep_their_own_counts():
    first, second = Metrics("a"), Metrics("a")
    first.record_prompt(0, 3)
    values = samples(parse_text(second.render(lambda engine: 0)[0].decode()))
    assert values[("vllm:prompt_tokens_total", (("engine", "0"), ("model_name", "a")))] == 0
