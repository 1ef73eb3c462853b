"""A mixture of experts against dense models through `serve`: does the MoE
cost its active parameters, not its total?

Three random-init checkpoints of one shape (bfloat16, `--dtype`), written with
transformers to a temporary folder (never kept), with a byte-level
tokenizer of 257 tokens so that the output head is a small part of a step:

  * `moe`: Qwen3-MoE, every layer sparse, `--experts` experts of
    `--expert-intermediate` each, top `--top-k` (default 8 experts of 1024,
    top 2; hidden 1024, 4 layers, 16 query / 4 key-value heads of 64);
  * `dense-active`: Qwen3 of the same shape whose MLP is top_k x the expert
    intermediate size: the parameters one token runs through in the MoE
    (less the router's hidden x experts per layer);
  * `dense-total`: Qwen3 whose MLP is experts x the expert intermediate
    size: the MoE's total parameters, the upper reference (`--no-total`
    leaves it out).

Each is served by `python -m vllm_rs serve DIR` (all three at once, each
engine on `--threads` intra-op threads, idle while another is measured), and
measured round after round in an order that alternates between rounds: 16
concurrent streams (one request each), then 1 stream (`--one-stream-
requests` one after another), random byte prompts of `--prompt-tokens`
(fresh each round, the same for every model), greedy, EOS ignored, exactly
`--output-tokens` tokens each (the native client of bench_models.py,
bench/clients/src/model_load.rs). Reported: output tok/s per model and
level, medians with min-max over the rounds, and each round's ratio
moe / dense-active and moe / dense-total; total and active parameter counts.
Raw numbers go to bench/results/moe.json (docs/real-model-speed.md, "A mixture
of experts against dense models", has the latest).

In bfloat16 all three run the native step (their weights read in place as
BF16 rows; a mixture of experts runs each expert once over the rows routed
to it, rust/kernels/src/experts.rs), as a user's half-precision checkpoint
or GGUF does; `--dtype float32` runs all three on the torch step
(layers/moe.py). Either way the ratios compare the MoE layer with the dense
MLP on the same executor.

Run: ~/.cache/vllm-rs/venv/bin/python bench/bench_moe.py [--rounds 5] [--threads N] [--dtype float32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.model_load import run_level  # noqa: E402
from bench.model_servers import serve_stack, stack_environment  # noqa: E402

#: The models, in the order of the first round.
MODELS = ("moe", "dense-active", "dense-total")
#: The byte-level tokenizer's vocabulary: 256 bytes and EOS.
VOCAB = 257
#: Sequence budget: a prompt, its outputs, room.
MAX_MODEL_LEN = 512
#: The load levels of a round: (key, concurrent streams).
LEVELS = (("tok_s_16", 16), ("tok_s_1", 1))


class BenchInputError(ValueError):
    """An option out of range (names it)."""


def shape(opts: argparse.Namespace) -> dict:
    """The config every model shares (Qwen3's names)."""
    return dict(
        vocab_size=VOCAB, hidden_size=opts.hidden, num_hidden_layers=opts.layers, num_attention_heads=opts.heads,
        num_key_value_heads=opts.kv_heads, head_dim=opts.hidden // opts.heads, max_position_embeddings=MAX_MODEL_LEN,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False, bos_token_id=None, eos_token_id=VOCAB - 1,
        pad_token_id=None, torch_dtype="float32",
    )  # fmt: skip


def hf_model(name: str, opts: argparse.Namespace):
    """Model `name` as a random-init transformers model (float32, seeded)."""
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "moe":
        config = transformers.Qwen3MoeConfig(
            **shape(opts), num_experts=opts.experts, num_experts_per_tok=opts.top_k,
            moe_intermediate_size=opts.expert_intermediate, intermediate_size=opts.expert_intermediate,
            decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        )  # fmt: skip
        return transformers.Qwen3MoeForCausalLM(config)
    experts = opts.top_k if name == "dense-active" else opts.experts
    config = transformers.Qwen3Config(**shape(opts), intermediate_size=experts * opts.expert_intermediate)
    return transformers.Qwen3ForCausalLM(config)


def parameter_counts(model, opts: argparse.Namespace) -> dict:
    """Total parameters, and the active ones: what one token runs through
    (of each layer's routed experts, top_k of them). The token embeddings
    count in both (a row of them is looked up per token)."""
    total = active = 0
    for name, p in model.named_parameters():
        total += p.numel()
        active += p.numel() * opts.top_k // opts.experts if ".mlp.experts." in name else p.numel()
    return {"total": total, "active": active}


def write_model(name: str, opts: argparse.Namespace, into: Path) -> tuple[Path, dict]:
    """Writes model `name` (safetensors, in `opts.dtype`) with the byte-level
    tokenizer to `into/name`; returns the folder and its parameter counts."""
    import torch

    from tests.support.hf_tokenizers import bytes_only_tokenizer, write_model_dir

    folder = into / name
    model = hf_model(name, opts)
    counts = parameter_counts(model, opts)
    model.to(getattr(torch, opts.dtype)).save_pretrained(folder, safe_serialization=True)
    write_model_dir(bytes_only_tokenizer(), folder)
    return folder, counts


def kv_cache_bytes(opts: argparse.Namespace) -> int:
    """A float32 KV cache for 16 sequences of MAX_MODEL_LEN tokens."""
    return 16 * MAX_MODEL_LEN * 2 * opts.layers * opts.kv_heads * (opts.hidden // opts.heads) * 4


@contextlib.contextmanager
def served(folder: Path, name: str, opts: argparse.Namespace, log_dir: Path):
    """`serve` on `folder`, its engine on `opts.threads` threads; yields its
    OpenAI base URL once it is ready."""
    args = ["--model", str(folder), "--served-model-name", name, "--device", "cpu",
            "--kv-cache-memory-bytes", str(kv_cache_bytes(opts)), "--max-model-len", str(MAX_MODEL_LEN)]  # fmt: skip
    with (
        stack_environment(opts.threads),
        serve_stack(*args, log_path=log_dir / f"moe-serve-{name}.log") as (port, _),
    ):
        yield f"http://127.0.0.1:{port}/v1"


def prompts(opts: argparse.Namespace, seed: int) -> dict:
    """A round's prompts: 16 for the 16 streams, the 1-stream ones, and a
    warm-up; byte ids (never EOS)."""
    rng = random.Random(seed)
    drawn = [
        [rng.randrange(VOCAB - 1) for _ in range(opts.prompt_tokens)] for _ in range(17 + opts.one_stream_requests)
    ]
    return {16: drawn[:16], 1: drawn[16:-1], "warmup": drawn[-1][:8]}


def measure(base_url: str, name: str, drawn: dict, opts: argparse.Namespace) -> dict:
    """One model's round: tok/s at each level."""
    out = {}
    for key, streams in LEVELS:
        level = asyncio.run(run_level(base_url, name, drawn[streams], streams, opts.output_tokens, drawn["warmup"]))
        out[key] = level.tokens_per_s
    return out


def summary(values: list[float]) -> dict:
    """Median, min and max."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(s: dict, digits: int = 1) -> str:
    """`median (min-max)`."""
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def run_bench(opts: argparse.Namespace, results: Path) -> dict:
    """Writes the models, serves them, runs every round; the results."""
    names = MODELS if opts.total else MODELS[:2]
    with tempfile.TemporaryDirectory(prefix="bench-moe-") as tmp, contextlib.ExitStack() as stack:
        urls, counts = {}, {}
        for name in names:
            print(f"writing and serving {name}", flush=True)
            folder, counts[name] = write_model(name, opts, Path(tmp))
            urls[name] = stack.enter_context(served(folder, name, opts, results))
        rounds = []
        for r in range(opts.rounds):
            drawn = prompts(opts, opts.seed * 1000 + r)
            order = list(names) if r % 2 == 0 else list(names)[::-1]
            row = {"load_average_before": os.getloadavg()[0]}
            row.update({name: measure(urls[name], name, drawn, opts) for name in order})
            rounds.append(row)
            print(f"round {r + 1} (load average {row['load_average_before']:.1f} before): " + "; ".join(
                f"{name} {row[name]['tok_s_16']:.1f} / {row[name]['tok_s_1']:.1f}" for name in names
            ) + " tok/s (16 streams / 1 stream)", flush=True)  # fmt: skip
    medians = {name: {key: summary([row[name][key] for row in rounds]) for key, _ in LEVELS} for name in names}
    ratios = {
        f"moe/{base}": {key: summary([row["moe"][key] / row[base][key] for row in rounds]) for key, _ in LEVELS}
        for base in names[1:]
    }
    return {"parameters": counts, "rounds": rounds, "medians": medians, "ratios": ratios,
            "options": vars(opts), "load_average": os.getloadavg()}  # fmt: skip


def report(out: dict) -> None:
    """The parameter counts and a markdown table of tok/s and ratios."""
    opts = out["options"]
    print(f"\n{opts['experts']} experts of {opts['expert_intermediate']}, top {opts['top_k']}; hidden "
          f"{opts['hidden']}, {opts['layers']} layers; {opts['threads']} threads, {opts['rounds']} rounds, "
          f"{opts['prompt_tokens']}-token prompts, {opts['output_tokens']} output tokens")  # fmt: skip
    for name, c in out["parameters"].items():
        print(f"  {name:13s} parameters: total {c['total'] / 1e6:.1f} M, active {c['active'] / 1e6:.1f} M")
    print("\n| model | 16 streams tok/s | 1 stream tok/s |")
    print("| --- | --- | --- |")
    for name, m in out["medians"].items():
        print(f"| {name} | {fmt(m['tok_s_16'])} | {fmt(m['tok_s_1'])} |")
    for label, r in out["ratios"].items():
        print(f"| {label} | {fmt(r['tok_s_16'], 2)}x | {fmt(r['tok_s_1'], 2)}x |")


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (sizes are checked: each at least 1, heads dividing
    the hidden size, top_k at most the experts)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--expert-intermediate", type=int, default=1024)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--one-stream-requests", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="the checkpoints' dtype: bfloat16 runs the native step, float32 the torch one")  # fmt: skip
    parser.add_argument("--no-total", dest="total", action="store_false", help="leave out dense-total")
    parser.add_argument("--results", default="moe.json", help="the results file's name in --results-dir")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "bench" / "results", help="(and serve's logs)")
    opts = parser.parse_args(argv)
    for name in ("rounds", "threads", "hidden", "layers", "heads", "kv_heads", "experts", "top_k",
                 "expert_intermediate", "prompt_tokens", "one_stream_requests"):  # fmt: skip
        if getattr(opts, name) < 1:
            raise BenchInputError(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(opts, name)}")
    if opts.output_tokens < 2:
        raise BenchInputError(f"--output-tokens: must be at least 2, got {opts.output_tokens}")
    if opts.hidden % opts.heads or opts.heads % opts.kv_heads:
        raise BenchInputError(f"--heads {opts.heads} must divide --hidden {opts.hidden} and be a multiple of "
                              f"--kv-heads {opts.kv_heads}")  # fmt: skip
    if opts.top_k > opts.experts:
        raise BenchInputError(f"--top-k {opts.top_k} is more than --experts {opts.experts}")
    if opts.prompt_tokens + opts.output_tokens > MAX_MODEL_LEN:
        raise BenchInputError(f"--prompt-tokens + --output-tokens must fit {MAX_MODEL_LEN} tokens")
    return opts


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; prints the table, writes RESULTS_DIR/RESULTS."""
    try:
        opts = parse_options(argv)
    except BenchInputError as e:
        print(f"bench_moe.py: {e}", file=sys.stderr)
        return 2
    # Ended by a signal, it still stops its servers (each `serve` runs in a
    # session of its own, so nothing else would).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    opts.results_dir.mkdir(parents=True, exist_ok=True)
    out = run_bench(opts, opts.results_dir)
    (opts.results_dir / opts.results).write_text(json.dumps(out, indent=1, default=str))
    report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
