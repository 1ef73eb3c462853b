"""The Rust frontend's `usage` details judged by vLLM 0.33's own classes:
`completion_tokens_details.reasoning_tokens` with `--reasoning-parser
deepseek_r1` is the count vLLM's `DeepSeekR1ReasoningParser` gives for the
same output (the echo model "emits" the prompt's bytes; vLLM's parser sees
`<think>` and `</think>` as the single tokens they are in DeepSeek's
vocabulary, every other character one token), and a usage with
`--enable-prompt-tokens-details` after a prefix-cache hit validates as
vLLM's `UsageInfo` with the hit in `cached_tokens`.

Runs `python -m vllm_rs serve` (the Rust frontend) from the vLLM 0.33 venv,
as README.md says."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")

from vllm.entrypoints.serve.engine.protocol import UsageInfo  # noqa: E402
from vllm.reasoning.deepseek_r1_reasoning_parser import DeepSeekR1ReasoningParser  # noqa: E402

from tests.conformance.support import port_of, send, serving  # noqa: E402
from tests.test_serve import Serve, rust_frontend_available  # noqa: E402

pytestmark = pytest.mark.skipif(not rust_frontend_available(), reason="vllm-rs binary not built")

#: DeepSeek's marker token ids, in a vocabulary where every other character is its byte.
MARKERS = {"<think>": 1000, "</think>": 1001}
#: What the echo model's chat prompt starts with: its answer begins so.
ROLE = "user: "
#: Outputs as parts, a marker being one part.
OUTPUTS = [
    ["<think>", "plan", "</think>", "answer"],
    ["before", "</think>", "after"],
    ["<think>", "a", "<think>", "b", "</think>", "c", "</think>", "d", "</think>", "<think>", "open"],
    ["no markers at all"],
    ["</think>", "stray", "<think>", "x"],
]


class MarkerVocabulary:
    """The tokenizer vLLM's parser asks for its vocabulary: only the markers matter."""

    def get_vocab(self) -> dict[str, int]:
        return dict(MARKERS)


@pytest.fixture(scope="module")
def reasoning() -> Iterator[Serve]:
    with serving("--max-model-len", "512", "--reasoning-parser", "deepseek_r1") as serve:
        yield serve


@pytest.mark.parametrize("parts", OUTPUTS, ids=["".join(p) for p in OUTPUTS])
def test_reasoning_tokens_are_vllms_count(reasoning, parts):
    text = "".join(parts)
    # The echo answer is the prompt: exactly "user: TEXT" with one token per byte.
    body = {"model": "echo", "messages": [{"role": "user", "content": text}], "max_tokens": len(ROLE) + len(text)}
    status, answer = send("POST", port_of(reasoning), "/v1/chat/completions", body)
    assert status == 200, answer
    ids = [ord(c) for c in ROLE]
    for part in parts:
        ids += [MARKERS[part]] if part in MARKERS else [ord(c) for c in part]
    expected = DeepSeekR1ReasoningParser(MarkerVocabulary()).count_reasoning_tokens(ids)
    assert UsageInfo.model_validate(answer["usage"]).completion_tokens_details.reasoning_tokens == expected


def test_cached_tokens_validate_as_vllms_usage():
    with serving("--model", "toy", "--num-gpu-blocks", "16", "--block-size", "16", "--max-model-len", "128",
                 "--enable-prompt-tokens-details") as serve:  # fmt: skip
        body = {"model": "toy", "prompt": "A prompt of forty-two tokens, sent twice: hi", "max_tokens": 1}
        usages = [UsageInfo.model_validate(send("POST", port_of(serve), "/v1/completions", body)[1]["usage"])
                  for _ in range(2)]  # fmt: skip
    assert [u.prompt_tokens_details.cached_tokens for u in usages] == [0, 32]
