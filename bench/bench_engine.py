"""Engine-core benchmark on the built-in models (`toy`, `echo`): this tree's
reference engine against the same engine at a baseline git revision, in one
run, so that a change to the engine (the real-model runner replaced the toy
runner) shows any regression on the small models the frontend benchmarks use.

Each side runs in a child process of its own (`python bench/bench_engine.py
--child`, its own threads and memory), with PYTHONPATH at that tree's
`python/`: the baseline is checked out with `git worktree add --detach` into
a private temporary folder and removed afterwards; both use this tree's
compiled `_core` extension (the engine itself is Python). The two sides
alternate within every round (which goes first alternates too). Rows, per
model and concurrency (1 and 16 requests in flight, a closed loop of
`max_tokens` greedy tokens each, prefix caching off so that every round does
the same work): output tokens/s and the median engine step in ms; the ratio
is this tree / baseline (higher is better for tokens/s), by the wall clock
and by the CPU time of the engine's thread (the steadier of the two where
other work shares the machine).

The baseline defaults to ea373f3, the last commit with the toy runner
(before the one runner for toy and real models). Where the revision is not
in the clone (a shallow clone), the baseline is skipped with the reason.

Run: ~/.cache/vllm-rs/venv/bin/python bench/bench_engine.py [--quick] [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "ea373f3"
MODELS = ("toy", "echo")
CONCURRENCY = (1, 16)
#: Requests per slot in flight: an `echo` step costs about 10 us, so it
#: runs ten times the requests of `toy` to last long enough (a few hundred
#: ms a run) that the machine's noise does not make the ratio.
REQUESTS_PER_SLOT = {"toy": 4, "echo": 40}


def child(spec: dict) -> dict:
    """Drives `EngineCore` of whichever tree is on sys.path: `concurrency`
    requests in flight, each replaced when it finishes, `requests` in all;
    returns tokens/s (wall clock and CPU time of this thread, the only one
    that runs the engine with one intra-op thread) and the median step time."""
    import torch
    from vllm_rs.engine import make_engine_config
    from vllm_rs.engine.core import EngineCore
    from vllm_rs.engine.protocol import EngineCoreRequest

    torch.set_num_threads(1)
    config = make_engine_config(spec["model"], device="cpu", log_stats=False, enable_prefix_caching=False)
    core = EngineCore(config)
    params = {"temperature": 0.0, "max_tokens": spec["tokens"], "min_tokens": spec["tokens"], "ignore_eos": True}
    prompt = list(range(10, 10 + spec["prompt_len"]))
    submitted = 0

    def submit() -> None:
        nonlocal submitted
        request = EngineCoreRequest(f"r{submitted}", prompt, dict(params))
        submitted += 1
        if core.add_request(request) is not None:
            raise RuntimeError(f"the engine refused request {submitted}")

    for _ in range(min(spec["concurrency"], spec["requests"])):
        submit()
    steps, tokens = [], 0
    started, cpu_started = time.perf_counter(), time.thread_time()
    while core.has_work():
        before = time.perf_counter()
        outputs = core.step()
        steps.append(time.perf_counter() - before)
        for _client, output in outputs:
            tokens += len(output.new_token_ids)
            if output.finish_reason is not None and submitted < spec["requests"]:
                submit()
    elapsed, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
    expected = spec["requests"] * spec["tokens"]
    if tokens != expected:
        raise RuntimeError(f"{tokens} tokens came out, {expected} expected")
    return {"tokens_per_s": tokens / elapsed, "cpu_tokens_per_s": tokens / cpu,
            "step_ms": statistics.median(steps) * 1000}  # fmt: skip


def run_side(python_dir: Path, spec: dict) -> dict:
    """One measurement in a child process with `python_dir` first on its path."""
    env = dict(os.environ, PYTHONPATH=str(python_dir), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, __file__, "--child"], input=json.dumps(spec), env=env,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"engine run in {python_dir} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def checkout_baseline(revision: str, into: Path) -> Path | str:
    """The baseline tree's python/ folder with this tree's `_core` extension
    copied in, or the reason there is none."""
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{revision}^{{commit}}"],
                           capture_output=True, check=False)  # fmt: skip
    if known.returncode != 0:
        return f"revision {revision} is not in this clone (shallow?)"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(into), revision], check=True)
    for extension in (ROOT / "python" / "vllm_rs").glob("_core*.so"):
        shutil.copy2(extension, into / "python" / "vllm_rs" / extension.name)
    return into / "python"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round, fewer requests")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.load(sys.stdin))))
        return 0
    rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="vllm-rs-bench-engine-") as tmp:
        os.chmod(tmp, 0o700)
        baseline = checkout_baseline(args.baseline, Path(tmp) / "baseline")
        try:
            sides = {"this tree": ROOT / "python"}
            if isinstance(baseline, Path):
                sides[f"baseline {args.baseline}"] = baseline
            else:
                print(f"baseline skipped: {baseline}")
            results = measure(sides, rounds, args.quick)
        finally:
            if isinstance(baseline, Path):
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline.parent)],
                               check=False)  # fmt: skip
    report(results, list(sides))
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "engine.json").write_text(json.dumps(results, indent=1))
    return 0


def measure(sides: dict[str, Path], rounds: int, quick: bool) -> dict:
    """{model/concurrency: {side: [round results]}}, sides alternating."""
    results: dict[str, dict[str, list[dict]]] = {}
    for model in MODELS:
        for concurrency in CONCURRENCY:
            key = f"{model}, {concurrency} in flight"
            spec = {"model": model, "concurrency": concurrency, "prompt_len": 32,
                    "tokens": 32 if quick else 64,
                    "requests": concurrency * REQUESTS_PER_SLOT[model] // (2 if quick else 1)}  # fmt: skip
            results[key] = {side: [] for side in sides}
            for round_ in range(rounds):
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for side in order:
                    results[key][side].append(run_side(sides[side], spec))
    return results


def report(results: dict, sides: list[str]) -> None:
    """Median of the rounds per side, and the ratios this tree / baseline
    (wall clock, and CPU time: on a loaded machine the wall clock of a short
    run mostly measures how often the OS took the CPU away)."""
    for key, by_side in results.items():
        medians = {
            side: {
                m: statistics.median(r[m] for r in by_side[side])
                for m in ("tokens_per_s", "cpu_tokens_per_s", "step_ms")
            }
            for side in sides
        }
        line = "  ".join(f"{side}: {v['tokens_per_s']:9.1f} tok/s, step {v['step_ms']:6.2f} ms"
                         for side, v in medians.items())  # fmt: skip
        if len(sides) == 2:
            ratio = medians[sides[0]]["tokens_per_s"] / medians[sides[1]]["tokens_per_s"]
            cpu_ratio = medians[sides[0]]["cpu_tokens_per_s"] / medians[sides[1]]["cpu_tokens_per_s"]
            line += f"  ratio {ratio:.2f}x (CPU time {cpu_ratio:.2f}x)"
        print(f"{key:22s} {line}")


if __name__ == "__main__":
    sys.exit(main())
