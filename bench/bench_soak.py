"""Soak: `serve` under 16 users for 20 minutes, with clients that misbehave.

One `python -m vllm_rs serve` of the packaged SmolLM2 with a small KV cache
(so long requests preempt others), and `--users` client threads until the
time is up. Each user, with its own seeded random choice per request:
- streams a chat completion that shares a long system prompt with every
  other user's (prefix-cache hits) and reads it to `[DONE]`;
- streams one and drops the connection after a few chunks (a disconnect
  mid-stream: the frontend must abort it in the engine);
- sends one and drops the connection before any answer (an abort before
  the first token);
- asks for a long completion of a long prompt (the KV cache cannot hold 16
  of them: the scheduler preempts and resumes).
A request that was not dropped on purpose and did not end with a finish
reason and `[DONE]` is **lost**. Every `--sample-s` seconds: the RSS of
every process of the stack, and the frontend's `/metrics` gauges (KV cache
usage, running, waiting, preemptions). After the users stop: the stack must
drain to 0 running, 0 waiting and 0 KV usage.

Targets (the first-contact issue): 0 requests lost, RSS growth < 5% from
the end of the warm-up (the first `--warmup-s`) to the end, KV usage 0 at
the end. The series and the summary go to bench/results/soak.json, a plot
of RSS and KV usage over time to bench/results/soak.svg.

Run: ~/.cache/vllm-rs/venv/bin/python bench/bench_soak.py
     [--minutes 20] [--users 16] [--gguf PATH] [--seed 0]"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_models import packaged_smollm2, tree_rss_bytes  # noqa: E402
from bench.model_servers import serve_stack  # noqa: E402

#: The model name the stack answers to.
MODEL = "smollm2"
#: KV cache: 256 blocks of 16 tokens hold 4,096 tokens, a quarter of what
#: 16 long requests (about 1,000 tokens each) need at once.
KV_CACHE_BYTES = 256 * 16 * 30 * 2 * 3 * 64 * 2
#: The longest sequence: a long request fits, alone.
MAX_MODEL_LEN = 2048
#: Shared by every user's chat request: the prefix cache's hits.
SYSTEM_PROMPT = "You are a patient assistant who answers questions about gardening. " * 12
#: How long the stack may take to drain after the users stop.
DRAIN_TIMEOUT_S = 300
#: The actions a user picks from, with their weights.
ACTIONS = {"complete": 5, "disconnect": 2, "abort": 1, "long": 2}


class Tally:
    """Request outcomes across users, thread-safe."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lost: list[str] = []
        self._lock = threading.Lock()

    def add(self, outcome: str, lost_reason: str | None = None) -> None:
        with self._lock:
            self.counts[outcome] += 1
            if lost_reason is not None:
                self.lost.append(lost_reason)


def chat_body(messages: list[dict], max_tokens: int, seed: int) -> str:
    """A streamed chat completion request."""
    return json.dumps({"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True,
                       "temperature": 0.8, "seed": seed})  # fmt: skip


def stream(port: int, body: str, stop_after_chunks: int | None) -> str | None:
    """Sends `body` to /v1/chat/completions and reads the stream: returns
    None when it ended with a finish reason and `[DONE]` (or was dropped on
    purpose after `stop_after_chunks` chunks), else why it was lost."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        if stop_after_chunks == 0:
            return None  # dropped before any answer: the connection closes below
        response = conn.getresponse()
        if response.status != 200:
            return f"HTTP {response.status}: {response.read()[:200]!r}"
        chunks, finished = 0, False
        for line in response:
            if line.startswith(b"data: [DONE]"):
                return None if finished else "[DONE] without a finish reason"
            if line.startswith(b"data: {"):
                chunks += 1
                event = json.loads(line[6:])
                if "error" in event:
                    return f"error event: {event['error']}"
                finished = finished or any(c.get("finish_reason") for c in event.get("choices", []))
                if stop_after_chunks is not None and chunks >= stop_after_chunks:
                    return None
        return f"stream ended after {chunks} chunks without [DONE]"
    except (OSError, http.client.HTTPException) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def user(index: int, port: int, deadline: float, seed: int, tally: Tally) -> None:
    """One user's requests until `deadline`."""
    rng = random.Random(seed * 1000 + index)
    names, weights = list(ACTIONS), list(ACTIONS.values())
    n = 0
    while time.monotonic() < deadline:
        n += 1
        action = rng.choices(names, weights)[0]
        question = f"User {index}, question {n}: how often should I water {rng.choice(['basil', 'roses', 'figs'])}?"
        if action == "long":
            story = " ".join(f"Chapter {i} of a long story about a garden." for i in range(60))
            body = chat_body([{"role": "user", "content": story + " Continue it."}], 600, rng.randrange(1 << 30))
        else:
            messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
            body = chat_body(messages, rng.randint(16, 128), rng.randrange(1 << 30))
        stop_after = {"disconnect": rng.randint(1, 8), "abort": 0}.get(action)
        lost = stream(port, body, stop_after)
        tally.add(action if lost is None else "lost", None if lost is None else f"{action}: {lost}")


METRIC = re.compile(rb"^(vllm:[a-z_]+)(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)
#: The gauges and counters each sample keeps (summed over label sets).
SAMPLED = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
)


def metrics(port: int) -> dict[str, float]:
    """The SAMPLED series from the frontend's /metrics now."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read()
    finally:
        conn.close()
    values: dict[str, float] = dict.fromkeys(SAMPLED, 0.0)
    for name, value in METRIC.findall(text):
        if name.decode() in values:
            values[name.decode()] += float(value)
    return values


def sample(port: int, serve_pid: int, started: float) -> dict:
    """One point of the series: seconds since start, RSS of the stack, the metrics."""
    return {"t": round(time.monotonic() - started, 1), "rss": tree_rss_bytes(serve_pid), **metrics(port)}


def drain(port: int) -> dict[str, float]:
    """Polls /metrics until nothing runs or waits and the KV cache is empty,
    or DRAIN_TIMEOUT_S passes; returns the last reading."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        now = metrics(port)
        idle = now["vllm:num_requests_running"] == 0 and now["vllm:num_requests_waiting"] == 0
        if (idle and now["vllm:kv_cache_usage_perc"] == 0) or time.monotonic() > deadline:
            return now
        time.sleep(1)  # polling the server's own gauges; there is nothing to wait on


def svg_plot(series: list[dict], path: Path) -> None:
    """RSS (MiB, left axis) and KV cache usage (%, right axis) over time, as an SVG."""
    width, height, pad = 800, 320, 50
    t_max = max(p["t"] for p in series) or 1
    rss = [p["rss"] / 2**20 for p in series]
    rss_lo, rss_hi = 0.0, max(rss) * 1.1

    def x(t: float) -> float:
        return pad + (width - 2 * pad) * t / t_max

    def y(v: float, hi: float) -> float:
        return height - pad - (height - 2 * pad) * v / hi

    rss_line = " ".join(f"{x(p['t']):.1f},{y(r - rss_lo, rss_hi):.1f}" for p, r in zip(series, rss, strict=True))
    kv_line = " ".join(f"{x(p['t']):.1f},{y(p['vllm:kv_cache_usage_perc'] * 100, 100):.1f}" for p in series)
    labels = [
        f'<text x="{pad}" y="20">whole-stack RSS (MiB, blue, 0-{rss_hi:.0f}) and KV cache usage (%, orange, 0-100) '
        f"over {t_max / 60:.0f} min</text>",
        f'<text x="{pad}" y="{height - 15}">0 s</text>',
        f'<text x="{width - pad - 40}" y="{height - 15}">{t_max:.0f} s</text>',
    ]
    path.write_text(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="12">'
        f'<rect x="{pad}" y="{pad}" width="{width - 2 * pad}" height="{height - 2 * pad}" fill="none" stroke="#999"/>'
        f'<polyline points="{rss_line}" fill="none" stroke="#1f77b4" stroke-width="2"/>'
        f'<polyline points="{kv_line}" fill="none" stroke="#ff7f0e" stroke-width="1"/>' + "".join(labels) + "</svg>\n"
    )


def main() -> int:
    """Runs the soak; prints the summary and whether each target is met."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample-s", type=float, default=5)
    parser.add_argument("--warmup-s", type=float, default=120)
    opts = parser.parse_args()
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    gguf = opts.gguf or packaged_smollm2()
    args = ["--model", str(gguf), "--served-model-name", MODEL, "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
            "--max-model-len", str(MAX_MODEL_LEN), "--enable-prefix-caching"]  # fmt: skip
    tally, series = Tally(), []
    with serve_stack(*args, log_path=results / "soak-serve.log", log_stats=True) as (port, serve_pid):
        started = time.monotonic()
        deadline = started + opts.minutes * 60
        users = [threading.Thread(target=user, args=(i, port, deadline, opts.seed, tally)) for i in range(opts.users)]
        for u in users:
            u.start()
        while any(u.is_alive() for u in users):
            series.append(sample(port, serve_pid, started))
            for u in users:
                u.join(timeout=max(0.0, opts.sample_s / len(users)))
        final = drain(port)
        series.append(sample(port, serve_pid, started))
    warm = [p for p in series if p["t"] >= opts.warmup_s] or series
    growth = (series[-1]["rss"] - warm[0]["rss"]) / warm[0]["rss"]
    summary = {
        "minutes": opts.minutes, "users": opts.users, "outcomes": dict(tally.counts), "lost": tally.lost,
        "rss_after_warmup_mib": warm[0]["rss"] / 2**20, "rss_end_mib": series[-1]["rss"] / 2**20,
        "rss_growth": growth, "rss_max_mib": max(p["rss"] for p in series) / 2**20,
        "kv_usage_end": final["vllm:kv_cache_usage_perc"], "running_end": final["vllm:num_requests_running"],
        "waiting_end": final["vllm:num_requests_waiting"], "preemptions": final["vllm:num_preemptions_total"],
    }  # fmt: skip
    (results / "soak.json").write_text(json.dumps({"summary": summary, "series": series}, indent=1))
    svg_plot(series, results / "soak.svg")
    print(json.dumps(summary, indent=1))
    checks = {
        "requests lost 0": not tally.lost,
        "RSS growth after warm-up < 5%": growth < 0.05,
        "KV usage 0 at the end": final["vllm:kv_cache_usage_perc"] == 0,
        "nothing running or waiting at the end": final["vllm:num_requests_running"] == 0
        and final["vllm:num_requests_waiting"] == 0,
    }
    for name, ok in checks.items():
        print(f"{'met' if ok else 'NOT MET'}: {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
