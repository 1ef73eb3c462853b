"""The frontend's streamed and non-streamed text against vLLM 0.33's own
incremental detokenizer (`IncrementalDetokenizer.from_new_request`, the
`FastIncrementalDetokenizer` for these tokenizers) on the same prompt and
output ids: SentencePiece-style and byte-level tokenizers made here, the
engine played by the test over real ZeroMQ sockets."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is not importable (see tests/compat/README.md)")

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.tokenizers import get_tokenizer  # noqa: E402
from vllm.v1.engine import EngineCoreRequest  # noqa: E402
from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer, IncrementalDetokenizer  # noqa: E402

from tests.detokenization_harness import FINISH_LENGTH, FINISH_STOP, complete, serve  # noqa: E402
from tests.support.hf_tokenizers import (  # noqa: E402
    byte_ids,
    byte_level_tokenizer,
    metaspace_tokenizer,
    piece_ids,
    write_model_dir,
)

TOKENIZERS = {"metaspace": metaspace_tokenizer, "byte_level": byte_level_tokenizer}


@pytest.fixture(scope="module", params=list(TOKENIZERS))
def served(request, tmp_path_factory):
    """(the frontend, our tokenizer, vLLM's tokenizer) for one model directory."""
    kind = request.param
    tokenizer = TOKENIZERS[kind]()
    model_dir = write_model_dir(tokenizer, tmp_path_factory.mktemp(kind))
    with serve(model_dir) as server:
        yield server, tokenizer, get_tokenizer(str(model_dir))


def vllm_text(vllm_tokenizer, prompt_ids, outputs, finish, stop, skip_special_tokens) -> tuple[str, str | None]:
    """The text vLLM's detokenizer streams for `outputs`, one id per step, and
    the stop string that matched, if any."""
    params = SamplingParams(max_tokens=len(outputs), stop=stop, skip_special_tokens=skip_special_tokens)
    request = EngineCoreRequest(
        request_id="r", prompt_token_ids=prompt_ids, mm_features=None, sampling_params=params,
        pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None, data_parallel_rank=None,
    )  # fmt: skip
    detokenizer = IncrementalDetokenizer.from_new_request(vllm_tokenizer, request)
    assert isinstance(detokenizer, FastIncrementalDetokenizer)
    pieces = []
    for index, token_id in enumerate(outputs):
        last = index == len(outputs) - 1
        matched = detokenizer.update([token_id], last and finish == FINISH_STOP)
        pieces.append(detokenizer.get_next_output_text(finished=last or matched is not None, delta=True))
        if matched is not None:
            return "".join(pieces), matched
    return "".join(pieces), None


def _outputs(tokenizer, case: str) -> list[int]:
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    eos, start, end = piece_ids(tokenizer, "</s>", "<|im_start|>", "<|im_end|>")
    return {
        "paris": encode(" Paris."),
        "multibyte": encode(" hello")
        + byte_ids(tokenizer, "😀")
        + byte_ids(tokenizer, "中文")
        + piece_ids(tokenizer, "!"),
        "special": encode(" hello") + [eos, start, end] + encode(" world"),
        "eos": encode(" hello") + [eos],
        "stop_string": encode(" hello") + byte_ids(tokenizer, " STOP") + encode(" world"),
    }[case]


CASES = [
    # (case, finish, stop strings, skip_special_tokens)
    ("paris", FINISH_LENGTH, [], True),
    ("multibyte", FINISH_LENGTH, [], True),
    ("special", FINISH_LENGTH, [], True),
    ("special", FINISH_LENGTH, [], False),
    ("eos", FINISH_STOP, [], False),
    ("stop_string", FINISH_LENGTH, ["STOP"], True),
]


@pytest.mark.parametrize(("case", "finish", "stop", "skip_special_tokens"), CASES, ids=lambda v: str(v))
def test_frontends_stream_what_vllm_detokenizes(served, case, finish, stop, skip_special_tokens):
    server, tokenizer, vllm_tokenizer = served
    outputs = _outputs(tokenizer, case)
    answer = complete(
        server, "The capital is", outputs, finish=None if stop else finish, stop=stop,
        skip_special_tokens=skip_special_tokens,
    )  # fmt: skip
    expected, matched = vllm_text(vllm_tokenizer, answer.prompt_ids, outputs, finish, stop, skip_special_tokens)
    assert answer.streamed == answer.text == expected, (answer.streamed, answer.text, expected)
    if matched is not None:
        assert (answer.finish_reason, answer.stop_reason) == ("stop", matched)
    if case == "paris":
        assert expected == " Paris."
