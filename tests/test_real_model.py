"""The real model end to end: `python -m vllm_rs serve` with its defaults
(the packaged SmolLM2-135M-Instruct GGUF, its tokenizer and chat template
rebuilt from the GGUF's metadata) behind the Rust frontend, driven with the
`openai` client; transformers, loading the same GGUF, is the reference.

One server for the whole module. Skipped, saying why, when the packaged
model is not installed (`scripts/setup.sh` installs it)."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest
from vllm_rs.model_files import PACKAGED_MODEL_NAME, ModelNotFoundError, packaged_model_path

from tests.support.concurrent import run_together
from tests.test_serve import rust_frontend_available, serving

try:
    GGUF = packaged_model_path()
except ModelNotFoundError as e:
    pytest.skip(f"the packaged SmolLM2 GGUF is not installed: {e}", allow_module_level=True)
if not rust_frontend_available():
    pytest.skip("the vllm-rs binary is not built", allow_module_level=True)

MODEL = PACKAGED_MODEL_NAME
#: The server holds the weights in fp16 packs (`--quantization gguf`, the
#: default), transformers dequantizes to float32: their log-probabilities
#: differ by up to 0.025 (docs/real-model-speed.md); a wrong position or a
#: sampling setting applied to them moves a log-probability by far more.
LOGPROB_TOLERANCE = 0.05
PROMPTS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 12 times 12?",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "List two uses of a paperclip.",
    "What does a CPU do?",
]


@pytest.fixture(scope="module")
def server():
    with serving("--port", "0", "--host", "127.0.0.1", "--max-model-len", "2048") as serve:
        yield serve


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def reference():
    """transformers' tokenizer and model (float32) from the same GGUF."""
    import os

    transformers = pytest.importorskip("transformers")
    folder, name = os.path.dirname(GGUF), os.path.basename(GGUF)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32").eval()
    return tokenizer, model


def chat(client, content: str, **kwargs):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], temperature=0, **kwargs
    )


def test_the_default_model_is_the_packaged_smollm2(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert f"(model {MODEL}," in server.output


def test_greedy_chat_answer_names_paris(client):
    answer = chat(client, "What is the capital of France?", max_tokens=32).choices[0]
    assert "Paris" in answer.message.content, answer.message.content


def test_the_chat_prompt_is_transformers_template_and_tokens(server, reference):
    tokenizer, _ = reference
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo, 2+2? 😀"}]
    status, body = server.http(
        "POST", "/tokenize", {"model": MODEL, "messages": messages, "add_generation_prompt": True}
    )
    assert status == 200, body
    # As vLLM does: the template rendered to text, then tokenized without adding special tokens.
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert json.loads(body)["tokens"] == tokenizer.encode(text, add_special_tokens=False)


def stream_text(client, prompt: str, max_tokens: int) -> str:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
    )
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def test_concurrent_streams_equal_their_solo_greedy_output(client):
    solo = [chat(client, p, max_tokens=24).choices[0].message.content for p in PROMPTS]
    assert len(set(solo)) == len(PROMPTS), solo
    assert run_together([lambda p=p: stream_text(client, p, 24) for p in PROMPTS]) == solo


def test_a_json_schema_answer_validates(client):
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "country": {"type": "string", "maxLength": 40},
            "population_millions": {"type": "number", "minimum": 0},
        },
        "required": ["city", "country", "population_millions"],
        "additionalProperties": False,
    }
    answer = chat(
        client,
        "Describe the capital of France as JSON.",
        max_tokens=96,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    ).choices[0]
    assert answer.finish_reason == "stop", answer
    jsonschema.validate(json.loads(answer.message.content), schema)


def test_stop_strings_end_the_answer_before_them(client):
    full = client.completions.create(model=MODEL, prompt="The days of the week are", max_tokens=24, temperature=0)
    text = full.choices[0].text
    words = text.split()
    assert len(words) >= 4, text
    stop = words[2]
    cut = client.completions.create(
        model=MODEL, prompt="The days of the week are", max_tokens=24, temperature=0, stop=[stop]
    ).choices[0]
    assert (cut.text, cut.finish_reason) == (text[: text.index(stop)], "stop")


def test_logprobs_equal_a_recomputation_from_the_logits(server, client, reference):
    import torch

    _, model = reference
    prompt = "The capital of France is"
    status, body = server.http("POST", "/tokenize", {"model": MODEL, "prompt": prompt})
    assert status == 200, body
    prompt_ids = json.loads(body)["tokens"]
    choice = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=6,
        temperature=0,
        logprobs=5,
        extra_body={"return_tokens_as_token_ids": True},
    ).choices[0]
    chosen = [int(t.removeprefix("token_id:")) for t in choice.logprobs.tokens]
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + chosen])).logits[0, len(prompt_ids) - 1 : -1]
    expected = torch.log_softmax(logits.double(), dim=-1)
    for step, (token, logprob, top) in enumerate(
        zip(chosen, choice.logprobs.token_logprobs, choice.logprobs.top_logprobs, strict=True)
    ):
        assert token == int(expected[step].argmax()), f"step {step}: greedy picks the most likely token"
        assert math.isclose(logprob, float(expected[step, token]), abs_tol=LOGPROB_TOLERANCE), (step, logprob)
        for name, value in top.items():
            expected_value = float(expected[step, int(name.removeprefix("token_id:"))])
            assert math.isclose(value, expected_value, abs_tol=LOGPROB_TOLERANCE)


def test_seeded_n2_sampling_is_reproducible(client):
    def sample():
        response = client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=1.0, n=2, seed=1234
        )
        return sorted(c.text for c in response.choices)

    first = sample()
    assert len(first) == 2 and all(first), first
    assert sample() == first


def test_the_benchmarks_request_gives_the_same_tokens_through_serve_and_in_process(server, client):
    """bench_models.py compares `serve` with the engine driven in-process on
    "the same requests": its token-id prompts, greedy, `min_tokens` and
    `ignore_eos` through the frontend (as bench/clients/src/model_load.rs
    sends them) must reach the engine as the in-process path's parameters
    (bench/model_inproc.py) do, and so produce the same tokens."""
    from vllm_rs.engine import make_engine_config
    from vllm_rs.engine.core import EngineCore
    from vllm_rs.engine.protocol import EngineCoreRequest

    from bench.model_load import GgufFacts

    output_tokens = 12
    prompts = GgufFacts.read(GGUF).random_prompts(2, 24, seed=7)
    served = []
    for prompt in prompts:
        choice = client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=output_tokens,
            temperature=0.0,
            # The token ids of the answer; greedy sampling does not depend on logprobs.
            logprobs=0,
            extra_body={"min_tokens": output_tokens, "ignore_eos": True, "return_tokens_as_token_ids": True},
        ).choices[0]
        served.append([int(t.removeprefix("token_id:")) for t in choice.logprobs.tokens])
    core = EngineCore(make_engine_config(str(GGUF), device="cpu", max_model_len=512, log_stats=False,
                                         kv_cache_memory_bytes=64 * 2**20))  # fmt: skip
    params = {"temperature": 0.0, "max_tokens": output_tokens, "min_tokens": output_tokens, "ignore_eos": True}
    direct = []
    for i, prompt in enumerate(prompts):
        assert core.add_request(EngineCoreRequest(f"r{i}", prompt, params)) is None
        tokens: list[int] = []
        while core.has_work():
            tokens += [t for _, output in core.step() for t in output.new_token_ids]
        direct.append(tokens)
    assert all(len(tokens) == output_tokens for tokens in served), served
    assert direct == served


def test_the_benchmarks_native_client_times_every_token_and_names_a_bad_answer(server):
    """bench_models.py's load (the native client, bench/model_load.py and
    bench/clients/src/model_load.rs) streams from the real server: every
    request yields exactly the tokens asked for, each timed; an answer that
    is not a stream of them fails the level, naming the status."""
    import asyncio

    from bench.model_load import GgufFacts, LoadError, run_level

    prompts = GgufFacts.read(GGUF).random_prompts(4, 16, seed=3)
    result = asyncio.run(run_level(f"{server.url}/v1", MODEL, prompts[:3], 2, 5, prompts[3][:4]))
    assert (result.requests, result.output_tokens) == (3, 15)
    assert 0 < result.ttft_p50_ms <= result.ttft_p99_ms
    assert result.tpot_p50_ms > 0 and result.tokens_per_s > 0
    assert result.extra["client_cpu_s"] >= 0
    with pytest.raises(LoadError, match="status 404"):
        asyncio.run(run_level(f"{server.url}/v1", "no-such-model", prompts[:1], 1, 5, prompts[3][:4]))
