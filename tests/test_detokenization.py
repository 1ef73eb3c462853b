"""Incremental detokenization in the frontend (the real `vllm-rs` binary) with
Hugging Face tokenizers made here: text is
decoded in the prompt's context as vLLM 0.33's `FastIncrementalDetokenizer`
does (a `tokenizers` DecodeStream primed with the prompt), so the first
token's SentencePiece `▁` is a space, characters split across tokens come out
whole, and the streamed text equals the non-streamed text and the expected
decode computed here with `tokenizers`."""

from __future__ import annotations

import argparse

import pytest
from tokenizers.decoders import DecodeStream

from tests.detokenization_harness import FINISH_STOP, complete, serve
from tests.support.frontend_stack import rust_frontend
from tests.support.hf_tokenizers import (
    byte_ids,
    byte_level_tokenizer,
    metaspace_tokenizer,
    piece_ids,
    write_model_dir,
)
from tests.support.wait import DEADLINE_S

TOKENIZERS = {"metaspace": metaspace_tokenizer, "byte_level": byte_level_tokenizer}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def served(request, tmp_path_factory):
    """The frontend serving a tokenizer made here."""
    kind = request.param
    tokenizer = TOKENIZERS[kind]()
    model_dir = write_model_dir(tokenizer, tmp_path_factory.mktemp(kind))
    with serve(model_dir) as server:
        yield server, tokenizer, kind


def expected_text(tokenizer, prompt_ids: list[int], output_ids: list[int], skip_special_tokens: bool = True) -> str:
    """What vLLM's fast detokenizer makes of `output_ids` after `prompt_ids`."""
    stream = DecodeStream(ids=prompt_ids, skip_special_tokens=skip_special_tokens)
    return "".join(stream.step(tokenizer, token_id) or "" for token_id in output_ids)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def assert_consistent(answer, expected: str) -> None:
    assert answer.streamed == answer.text == expected, (answer.streamed, answer.text, expected)
    assert all("\ufffd" not in piece for piece in answer.pieces), answer.pieces


def test_first_token_keeps_its_leading_space_after_the_prompt(served):
    server, tokenizer, _ = served
    outputs = encode(tokenizer, " Paris.")
    answer = complete(server, "The capital is", outputs)
    assert answer.prompt_ids == tokenizer.encode("The capital is").ids
    assert_consistent(answer, expected_text(tokenizer, answer.prompt_ids, outputs))
    assert answer.text == " Paris."
    assert answer.finish_reason == "length"


def test_characters_split_across_tokens_come_out_whole(served):
    server, tokenizer, _ = served
    outputs = (
        encode(tokenizer, " hello")
        + byte_ids(tokenizer, "😀")
        + byte_ids(tokenizer, "中文")
        + piece_ids(tokenizer, "!")
    )
    answer = complete(server, "The capital is", outputs)
    assert_consistent(answer, expected_text(tokenizer, answer.prompt_ids, outputs))
    assert answer.text == " hello😀中文!"


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_special_tokens_are_skipped_or_kept(served, skip_special_tokens):
    server, tokenizer, _ = served
    eos, start, end = piece_ids(tokenizer, "</s>", "<|im_start|>", "<|im_end|>")
    outputs = encode(tokenizer, " hello") + [eos, start, end] + encode(tokenizer, " world")
    answer = complete(server, "The capital is", outputs, skip_special_tokens=skip_special_tokens)
    assert_consistent(answer, expected_text(tokenizer, answer.prompt_ids, outputs, skip_special_tokens))
    if skip_special_tokens:
        assert answer.text == " hello world"
    else:
        assert "</s><|im_start|><|im_end|>" in answer.text


def test_stop_token_from_the_engine_is_left_out_of_the_text(served):
    # vLLM drops the token that stopped generation in the engine (here EOS),
    # even when special tokens are kept.
    server, tokenizer, _ = served
    (eos,) = piece_ids(tokenizer, "</s>")
    outputs = encode(tokenizer, " hello") + [eos]
    answer = complete(server, "The capital is", outputs, finish=FINISH_STOP, skip_special_tokens=False)
    assert_consistent(answer, expected_text(tokenizer, answer.prompt_ids, outputs[:-1], False))
    assert answer.text == " hello"
    assert answer.finish_reason == "stop"


def test_stop_string_spanning_tokens(served):
    server, tokenizer, kind = served
    pieces = ["▁hello", "▁ST", "OP", "▁world"] if kind == "metaspace" else None
    outputs = (
        piece_ids(tokenizer, *pieces) if pieces else encode(tokenizer, " hello") + byte_ids(tokenizer, " STOP world")
    )
    full = expected_text(tokenizer, tokenizer.encode("The capital is").ids, outputs)
    assert full == " hello STOP world"
    answer = complete(server, "The capital is", outputs, finish=None, stop=["STOP"])
    assert_consistent(answer, full[: full.index("STOP")])
    assert answer.text == " hello "
    assert (answer.finish_reason, answer.stop_reason) == ("stop", "STOP")


def test_prompt_ending_inside_a_character(served):
    # The prompt (as ids) ends with the first two bytes of an emoji; the
    # output completes it. The character comes out whole, once (vLLM 0.33
    # would repeat the whole prompt here; see docs/frontend.md).
    server, tokenizer, _ = served
    emoji = byte_ids(tokenizer, "😀")
    prompt = tokenizer.encode("The capital is").ids + emoji[:2]
    outputs = emoji[2:] + encode(tokenizer, " world")
    answer = complete(server, prompt, outputs)
    assert_consistent(answer, "😀 world")


def test_chat_reply_is_decoded_after_the_rendered_template(served):
    server, tokenizer, _ = served
    messages = [{"role": "user", "content": "The capital of France?"}]
    rendered = "<s><|im_start|>user\nThe capital of France?<|im_end|>\n<|im_start|>assistant\n"
    outputs = encode(tokenizer, " Paris.")
    answer = complete(server, messages, outputs)
    assert answer.prompt_ids == tokenizer.encode(rendered, add_special_tokens=False).ids
    assert_consistent(answer, expected_text(tokenizer, answer.prompt_ids, outputs))
    assert answer.text == " Paris."


def test_the_prompt_context_is_what_gives_the_leading_space(served):
    # Guards the tokenizers made here: the decode the tests expect differs
    # from a context-free decode exactly where a decoder without the prompt context goes wrong (the leading space).
    _, tokenizer, kind = served
    paris = encode(tokenizer, " Paris")
    with_context = expected_text(tokenizer, tokenizer.encode("The capital is").ids, paris)
    without = tokenizer.decode(paris)
    assert with_context == " Paris"
    assert without == ("Paris" if kind == "metaspace" else " Paris")


@pytest.mark.parametrize("broken", ["missing", "not_json"])
def test_the_frontend_exits_naming_a_tokenizer_it_cannot_load(tmp_path, capfd, broken):
    location = tmp_path / "model"
    if broken == "not_json":
        location.mkdir()
        (location / "tokenizer.json").write_text("{not json")
    namespace = argparse.Namespace(model="toy", tokenizer=str(location))
    with rust_frontend(namespace, backlog=1) as frontend:
        frontend.process.join(DEADLINE_S)
        assert frontend.process.exitcode not in (None, 0)
    captured = capfd.readouterr()
    assert str(location) in captured.out + captured.err
