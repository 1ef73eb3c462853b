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
from vllm.exceptions import VLLMValidationError
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


def paused_error() -> RequestError:
    """The RequestError a paused engine answers a new request with (EngineCore._reject_add_while_paused)."""
    return RequestError(
        code="engine_paused", message="Generation is paused. Please retry after it resumes.", retryable=True
    )


def sampling_error() -> RequestError:
    """The RequestError of a request whose SamplingParams vLLM refuses, with vLLM's own message."""
    try:
        SamplingParams(min_tokens=20, max_tokens=16)
    except VLLMValidationError as error:
        return RequestError(code="validation_error", message=str(error))
    raise SystemExit("vLLM accepted min_tokens=20 with max_tokens=16")


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
        "outputs_request_error_paused": (
            EngineCoreOutputs(
                0,
                [EngineCoreOutput("paused", [], finish_reason=FinishReason.ERROR, error=paused_error())],
                timestamp=MONOTONIC,
                finished_requests={"paused"},
            ),  # fmt: skip
            "a request a paused engine refused: ERROR with a retryable RequestError, as _reject_add_while_paused sends it",
        ),
        "outputs_request_error_sampling": (
            EngineCoreOutputs(
                0,
                [EngineCoreOutput("bad-sampling", [], finish_reason=FinishReason.ERROR, error=sampling_error())],
                timestamp=MONOTONIC,
                finished_requests={"bad-sampling"},
            ),  # fmt: skip
            "a request whose SamplingParams the engine refused: the RequestError _handle_request_validation_error makes",
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


#: The vocabulary and context length of the frontends under test (the byte-level toy model).
VALIDATION_VOCAB_SIZE = 257
VALIDATION_MAX_MODEL_LEN = 512
COMPLETION_BASE = {"prompt": "hi", "max_tokens": 2}
CHAT_BASE = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

#: name -> (endpoint, fields over the endpoint's base body (None removes one),
#: the parameter at fault or None, whether this project refuses what vLLM accepts).
VALIDATION_CASES: dict[str, tuple[str, dict[str, Any], str | None, bool]] = {
    # accepted by vLLM
    "defaults": ("completions", {}, None, False),
    "chat_defaults": ("chat", {}, None, False),
    "temperature_0": ("completions", {"temperature": 0}, None, False),
    "temperature_2": ("chat", {"temperature": 2}, None, False),
    "top_p_1": ("completions", {"top_p": 1}, None, False),
    "top_k_0": ("completions", {"top_k": 0}, None, False),
    "top_k_minus_1": ("chat", {"top_k": -1}, None, False),
    "min_p_1": ("completions", {"min_p": 1.0}, None, False),
    "penalties_at_bounds": ("completions", {"presence_penalty": -2, "frequency_penalty": 2.0}, None, False),
    "repetition_penalty_small": ("completions", {"repetition_penalty": 0.01}, None, False),
    "seed_minus_1": ("completions", {"seed": -1}, None, False),
    "seed_int64_extremes": ("chat", {"seed": 2**63 - 1}, None, False),
    "seed_int64_min": ("completions", {"seed": -(2**63)}, None, False),
    "four_stop_strings": ("completions", {"stop": ["a", "b", "c", "d"]}, None, False),
    "stop_token_ids_in_vocab": ("completions", {"stop_token_ids": [0, 256]}, None, False),
    "logit_bias_in_vocab": ("completions", {"logit_bias": {"5": 100}}, None, False),
    "min_tokens_equal_max_tokens": ("completions", {"min_tokens": 2, "max_tokens": 2}, None, False),
    "min_tokens_under_default_max_tokens": ("completions", {"min_tokens": 16, "max_tokens": None}, None, False),
    "empty_stream_options_without_stream": ("completions", {"stream_options": {}}, None, False),
    "stream_with_usage": ("chat", {"stream": True, "stream_options": {"include_usage": True}}, None, False),
    "top_logprobs_0": ("chat", {"top_logprobs": 0}, None, False),
    "logprobs_false": ("chat", {"logprobs": False}, None, False),
    "max_completion_tokens": ("chat", {"max_completion_tokens": 3, "max_tokens": None}, None, False),
    "bad_words": ("completions", {"bad_words": ["x"]}, None, False),
    "allowed_token_ids": ("chat", {"allowed_token_ids": [1, 2]}, None, False),
    "stream_interval_1": ("completions", {"stream_interval": 1}, None, False),
    "unknown_field_ignored": ("completions", {"no_such_field": [1, {"x": None}]}, None, False),
    # refused by vLLM
    "temperature_above_2": ("completions", {"temperature": 2.5}, "temperature", False),
    "temperature_negative": ("chat", {"temperature": -0.5}, "temperature", False),
    "temperature_string": ("completions", {"temperature": "hot"}, "temperature", False),
    "top_p_0": ("completions", {"top_p": 0}, "top_p", False),
    "top_p_above_1": ("chat", {"top_p": 1.5}, "top_p", False),
    "top_k_minus_2": ("completions", {"top_k": -2}, "top_k", False),
    "min_p_above_1": ("completions", {"min_p": 1.5}, "min_p", False),
    "min_p_negative": ("chat", {"min_p": -0.1}, "min_p", False),
    "presence_penalty_above_2": ("completions", {"presence_penalty": 2.5}, "presence_penalty", False),
    "frequency_penalty_below_minus_2": ("chat", {"frequency_penalty": -3}, "frequency_penalty", False),
    "repetition_penalty_0": ("completions", {"repetition_penalty": 0}, "repetition_penalty", False),
    "repetition_penalty_negative": ("chat", {"repetition_penalty": -1.5}, "repetition_penalty", False),
    "max_tokens_0": ("completions", {"max_tokens": 0}, "max_tokens", False),
    "max_tokens_negative": ("chat", {"max_tokens": -1}, "max_tokens", False),
    "max_completion_tokens_0": ("chat", {"max_completion_tokens": 0}, "max_completion_tokens", False),
    "min_tokens_negative": ("completions", {"min_tokens": -1}, "min_tokens", False),
    "min_tokens_over_default_max_tokens": ("completions", {"min_tokens": 20, "max_tokens": None}, "min_tokens", False),
    "min_tokens_over_max_tokens": ("chat", {"min_tokens": 5, "max_tokens": 2}, "min_tokens", False),
    "empty_stop_string": ("completions", {"stop": ["a", ""]}, "stop", False),
    "empty_stop_string_alone": ("chat", {"stop": ""}, "stop", False),
    "five_stop_strings": ("completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop", False),
    "stop_token_id_past_vocab": ("completions", {"stop_token_ids": [3, 257]}, "stop_token_ids", False),
    "stop_token_id_negative": ("chat", {"stop_token_ids": [-1]}, "stop_token_ids", False),
    "logit_bias_bad_key": ("completions", {"logit_bias": {"x": 1}}, "logit_bias", False),
    "logit_bias_past_vocab": ("chat", {"logit_bias": {"300": 1}}, "logit_bias", False),
    "empty_bad_word": ("completions", {"bad_words": ["", "a"]}, "bad_words", False),
    "empty_allowed_token_ids": ("completions", {"allowed_token_ids": []}, "allowed_token_ids", False),
    "allowed_token_id_past_vocab": ("chat", {"allowed_token_ids": [1, 300]}, "allowed_token_ids", False),
    "stream_options_without_stream": (
        "completions",
        {"stream_options": {"include_usage": True}},
        "stream_options",
        False,
    ),
    "logprobs_minus_2": ("completions", {"logprobs": -2}, "logprobs", False),
    "top_logprobs_minus_2": ("chat", {"top_logprobs": -2}, "top_logprobs", False),
    "top_logprobs_without_logprobs": ("chat", {"top_logprobs": 2}, "top_logprobs", False),
    "seed_past_int64": ("completions", {"seed": 2**63}, "seed", False),
    "n_0": ("completions", {"n": 0}, "n", False),
    "stream_interval_0": ("chat", {"stream_interval": 0}, "stream_interval", False),
    "empty_prompt": ("completions", {"prompt": ""}, "prompt", False),
    "no_prompt": ("completions", {"prompt": None}, "prompt", False),
    "continue_with_generation_prompt": (
        "chat",
        {"continue_final_message": True, "add_generation_prompt": True},
        "continue_final_message",
        False,
    ),
    # accepted by vLLM, refused by this project (not supported, or past its limits)
    "n_2": ("completions", {"n": 2}, "n", True),
    "top_k_past_int32": ("completions", {"top_k": 2**31}, "top_k", True),
    "max_tokens_past_int32": ("completions", {"max_tokens": 2**31}, "max_tokens", True),
    "completion_logprobs": ("completions", {"logprobs": 1}, "logprobs", True),
    "chat_logprobs": ("chat", {"logprobs": True, "top_logprobs": 2}, "logprobs", True),
    "truncate_prompt_tokens": ("completions", {"truncate_prompt_tokens": 5}, "truncate_prompt_tokens", True),
    "echo": ("completions", {"echo": True}, "echo", True),
    "logit_bias_past_100": ("completions", {"logit_bias": {"5": 150}}, "logit_bias", True),
    "max_tokens_as_string": ("completions", {"max_tokens": "5"}, "max_tokens", True),
}


def validation_body(endpoint: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The endpoint's base body with `fields` over it (None removes a field)."""
    body = dict(COMPLETION_BASE if endpoint == "completions" else CHAT_BASE, **fields)
    return {k: v for k, v in body.items() if v is not None or k not in ("max_tokens", "prompt")}


def vllm_verdict(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """What vLLM 0.33's OpenAI frontend does with `body`, up to handing the
    request to an engine: its request model validates it, `get_max_tokens`
    and `to_sampling_params` build the SamplingParams (running `_verify_args`)
    and `SamplingParams.verify` checks the token ids against the vocabulary."""
    from types import SimpleNamespace

    from pydantic import ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    model = CompletionRequest if endpoint == "completions" else ChatCompletionRequest
    try:
        request = model.model_validate(body)
        prompt_len = 3  # "hi" with BOS, or the chat template's few tokens: far below the context
        limit = request.max_tokens
        if endpoint == "chat" and request.max_completion_tokens is not None:
            limit = request.max_completion_tokens
        max_tokens = min(VALIDATION_MAX_MODEL_LEN - prompt_len, *([limit] if limit is not None else []))
        params = request.to_sampling_params(max_tokens, {})
        config = SimpleNamespace(
            max_logprobs=20,
            max_model_len=VALIDATION_MAX_MODEL_LEN,
            is_diffusion=False,
            get_vocab_size=lambda: VALIDATION_VOCAB_SIZE,
        )
        params.verify(config, None, None, None)
    except VLLMValidationError as e:
        return {"accepted": False, "kind": "validation", "param": e.parameter, "message": e.args[0]}
    except ValidationError as e:
        error = e.errors()[0]
        return {"accepted": False, "kind": "type", "param": str(error["loc"][0]), "message": error["msg"]}
    return {"accepted": True}


def validation_cases() -> dict[str, Any]:
    """Request bodies with what vLLM 0.33 accepts or refuses (and its message)."""
    cases = []
    for name, (endpoint, fields, param, project_limit) in VALIDATION_CASES.items():
        body = validation_body(endpoint, fields)
        verdict = vllm_verdict(endpoint, body)
        if verdict["accepted"] == (param is not None) and not project_limit:
            raise SystemExit(f"{name}: vLLM {verdict} but the case expects the fault {param!r}")
        cases.append({"name": name, "endpoint": endpoint, "body": body, "param": param,
                      "project_limit": project_limit, "vllm": verdict})  # fmt: skip
    return {"vocab_size": VALIDATION_VOCAB_SIZE, "max_model_len": VALIDATION_MAX_MODEL_LEN, "cases": cases}


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
    "tls_client_certs": [
        "Qwen/Qwen3-0.6B",
        "--ssl-keyfile",
        "/etc/tls/key.pem",
        "--ssl-certfile",
        "/etc/tls/cert.pem",
        "--ssl-ca-certs",
        "/etc/tls/ca.pem",
        "--ssl-cert-reqs",
        "2",
    ],
    "tls_ciphers": [
        "Qwen/Qwen3-0.6B",
        "--ssl-keyfile",
        "/etc/tls/key.pem",
        "--ssl-certfile",
        "/etc/tls/cert.pem",
        "--ssl-ciphers",
        "ECDHE-RSA-AES256-GCM-SHA384",
    ],
    "cors_wildcard": ["Qwen/Qwen3-0.6B", "--allowed-origins", '["*"]'],
    "chat_template_inline": [
        "Qwen/Qwen3-0.6B",
        "--chat-template",
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}",
        "--chat-template-content-format",
        "string",
        "--response-role",
        "bot",
    ],
    "frontend_options": [
        "Qwen/Qwen3-0.6B",
        "--root-path",
        "/api",
        "--enable-request-id-headers",
        "--enable-force-include-usage",
        "--max-log-len",
        "100",
        "--disable-uvicorn-access-log",
        "--uvicorn-log-level",
        "warning",
        "--disable-fastapi-docs",
        "--h11-max-header-count",
        "64",
        "--h11-max-incomplete-event-size",
        "65536",
        "--tokenizer-mode",
        "hf",
    ],
    "tool_calling": ["Qwen/Qwen3-0.6B", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
    "return_tokens_as_token_ids": ["Qwen/Qwen3-0.6B", "--return-tokens-as-token-ids", "--max-logprobs", "5"],
    "sse_keep_alive": ["Qwen/Qwen3-0.6B", "--sse-keep-alive-interval", "10"],
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


def serve_keys() -> dict[str, list[str]]:
    """Every key `vllm serve` can put in `--args-json` (every argparse
    destination of its parser), grouped as vLLM defines them: `frontend`
    (FrontendArgs and the serve command's own), `engine` (EngineArgs)."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    dests = {action.dest for action in parser._actions if action.dest != "help"}
    engine = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    return {"frontend": sorted(dests - engine), "engine": sorted(dests & engine)}


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
    (args.out / "request_validation.json").write_text(json.dumps(validation_cases(), indent=2) + "\n")
    manifest["files"]["request_validation.json"] = {
        "kind": "request_validation",
        "description": "OpenAI request bodies with what vLLM's request models and SamplingParams accept or refuse",
    }
    (args.out / "serve_keys.json").write_text(json.dumps(serve_keys(), indent=2, sort_keys=True) + "\n")
    manifest["files"]["serve_keys.json"] = {"kind": "serve_keys", "description": "every key of vllm serve's parser"}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(manifest['files'])} fixtures to {args.out}")


if __name__ == "__main__":
    main()
