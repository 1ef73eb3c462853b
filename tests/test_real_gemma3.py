"""The packaged Gemma 3 270M Q4_K_M GGUF end to end: `python -m vllm_rs
serve GGUF` (its SentencePiece tokenizer and EOS ids rebuilt from the GGUF's
metadata, the weights read in place) behind the Rust frontend, driven with
the `openai` client. The reference is transformers' greedy `generate` on the
same GGUF (dequantized to float32) from the same prompt ids; the prompt ids
are checked against the rebuilt `tokenizer.json` read by the `tokenizers`
library (tests/test_gguf_tokenizer.py checks it against transformers').

The GGUF is a base model without a chat template: a chat request without
one is refused, as vLLM refuses it; the chat requests here bring Gemma's
turn format (the server runs with `--trust-request-chat-template`).

One server for the module. Skipped, saying why, where the package or the
frontend binary is missing."""

from __future__ import annotations

import os

import openai
import pytest

from tests.support.concurrent import run_together
from tests.support.gemma3_270m import GEMMA_TURNS_TEMPLATE, gemma3_270m_path
from tests.test_serve import rust_frontend_available, serving

if not rust_frontend_available():
    pytest.skip("the vllm-rs binary is not built", allow_module_level=True)

MODEL = "gemma-3-270m"
NEW_TOKENS = 32
COMPLETION_PROMPTS = [
    "Question: What is the capital of France?\nAnswer:",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]
CHAT = [{"role": "user", "content": "Write one sentence about the sea."}]
#: Streamed together, then each alone.
STREAM_PROMPTS = [
    "The days of the week are",
    "My favourite colour is",
    "import numpy as np\n",
    "The recipe calls for",
    "In 1969, astronauts",
    "Water boils at",
    "The best way to learn a language is",
    "Dear Sir or Madam,",
]


@pytest.fixture(scope="module")
def gguf() -> str:
    return gemma3_270m_path()


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    """The server's tokenizer cache (`VLLM_RS_CACHE`), read by the tests too."""
    return str(tmp_path_factory.mktemp("vllm-rs-cache"))


@pytest.fixture(scope="module")
def server(gguf, cache):
    with serving(
        gguf, "--served-model-name", MODEL, "--port", "0", "--host", "127.0.0.1", "--max-model-len", "1024",
        "--trust-request-chat-template", env={"VLLM_RS_CACHE": cache},
    ) as serve:  # fmt: skip
        yield serve


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def folder(server, gguf, cache) -> str:
    """The tokenizer folder the server rebuilt (it exists once the server is up)."""
    from vllm_rs.tokenizer.gguf import tokenizer_dir

    return tokenizer_dir(gguf, cache=os.path.join(cache, "gguf-tokenizers"))


@pytest.fixture(scope="module")
def tokenizer(folder):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))


@pytest.fixture(scope="module")
def eos_ids(folder) -> list[int]:
    import json

    with open(os.path.join(folder, "generation_config.json"), encoding="utf-8") as f:
        return json.load(f)["eos_token_id"]


@pytest.fixture(scope="module")
def reference(gguf):
    """transformers' model (float32) from the same GGUF."""
    transformers = pytest.importorskip("transformers")
    directory, name = os.path.split(gguf)
    return transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype="float32").eval()


def reference_greedy(model, prompt_ids: list[int], eos_ids: list[int]) -> tuple[list[int], str]:
    """transformers' greedy tokens for `prompt_ids` (up to NEW_TOKENS, ending
    at the first of the server's EOS ids, which is kept, as vLLM keeps it)
    and the finish reason the server should give."""
    import torch

    with torch.no_grad():
        ids = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
            pad_token_id=0,
        )[0, len(prompt_ids) :].tolist()  # fmt: skip
    for i, token in enumerate(ids):
        if token in eos_ids:
            return ids[: i + 1], "stop"
    return ids, "length"


def test_completions_are_transformers_greedy_and_name_paris(client, tokenizer, reference, eos_ids):
    for prompt in COMPLETION_PROMPTS:
        answer = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0, extra_body={"return_token_ids": True}
        ).choices[0]
        # <bos> first, once (the GGUF's add_bos_token), then the text's ids.
        assert answer.prompt_token_ids == tokenizer.encode(prompt).ids
        assert answer.prompt_token_ids.count(2) == 1 and answer.prompt_token_ids[0] == 2
        expected, finish = reference_greedy(reference, answer.prompt_token_ids, eos_ids)
        assert (answer.token_ids, answer.finish_reason) == (expected, finish), prompt
        assert answer.text == tokenizer.decode(expected, skip_special_tokens=True)
        if prompt == COMPLETION_PROMPTS[0]:
            assert answer.text.startswith(" Paris"), answer.text


def test_chat_in_gemma_turns_is_transformers_greedy(client, tokenizer, reference, eos_ids):
    import jinja2

    rendered = (
        jinja2.Environment()
        .from_string(GEMMA_TURNS_TEMPLATE)
        .render(messages=CHAT, add_generation_prompt=True, bos_token="<bos>")
    )
    response = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=NEW_TOKENS, temperature=0,
        extra_body={"chat_template": GEMMA_TURNS_TEMPLATE, "return_token_ids": True},
    )  # fmt: skip
    # The template writes <bos>; the prompt is not given another.
    assert response.prompt_token_ids == tokenizer.encode(rendered, add_special_tokens=False).ids
    assert response.prompt_token_ids.count(2) == 1 and response.prompt_token_ids[:2] == [2, 105]
    answer = response.choices[0]
    expected, finish = reference_greedy(reference, response.prompt_token_ids, eos_ids)
    assert (answer.token_ids, answer.finish_reason) == (expected, finish)
    assert answer.message.content == tokenizer.decode(expected, skip_special_tokens=True)
    assert len(answer.message.content.split()) >= 3, answer.message.content


def test_a_chat_request_without_a_template_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="has no chat template"):
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)


def _stream(client, prompt: str) -> str:
    chunks = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0, stream=True
    )  # fmt: skip
    return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)


def test_concurrent_streams_equal_their_solo_output(client):
    together = run_together([lambda p=p: _stream(client, p) for p in STREAM_PROMPTS])
    solo = [_stream(client, prompt) for prompt in STREAM_PROMPTS]
    assert len(set(solo)) == len(STREAM_PROMPTS), solo
    assert together == solo
