"""`usage` details and the streamed finish as vLLM 0.33's bundled frontend
sends them, through `python -m vllm_rs serve` and the `openai` client:
`prompt_tokens_details.cached_tokens` with `--enable-prompt-tokens-details`
is the prefix-cache hit the engine reported (the toy model, blocks of 16
tokens, prefix caching on), counted by `vllm:prompt_tokens_cached` too;
`completion_tokens_details.reasoning_tokens` counts reasoning tokens as vLLM
counts them with `deepseek_r1` (those inside `<think>`...`</think>`; the echo
model "emits" its prompt, so a user message holding them drives the
parser), whole and streamed; and
beside vLLM's bundled frontend, where vLLM 0.33 is installed, the same chunk
sequences (the finish in a chunk of its own) and the same usage, cached
tokens included, in front of the same engines."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from vllm_rs.serving.frontend_binary import frontend_binary

from tests.conformance.support import serving
from tests.support import metrics_traffic
from tests.support.hf_tokenizers import bytes_only_tokenizer, write_model_dir
from tests.support.http import request as send
from tests.support.prometheus_text import parse
from tests.support.vllm_frontend import bundled_frontend_or_skip, frontend_before_echo
from tests.test_serve import Serve

BLOCK = 16
#: `serve` options of the toy stack: blocks of 16 tokens, prefix caching on (the toy model's default).
CACHE_ARGS = ("--num-gpu-blocks", "16", "--block-size", str(BLOCK), "--max-model-len", "128")
NO_EOS = {"extra_body": {"ignore_eos": True}}
#: Where the echo prompt's generation turn begins (ends the echoed text).
STOP = ["\nassistant"]


@pytest.fixture(scope="module")
def cached() -> Iterator[Serve]:
    """The toy model with prefix caching and `--enable-prompt-tokens-details`."""
    with serving("--model", "toy", *CACHE_ARGS, "--enable-prompt-tokens-details") as serve:
        yield serve


@pytest.fixture(scope="module")
def reasoning() -> Iterator[Serve]:
    """The echo model with the `deepseek_r1` reasoning parser."""
    with serving("--max-model-len", "512", "--reasoning-parser", "deepseek_r1") as serve:
        yield serve


def cached_total(serve: Serve) -> float:
    """`vllm:prompt_tokens_cached_total` now."""
    return parse(metrics_traffic.scrape(serve.wait_ready())).total("vllm:prompt_tokens_cached_total")


def hit_of(prompt_tokens: int) -> int:
    """The prompt tokens a repeated prompt finds cached: its full blocks
    but for the last token, which is computed again for the first sample."""
    return (prompt_tokens - 1) // BLOCK * BLOCK


# --- prompt_tokens_details.cached_tokens --------------------------------------


def test_a_repeated_prompt_reports_the_engines_cache_hit(cached):
    client = cached.client()
    before = cached_total(cached)
    prompt = "A prompt of forty-two tokens, sent twice: hi"
    first = client.completions.create(model="toy", prompt=prompt, max_tokens=2, **NO_EOS).usage
    assert first.prompt_tokens_details.cached_tokens == 0
    second = client.completions.create(model="toy", prompt=prompt, max_tokens=2, **NO_EOS).usage
    assert second.prompt_tokens_details.cached_tokens == hit_of(second.prompt_tokens) == 32
    # The metric counts the same hits the answers report.
    assert cached_total(cached) - before == 32


def test_a_stream_reports_cached_tokens_on_its_last_usage_chunk_only(cached):
    client = cached.client()
    prompt = "Another prompt, streamed after it was cached once."
    client.completions.create(model="toy", prompt=prompt, max_tokens=1, **NO_EOS)
    options = {"include_usage": True, "continuous_usage_stats": True}
    streamed = list(
        client.completions.create(model="toy", prompt=prompt, max_tokens=3, stream=True, stream_options=options,
                                  **NO_EOS)
    )  # fmt: skip
    *running, last = streamed
    assert last.choices == [] and last.usage.prompt_tokens_details.cached_tokens == hit_of(last.usage.prompt_tokens)
    # As vLLM's frontend sends them: the running usage has no prompt details.
    assert running and all(c.usage.prompt_tokens_details is None for c in running)


def test_a_repeated_chat_reports_its_cache_hit(cached):
    client = cached.client()
    messages = [{"role": "user", "content": "Tell me about the prefix cache, twice."}]
    client.chat.completions.create(model="toy", messages=messages, max_tokens=1, **NO_EOS)
    usage = client.chat.completions.create(model="toy", messages=messages, max_tokens=1, **NO_EOS).usage
    assert usage.prompt_tokens_details.cached_tokens == hit_of(usage.prompt_tokens) > 0


# --- completion_tokens_details.reasoning_tokens -------------------------------


def test_reasoning_tokens_are_the_tokens_parsed_as_reasoning(reasoning):
    client = reasoning.client()
    messages = [{"role": "user", "content": "<think>plan é</think>answer"}]
    answer = client.chat.completions.create(model="echo", messages=messages, max_tokens=200, stop=STOP)
    thought = answer.choices[0].message.model_extra["reasoning"]
    assert thought == "plan é"
    # One token per byte: "plan é" is 7 tokens; the markers are not reasoning.
    assert answer.usage.completion_tokens_details.reasoning_tokens == len(thought.encode()) == 7
    options = {"include_usage": True, "continuous_usage_stats": True}
    streamed = list(
        client.chat.completions.create(model="echo", messages=messages, max_tokens=200, stop=STOP, stream=True,
                                       stream_options=options)
    )  # fmt: skip
    counts = [c.usage.completion_tokens_details.reasoning_tokens for c in streamed]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 7, counts


def test_deepseek_r1_counts_only_inside_think_pairs(reasoning):
    # Its parser reads the text before `</think>` as reasoning, but vLLM counts
    # only the tokens between `<think>` and `</think>`: none here.
    answer = reasoning.client().chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "x</think>y"}], max_tokens=200, stop=STOP
    )
    assert answer.choices[0].message.model_extra["reasoning"]
    assert answer.usage.completion_tokens_details.reasoning_tokens == 0


# --- beside vLLM 0.33's bundled frontend --------------------------------------


@contextlib.contextmanager
def both_frontends(tmp_path, engine_model: str, **args: Any) -> Iterator[list[int]]:
    """Ports of ours and vLLM's bundled frontend (skipped, saying why, where
    vLLM 0.33 is not installed), each in front of an engine of its own of
    `engine_model`, with the same byte tokenizer and `args`."""
    vllms = bundled_frontend_or_skip()
    model = write_model_dir(bytes_only_tokenizer(), tmp_path / "bytes")
    (model / "config.json").write_text(json.dumps({"model_type": engine_model, "vocab_size": 257}))
    engine = {"num_gpu_blocks": 16, "block_size": BLOCK, "max_model_len": 128} if engine_model == "toy" else {}
    args = {"served_model_name": [engine_model], "max_model_len": 128, **args}
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(frontend_before_echo(binary, model, engine_model=engine_model, engine_options=engine,
                                                     **args))
            for binary in (frontend_binary(), vllms)
        ]  # fmt: skip


def events(port: int, path: str, body: dict[str, Any]) -> list[Any]:
    """The chunks of a streamed answer, `[DONE]` last."""
    status, raw = send("POST", port, path, {**body, "stream": True})
    assert status == 200, raw
    found = [line[len(b"data: ") :] for line in raw.split(b"\n\n") if line.startswith(b"data: ")]
    return [event.decode() if event == b"[DONE]" else json.loads(event) for event in found]


def shape(value: Any) -> Any:
    """`value` without what differs between any two answers (ids, times) and
    without null members: vLLM's frontend leaves unset fields out of a chunk
    where ours writes them null, which clients read alike."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if v is not None and k not in ("id", "created")}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return value


def without_role_content(chunks: list[Any]) -> list[Any]:
    """Chat chunks with the opening's `content: ""` left out: ours sends it
    with the role (as vLLM's Python server and OpenAI do), vLLM's bundled
    frontend sends the role alone."""
    for chunk in chunks:
        for choice in chunk.get("choices", []) if isinstance(chunk, dict) else []:
            delta = choice.get("delta", {})
            if "role" in delta and delta.get("content") == "":
                del delta["content"]
    return chunks


STREAMS = [
    ("/v1/completions", {"prompt": "hello", "max_tokens": 3}),
    ("/v1/completions", {"prompt": "hello", "max_tokens": 3, "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": "hello", "max_tokens": 2,
                         "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                              "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                              "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
]  # fmt: skip


def test_streams_have_the_chunks_of_vllms_bundled_frontend(tmp_path):
    with both_frontends(tmp_path, "echo") as ports:
        for path, body in STREAMS:
            ours, theirs = (
                without_role_content(shape(events(port, path, {"model": "echo", **body}))) for port in ports
            )
            assert ours == theirs, (path, body)
            # The finish comes alone: no text, after the last text.
            finish = next(c for c in ours if c["choices"] and "finish_reason" in c["choices"][0])
            assert finish["choices"][0].get("text", "") == "" and finish["choices"][0].get("delta", {}) == {}


def test_cached_tokens_are_reported_as_vllms_bundled_frontend_reports_them(tmp_path):
    with both_frontends(tmp_path, "toy", enable_prompt_tokens_details=True) as ports:
        body = {"model": "toy", "prompt": "The same prompt, sent three times over.", "max_tokens": 2,
                "ignore_eos": True}  # fmt: skip
        usages = []
        for port in ports:
            usage = [send("POST", port, "/v1/completions", body)[1]["usage"] for _ in range(2)]
            options = {"include_usage": True, "continuous_usage_stats": True}
            usage += [c["usage"] for c in events(port, "/v1/completions", {**body, "stream_options": options})[:-1]]
            usages.append(usage)
        ours, theirs = usages
        # vLLM's stream sometimes opens with an extra empty chunk (its own
        # timing), so the streams are compared by their last usage, and every
        # running usage before it carries no details in either.
        assert ours[:2] + ours[-1:] == theirs[:2] + theirs[-1:]
        for running in (ours[2:-1], theirs[2:-1]):
            assert running and all(u["prompt_tokens_details"] is None for u in running), running
        assert [u["prompt_tokens_details"] for u in ours[:2]] == [{"cached_tokens": 0}, {"cached_tokens": 32}]
