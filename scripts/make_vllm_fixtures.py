"""Writes the golden vLLM 0.33 wire fixtures under tests/fixtures/vllm-0.33/.

Run it with the Python of a virtual environment that has vLLM 0.33.0 (never
the project's own):

    python3 -m venv ~/.cache/vllm033 && ~/.cache/vllm033/bin/pip install vllm==0.33.0
    ~/.cache/vllm033/bin/python scripts/make_vllm_fixtures.py

Every message is built from vLLM's own classes and encoded with vLLM's own
encoders (`MsgpackEncoder` for what goes over the engine sockets,
`msgspec.msgpack.encode` for the ready response, as vLLM's engine core does),
so the tests can check this project's engine and frontends against vLLM
without vLLM installed. `manifest.json` lists every file with what it holds
and the values the tests expect from it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

# vLLM's argument parser infers a device; on a machine without a GPU it can
# only infer the CPU platform when told to (nothing here needs a device).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import msgspec  # noqa: E402
import vllm
from vllm.outputs import RequestError
from vllm.sampling_params import SamplingParams
from vllm.v1.engine import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreReadyResponse,
    EngineCoreRequest,
    FinishReason,
    UtilityOutput,
)
from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerIterationDetails, SchedulerStats
from vllm.v1.serial_utils import MsgpackEncoder, UtilityResult

CHECKED_VERSION = "0.33.0"
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-0.33"
#: A monotonic timestamp (vLLM's engine core stamps outputs with time.monotonic()).
MONOTONIC = 12345.678


def ready_response() -> EngineCoreReadyResponse:
    """What an engine like `serve --model toy` registers with (all fields)."""
    return EngineCoreReadyResponse(
        max_model_len=2048,
        num_gpu_blocks=512,
        block_size=16,
        dp_stats_address=None,
        dtype="float32",
        vllm_version=vllm.__version__,
        world_size=1,
        data_parallel_size=1,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        decode_context_parallel_size=1,
        data_parallel_rank=0,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        instance_id="fixture-instance",
        supports_lora=False,
        max_loras=0,
        kv_cache_size_tokens=8192,
        kv_cache_max_concurrency=4.0,
        effective_attention_block_size=16,
    )


def outputs_messages() -> dict[str, tuple[EngineCoreOutputs, str]]:
    """One message of every kind an engine sends on its output socket."""
    stats = SchedulerStats(
        num_running_reqs=2,
        num_waiting_reqs=1,
        step_counter=7,
        kv_cache_usage=0.25,
        prefix_cache_stats=PrefixCacheStats(requests=1, queries=32, hits=16),
        iteration_details=SchedulerIterationDetails(
            iteration_index=3,
            num_ctx_requests=1,
            num_ctx_tokens=5,
            num_generation_requests=1,
            num_generation_tokens=1,
            elapsed_ms=1.5,
        ),  # fmt: skip
    )
    queued = EngineCoreEvent(EngineCoreEventType.QUEUED, MONOTONIC - 0.5)
    scheduled = EngineCoreEvent(EngineCoreEventType.SCHEDULED, MONOTONIC - 0.25)
    return {
        "outputs_tokens": (
            EngineCoreOutputs(
                0, [EngineCoreOutput("r1", [72, 105]), EngineCoreOutput("r2", [33])], timestamp=MONOTONIC
            ),
            "two requests' new tokens, nothing else",
        ),
        "outputs_first_token_events": (
            EngineCoreOutputs(
                0,
                [EngineCoreOutput("r1", [72], events=[queued, scheduled])],
                scheduler_stats=stats,
                timestamp=MONOTONIC,
            ),
            "a request's first token with its QUEUED and SCHEDULED events, and the step's scheduler stats",
        ),
        "outputs_finish_length": (
            EngineCoreOutputs(
                1,
                [EngineCoreOutput("r1", [65], finish_reason=FinishReason.LENGTH)],
                timestamp=MONOTONIC,
                finished_requests={"r1"},
            ),  # fmt: skip
            "the last token of a request that hit max_tokens, from engine 1, with finished_requests",
        ),
        "outputs_finish_stop_token": (
            EngineCoreOutputs(
                0, [EngineCoreOutput("r1", [7], finish_reason=FinishReason.STOP, stop_reason=7)], timestamp=MONOTONIC
            ),
            "a stop token id: finish STOP, stop_reason the token",
        ),
        "outputs_finish_eos": (
            EngineCoreOutputs(0, [EngineCoreOutput("r1", [256], finish_reason=FinishReason.STOP)], timestamp=MONOTONIC),
            "EOS: finish STOP, stop_reason nil",
        ),
        "outputs_request_error": (
            EngineCoreOutputs(
                0,
                [
                    EngineCoreOutput(
                        "bad",
                        [],
                        finish_reason=FinishReason.ERROR,
                        error=RequestError(code="validation_error", message="the prompt is too long"),
                    )
                ],
                timestamp=MONOTONIC,
                finished_requests={"bad"},
            ),  # fmt: skip
            "a request the engine rejected: ERROR with a RequestError, as _handle_request_validation_error sends it",
        ),
        "outputs_abort": (
            EngineCoreOutputs(
                0,
                [EngineCoreOutput("r1", [], finish_reason=FinishReason.ABORT)],
                timestamp=MONOTONIC,
                finished_requests={"r1"},
            ),  # fmt: skip
            "an abort reported by the engine (pause or shutdown)",
        ),
        "outputs_scheduler_stats": (
            EngineCoreOutputs(0, scheduler_stats=SchedulerStats(), timestamp=MONOTONIC),
            "stats only (an idle engine): SchedulerStats with every default",
        ),
        "outputs_utility_result": (
            EngineCoreOutputs(0, utility_output=UtilityOutput(5, result=UtilityResult(True)), timestamp=MONOTONIC),
            "a utility reply with a result (reset_prefix_cache -> True)",
        ),
        "outputs_utility_none": (
            EngineCoreOutputs(0, utility_output=UtilityOutput(6, result=UtilityResult(None)), timestamp=MONOTONIC),
            "a utility reply of a method returning None (sleep)",
        ),
        "outputs_utility_failure": (
            EngineCoreOutputs(
                0,
                utility_output=UtilityOutput(
                    7, failure_message="Call to nope method failed: 'EngineCoreProc' object has no attribute 'nope'"
                ),
                timestamp=MONOTONIC,
            ),
            "a failed utility call, with vLLM's message shape",
        ),
        "outputs_wave_complete": (
            EngineCoreOutputs(0, wave_complete=3, timestamp=MONOTONIC),
            "a data-parallel wave message",
        ),
    }


def sampling(eos: int | None = 256, **kwargs: Any) -> SamplingParams:
    """SamplingParams as vLLM's input processor hands them to the engine:
    `_eos_token_id` and `_all_stop_token_ids` filled in."""
    params = SamplingParams(**kwargs)
    if eos is not None:
        params._eos_token_id = eos
        params._all_stop_token_ids.add(eos)
    return params


#: name -> (sampling params, what the engine must do with them)
REQUEST_CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "request_defaults": ({}, {"max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_tokens": 0}),
    "request_max_tokens_16_omitted": ({"max_tokens": 16}, {"max_tokens": 16}),
    "request_max_tokens_none": ({"max_tokens": None}, {"max_tokens": None}),
    "request_greedy": ({"temperature": 0.0, "max_tokens": 5}, {"max_tokens": 5, "temperature": 0.0}),
    "request_sampled": (
        {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 1234, "max_tokens": 8},
        {"max_tokens": 8, "temperature": 0.8, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 1234},
    ),
    "request_stop_tokens_min_tokens": (
        {"stop_token_ids": [7, 9], "min_tokens": 2, "max_tokens": 20},
        {"max_tokens": 20, "stop_token_ids": [7, 9], "min_tokens": 2},
    ),
    "request_ignore_eos": ({"ignore_eos": True, "max_tokens": 4}, {"max_tokens": 4, "ignore_eos": True}),
    "request_penalties_logit_bias": (
        {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.2, "logit_bias": {65: 2.0}},
        {"max_tokens": 16},
    ),
    "request_stop_strings_logprobs": (
        {"stop": ["\n\n"], "logprobs": 2, "max_tokens": 3},
        {"max_tokens": 3},
    ),
}


def requests() -> dict[str, tuple[EngineCoreRequest, dict[str, Any], dict[str, Any]]]:
    """ADD payloads as vLLM's frontend encodes them."""
    out = {}
    for index, (name, (kwargs, expect)) in enumerate(REQUEST_CASES.items()):
        request = EngineCoreRequest(
            request_id=f"cmpl-{index:04d}-0000abcd",
            prompt_token_ids=list(b"Hello, world"),
            mm_features=None,
            sampling_params=sampling(**kwargs),
            pooling_params=None,
            arrival_time=1767225600.0 + index,
            lora_request=None,
            cache_salt="salt" if name == "request_sampled" else None,
            data_parallel_rank=None,
            client_index=0,
            external_req_id=f"cmpl-{index:04d}",
        )
        out[name] = (request, {k: repr(v) for k, v in kwargs.items()}, expect)
    return out


#: Token ids of the end of sequence of the two test tokenizers: the Rust
#: frontend's byte-BPE fixture (258) and the built-in byte-level one (256).
TOKENIZER_EOS_IDS = (256, 258)
#: The `max_model_len` the generation-config cases assume (large enough that
#: no expected `max_tokens` depends on the prompt's length).
GENERATION_MAX_MODEL_LEN = 1000
#: A Llama-3-like generation config: EOS plus one more end-of-turn id, and sampling defaults.
_LLAMA3_LIKE = {"eos_token_id": ["EOS", 10], "temperature": 0.6, "top_p": 0.9, "top_k": 20, "do_sample": True}

#: name -> the model directory's generation_config.json ("EOS" stands for the
#: tokenizer's EOS id), `generation_config` (`folder` means a second folder
#: holding `folder_config`), `override_generation_config`, endpoint and body.
GENERATION_CASES: dict[str, dict[str, Any]] = {
    "auto_extra_eos_and_defaults": {
        "model_config": _LLAMA3_LIKE,
        "mode": "auto",
        "override": {},
        "endpoint": "completions",
        "body": {"prompt": "hi", "max_tokens": 5},
    },
    "auto_request_values_win": {
        "model_config": _LLAMA3_LIKE,
        "mode": "auto",
        "override": {},
        "endpoint": "completions",
        "body": {"prompt": "hi", "max_tokens": 5, "temperature": 0.2, "top_k": 5, "stop_token_ids": [7, 10]},
    },
    "auto_ignore_eos": {
        "model_config": _LLAMA3_LIKE,
        "mode": "auto",
        "override": {},
        "endpoint": "chat",
        "body": {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "ignore_eos": True,
            "stop_token_ids": [7],
        },
    },
    "auto_max_new_tokens_is_the_chat_default": {
        "model_config": {"eos_token_id": "EOS", "max_new_tokens": 6, "repetition_penalty": 1.1, "min_p": 0.05},
        "mode": "auto",
        "override": {},
        "endpoint": "chat",
        "body": {"messages": [{"role": "user", "content": "hi"}]},
    },
    "auto_completion_keeps_16": {
        "model_config": {"eos_token_id": "EOS", "max_new_tokens": 6},
        "mode": "auto",
        "override": {"presence_penalty": 0.5, "frequency_penalty": 0.25},
        "endpoint": "completions",
        "body": {"prompt": "hi"},
    },
    "vllm_mode_keeps_eos_ids_and_override_caps": {
        "model_config": _LLAMA3_LIKE,
        "mode": "vllm",
        "override": {"temperature": 0.5, "max_new_tokens": 4},
        "endpoint": "completions",
        "body": {"prompt": "hi", "max_tokens": 10},
    },
    "vllm_mode_override_is_the_chat_default": {
        "model_config": _LLAMA3_LIKE,
        "mode": "vllm",
        "override": {"temperature": 0.5, "max_new_tokens": 4},
        "endpoint": "chat",
        "body": {"messages": [{"role": "user", "content": "hi"}]},
    },
    "folder_caps_and_replaces_the_model_config": {
        "model_config": _LLAMA3_LIKE,
        "mode": "folder",
        "folder_config": {"max_new_tokens": 3, "temperature": 0.7, "eos_token_id": [11]},
        "override": {},
        "endpoint": "chat",
        "body": {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10},
    },
}


def _with_eos(config: dict[str, Any], eos: int) -> dict[str, Any]:
    def sub(v: Any) -> Any:
        return eos if v == "EOS" else [sub(x) for x in v] if isinstance(v, list) else v

    return {k: sub(v) for k, v in config.items()}


def generation_requests() -> dict[str, tuple[EngineCoreRequest, dict[str, Any]]]:
    """ADD payloads vLLM's OpenAI server builds for each case, through vLLM's
    own code: `ModelConfig.get_diff_sampling_param` and
    `try_get_generation_config` on the case's folders, `get_max_tokens`, the
    request's `to_sampling_params`, and the input processor's
    `update_from_generation_config` with the tokenizer's EOS."""
    import tempfile
    from types import SimpleNamespace

    from vllm.config.model import ModelConfig
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.serve.utils.api_utils import get_max_tokens

    out = {}
    for case_name, case in GENERATION_CASES.items():
        for eos in TOKENIZER_EOS_IDS:
            with tempfile.TemporaryDirectory() as tmp:
                model_dir = Path(tmp, "model")
                model_dir.mkdir()
                (model_dir / "generation_config.json").write_text(json.dumps(_with_eos(case["model_config"], eos)))
                mode = case["mode"]
                if mode == "folder":
                    folder = Path(tmp, "folder")
                    folder.mkdir()
                    (folder / "generation_config.json").write_text(json.dumps(_with_eos(case["folder_config"], eos)))
                    mode = str(folder)
                config = SimpleNamespace(
                    generation_config=mode, override_generation_config=dict(case["override"]),
                    hf_config_path=None, model=str(model_dir), trust_remote_code=False, _hf_config_revision=None,
                    revision=None, code_revision=None, config_format="auto", hf_token=None,
                )  # fmt: skip
                config.try_get_generation_config = lambda c=config: ModelConfig.try_get_generation_config(c)
                defaults = ModelConfig.get_diff_sampling_param(config)
                fields = ModelConfig.try_get_generation_config(config)
            override_max_tokens = (
                defaults.get("max_tokens")
                if case["mode"] not in ("auto", "vllm")
                else case["override"].get("max_new_tokens")
            )
            body = {"model": "m", **case["body"]}
            chat = case["endpoint"] == "chat"
            request = ChatCompletionRequest(**body) if chat else CompletionRequest(**body)
            requested = (request.max_completion_tokens or request.max_tokens) if chat else request.max_tokens
            prompt_len = 3
            max_tokens = get_max_tokens(GENERATION_MAX_MODEL_LEN, requested, prompt_len, defaults, override_max_tokens)
            params = request.to_sampling_params(max_tokens, defaults)
            params.update_from_generation_config(fields, eos)
            name = f"genconfig_{case_name}_eos{eos}"
            out[name] = (
                EngineCoreRequest(
                    request_id=f"{name}-0000abcd",
                    prompt_token_ids=[104, 105, 10],
                    mm_features=None,
                    sampling_params=params,
                    pooling_params=None,
                    arrival_time=1767225600.0,
                    lora_request=None,
                    cache_salt=None,
                    data_parallel_rank=None,
                    client_index=0,
                    external_req_id=name,
                ),  # fmt: skip
                {
                    "case": case_name,
                    "tokenizer_eos_token_id": eos,
                    "max_model_len": GENERATION_MAX_MODEL_LEN,
                    "model_generation_config": _with_eos(case["model_config"], eos),
                    "folder_generation_config": _with_eos(case.get("folder_config", {}), eos),
                    "generation_config": case["mode"],
                    "override_generation_config": case["override"],
                    "endpoint": case["endpoint"],
                    "body": case["body"],
                    "expect": {
                        "max_tokens": params.max_tokens,
                        "eos_token_id": params._eos_token_id,
                        "stop_token_ids": sorted(params.stop_token_ids),
                        "all_stop_token_ids": sorted(params._all_stop_token_ids),
                        "temperature": params.temperature,
                        "top_p": params.top_p,
                        "top_k": params.top_k,
                        "min_p": params.min_p,
                        "repetition_penalty": params.repetition_penalty,
                        "presence_penalty": params.presence_penalty,
                        "frequency_penalty": params.frequency_penalty,
                        "ignore_eos": params.ignore_eos,
                    },
                },
            )
    return out


#: Realistic `vllm serve` command lines (after `vllm serve`).
SERVE_COMMAND_LINES = {
    "plain": ["Qwen/Qwen3-0.6B"],
    "port_host_served_names": [
        "Qwen/Qwen3-0.6B",
        "--host",
        "127.0.0.1",
        "--port",
        "8001",
        "--served-model-name",
        "qwen",
        "qwen-small",
    ],
    "chat_template": [
        "meta-llama/Llama-3.1-8B-Instruct",
        "--chat-template",
        "/etc/templates/llama.jinja",
        "--max-model-len",
        "8192",
    ],
    "tls": [
        "Qwen/Qwen3-0.6B",
        "--ssl-keyfile",
        "/etc/tls/key.pem",
        "--ssl-certfile",
        "/etc/tls/cert.pem",
        "--ssl-ca-certs",
        "/etc/tls/ca.pem",
    ],
    "cors": [
        "Qwen/Qwen3-0.6B",
        "--allowed-origins",
        '["https://example.com"]',
        "--allow-credentials",
        "--allowed-methods",
        '["GET", "POST"]',
        "--allowed-headers",
        '["Authorization"]',
    ],
    "data_parallel": ["Qwen/Qwen3-0.6B", "--data-parallel-size", "4", "--api-server-count", "1"],
    "generation_config": [
        "Qwen/Qwen3-0.6B",
        "--generation-config",
        "vllm",
        "--override-generation-config",
        '{"temperature": 0.5, "max_new_tokens": 64}',
    ],
    "api_key": ["Qwen/Qwen3-0.6B", "--api-key", "sk-fixture-secret"],
    "uds_root_path": ["Qwen/Qwen3-0.6B", "--uds", "/run/vllm.sock", "--root-path", "/api"],
    "logging_and_limits": [
        "Qwen/Qwen3-0.6B",
        "--disable-log-stats",
        "--enable-log-requests",
        "--max-num-seqs",
        "32",
        "--max-num-batched-tokens",
        "4096",
        "--seed",
        "7",
    ],
    "config_model_only": ["--model", "Qwen/Qwen3-0.6B", "--tensor-parallel-size", "2"],
}


def args_json_cases() -> dict[str, Any]:
    """The `--args-json` vLLM's `RustFrontendProcessManager` would pass for
    each command line, built the way it builds it (non-default args minus the
    DP bootstrap keys, `model_tag` falling back to `model`, the two
    environment values), with its defaults for those environment values."""
    import vllm.envs as envs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.entrypoints.common.startup import jsonify_non_default_args, redact_sensitive_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cases = {}
    for name, argv in SERVE_COMMAND_LINES.items():
        parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
        args = parser.parse_args(argv)
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag  # what ServeSubcommand.cmd does first
        args_dict = jsonify_non_default_args(
            args,
            exclude={"api_server_count", "data_parallel_rank", "data_parallel_external_lb", "data_parallel_hybrid_lb"},
        )
        model_tag = getattr(args, "model_tag", None) or getattr(args, "model", None)
        if model_tag is not None:
            args_dict["model_tag"] = model_tag
        args_dict["engine_ready_timeout_secs"] = envs.VLLM_ENGINE_READY_TIMEOUT_S
        args_dict["http_timeout_keep_alive"] = envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE
        cases[name] = {
            "argv": ["vllm", "serve", *argv],
            "args_json": json.dumps(args_dict, sort_keys=True),
            "logged_args_json": json.dumps(redact_sensitive_args(args_dict), sort_keys=True),
        }
    return cases


def utility_calls() -> dict[str, list[Any]]:
    """UTILITY payloads vLLM's client sends: `(client_index, call_id, method, args)`."""
    return {
        "utility_sleep": [0, 1, "sleep", (1, "abort")],
        "utility_sleep_level0_keep": [0, 2, "sleep", (0, "keep")],
        "utility_wake_up": [0, 3, "wake_up", (None,)],
        "utility_wake_up_tags": [0, 4, "wake_up", (["weights", "kv_cache"],)],
        "utility_is_sleeping": [0, 5, "is_sleeping", ()],
        "utility_reset_prefix_cache": [0, 6, "reset_prefix_cache", (False, False)],
        "utility_get_supported_tasks": [0, 7, "get_supported_tasks", ()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if vllm.__version__ != CHECKED_VERSION:
        raise SystemExit(f"this script writes vLLM {CHECKED_VERSION} fixtures; vLLM {vllm.__version__} is installed")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "0")
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    encoder = MsgpackEncoder()
    manifest: dict[str, Any] = {"vllm_version": vllm.__version__, "files": {}}

    def write(name: str, frames: Any, kind: str, description: str, **extra: Any) -> None:
        frames = list(frames)
        if len(frames) != 1:
            raise SystemExit(f"{name}: expected one frame, vLLM encoded {len(frames)}")
        (args.out / f"{name}.msgpack").write_bytes(bytes(frames[0]))
        manifest["files"][f"{name}.msgpack"] = {"kind": kind, "description": description, **extra}

    write(
        "ready_response",
        [msgspec.msgpack.encode(ready_response())],
        "ready_response",
        "EngineCoreReadyResponse as EngineCoreProc encodes it (msgspec.msgpack.encode of the dataclass)",
    )
    for name, (message, description) in outputs_messages().items():
        write(name, encoder.encode(message), "outputs", description)
    for name, (request, given, expect) in requests().items():
        write(name, encoder.encode(request), "request", "EngineCoreRequest (ADD payload)", given=given, expect=expect)
    for name, (request, case) in generation_requests().items():
        write(
            name,
            encoder.encode(request),
            "generation_config_request",
            "EngineCoreRequest vLLM's OpenAI server builds for a request under a generation config",
            **case,
        )
    for name, call in utility_calls().items():
        write(name, encoder.encode(tuple(call)), "utility_call", f"UTILITY payload calling {call[2]}{tuple(call[3])}")
    write("abort", encoder.encode(["r1", "r2"]), "abort", "ABORT payload (request ids)")
    (args.out / "args_json.json").write_text(json.dumps(args_json_cases(), indent=2, sort_keys=True) + "\n")
    manifest["files"]["args_json.json"] = {"kind": "args_json", "description": "vllm serve argv -> --args-json"}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(manifest['files'])} fixtures to {args.out}")


if __name__ == "__main__":
    main()
