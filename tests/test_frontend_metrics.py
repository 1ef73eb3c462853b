"""The Rust frontend's `/metrics` against vLLM 0.33's: after real traffic
through `python -m vllm_rs serve` (the toy model, a KV cache of 8 blocks,
prefix caching on), every family vLLM 0.33's frontend serves in front of the
same engine is there with vLLM's type, label names and bucket bounds
(tests/fixtures/vllm-0.33/metrics_families.json, written from vLLM's own
frontend by scripts/make_metrics_fixture.py), but for the families of
features this stack does not have (`NOT_SERVED`), every series vLLM's
Grafana dashboard plots is there (tests/fixtures/vllm-grafana-series.json),
and the values say what happened: prompt tokens counted by source, the
prefix-cache hits of a repeated prompt, the preemption a full cache forces,
each request's phases and parameters, the HTTP requests by route and status,
the sleep and wake-up operations."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import metrics_traffic as traffic
from tests.support.prometheus_text import Exposition, parse
from tests.test_serve import Serve, assert_all_gone, rust_frontend_available

pytestmark = pytest.mark.skipif(not rust_frontend_available(), reason="vllm-rs binary not built")

FIXTURES = Path(__file__).parent / "fixtures"

#: Name prefixes of the families vLLM 0.33's frontend serves that this stack
#: leaves out, and why.
NOT_SERVED = {
    "vllm:spec_decode_": "no speculative decoding",
    "vllm:lora_requests_info": "no LoRA adapters",
    "vllm:nixl_": "no KV connector",
    "vllm:mooncake_": "no KV connector",
    "vllm:external_prefix_cache_": "no KV connector",
    "vllm:estimated_": "no model FLOPs estimates",
    "vllm:kv_block_": "no sampling of KV block residency (--kv-cache-metrics-sample)",
    "vllm:rl_weight_update_": "no RL weight updates",
}


def vllm_families() -> dict[str, dict]:
    return json.loads((FIXTURES / "vllm-0.33" / "metrics_families.json").read_text())["families"]


def scrape(serve: Serve) -> Exposition:
    return parse(traffic.scrape(serve.wait_ready()))


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Serve, dict]]:
    """The stack after `metrics_traffic.drive`, and what the client saw of it."""
    serve = Serve("--model", traffic.MODEL, "--port", "0", "--frontend", "rust", *traffic.CACHE_ARGS)
    try:
        seen = traffic.drive(serve.wait_ready())
        yield serve, seen
        processes = serve.descendants()
        serve.interrupt()
        assert serve.wait(30) == 0, serve.output
        assert_all_gone(processes, within_s=5)
    finally:
        serve.kill()


def settled(serve: Serve) -> Exposition:
    """/metrics once the engine reported itself idle (its last stats come
    after its last output), within 10 s."""
    deadline = time.monotonic() + 10
    while True:
        metrics = scrape(serve)
        if metrics.total("vllm:num_requests_running") == 0 or time.monotonic() > deadline:
            return metrics
        time.sleep(0.05)


def test_every_family_of_vllms_frontend_is_served_with_its_type_labels_and_buckets(served):
    serve, _ = served
    ours = scrape(serve).families
    expected = {n: f for n, f in vllm_families().items() if not n.startswith(tuple(NOT_SERVED))}
    assert len(expected) == 35, sorted(expected)
    missing = sorted(set(expected) - set(ours))
    assert not missing, f"families vLLM 0.33 serves and we do not: {missing}"
    for name, theirs in expected.items():
        assert ours[name].describe() == theirs, name
    assert not set(ours) & (set(vllm_families()) - set(expected)), "a family NOT_SERVED names is served"


def test_every_series_vllms_grafana_dashboard_plots_exists(served):
    serve, _ = served
    series = json.loads((FIXTURES / "vllm-grafana-series.json").read_text())["series"]
    names = settled(serve).sample_names()
    assert [s for s in series if s not in names] == []


def test_token_counts_prefix_cache_and_preemption(served):
    serve, seen = served
    m = settled(serve)
    assert m.total("vllm:prompt_tokens_total") == seen["prompt"]
    assert m.total("vllm:generation_tokens_total") == seen["completion"]
    by_source = {s: m.total("vllm:prompt_tokens_by_source_total", source=s)
                 for s in ("local_compute", "local_cache_hit", "external_kv_transfer")}  # fmt: skip
    assert sum(by_source.values()) == seen["prompt"]
    assert by_source["external_kv_transfer"] == 0
    # The repeated prompt: 2 blocks of its 41 tokens were cached, so at least
    # 32 hits; every hit is a cached token.
    assert by_source["local_cache_hit"] >= 32
    assert m.total("vllm:prompt_tokens_cached_total") == by_source["local_cache_hit"]
    assert m.total("vllm:prefix_cache_hits_total") >= 32
    assert m.total("vllm:prefix_cache_queries_total") > m.total("vllm:prefix_cache_hits_total")
    assert m.total("vllm:prompt_tokens_cached_by_source_total", source="device") == m.total(
        "vllm:prefix_cache_hits_total"
    )
    assert m.total("vllm:corrupted_requests_total") == 0
    assert m.total("vllm:num_preemptions_total") >= 1
    assert m.total("vllm:num_requests_waiting") == 0
    assert 0 <= m.total("vllm:kv_cache_usage_perc") <= 1
    assert m.total("vllm:request_success_total", finished_reason="length") == seen["requests"]


def test_per_request_histograms(served):
    serve, seen = served
    m = settled(serve)
    requests = seen["requests"]
    for name in ("e2e_request_latency_seconds", "time_to_first_token_seconds", "request_queue_time_seconds",
                 "request_prefill_time_seconds", "request_decode_time_seconds", "request_inference_time_seconds",
                 "request_time_per_output_token_seconds", "request_prompt_tokens", "request_generation_tokens",
                 "request_params_max_tokens", "request_params_n", "request_prefill_kv_computed_tokens",
                 "request_num_preemptions"):  # fmt: skip
        assert m.total(f"vllm:{name}_count") == requests, name
    assert m.total("vllm:request_prompt_tokens_sum") == seen["prompt"]
    assert m.total("vllm:request_generation_tokens_sum") == seen["completion"]
    # max_tokens: 4, 4, 90 and 90 (once per attempt at a preemption), 3, 3;
    # n: 1 for the completions, 2 for each of the chat's two.
    assert m.total("vllm:request_params_max_tokens_sum") == seen["max_tokens"]
    assert m.total("vllm:request_params_n_sum") == seen["n"]
    assert m.total("vllm:request_num_preemptions_sum") == m.total("vllm:num_preemptions_total")
    assert m.total("vllm:request_prefill_kv_computed_tokens_sum") == seen["prompt"] - m.total(
        "vllm:prompt_tokens_cached_total"
    )
    # The engine's events time every phase: decode took time in the long requests.
    assert m.total("vllm:request_decode_time_seconds_sum") > 0
    assert m.total("vllm:request_inference_time_seconds_sum") >= m.total("vllm:request_decode_time_seconds_sum")
    assert (
        m.total("vllm:iteration_tokens_total_sum")
        == m.total("vllm:prompt_tokens_by_source_total", source="local_compute") + seen["completion"]
    )
    assert m.total("vllm:inter_token_latency_seconds_count") > 0


def test_http_requests_by_route_and_status(served):
    serve, seen = served
    m = settled(serve)
    answered = m.total("http_requests_total", status="2xx", method="POST")
    assert answered == seen["http"]
    assert m.total("http_requests_total", handler="/v1/completions", status="2xx") == seen["completions"] >= 4
    assert m.total("http_requests_total", handler="/v1/chat/completions", status="2xx") == 1
    assert m.total("http_requests_total", handler="none", status="4xx", method="GET") == 1
    # Scrapes and probes are not counted, as in vLLM.
    assert m.values("http_requests_total", handler="/metrics") == []
    assert m.total("http_request_duration_highr_seconds_count") == seen["http"] + 1
    assert m.total("http_request_duration_seconds_count", handler="/v1/completions") == seen["completions"]


def test_sleep_and_wake_up_are_timed(served):
    serve, _ = served
    m = settled(serve)
    for operation in ("sleep", "wake"):
        assert m.total("vllm:sleep_mode_operation_duration_seconds_count", operation=operation) == 1
        assert m.total("vllm:sleep_mode_operations_in_flight", operation=operation) == 0
    assert m.total("http_requests_total", handler="/sleep", status="2xx") == 1
