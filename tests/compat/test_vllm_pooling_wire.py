"""Pooling on the wire against vLLM 0.33's own codec, both ends:
- the engine: pooling requests that vLLM's `MsgpackEncoder` writes (its
  `PoolingParams`, array_like) drive the reference engine on a tiny BERT,
  and the outputs the engine sends decode with vLLM's
  `MsgpackDecoder(EngineCoreOutputs)` into the tensors the engine computed;
- the frontend: what it sends for `/v1/embeddings` and `/score` decodes with
  vLLM's `MsgpackDecoder(EngineCoreRequest)` into vLLM's `PoolingParams`, and
  pooled tensors that vLLM's encoder writes come back as the answer."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from vllm.pooling_params import PoolingParams as VllmPoolingParams  # noqa: E402
from vllm.sampling_params import RequestOutputKind  # noqa: E402
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest, FinishReason  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder  # noqa: E402
from vllm_rs.engine.config import make_engine_config  # noqa: E402
from vllm_rs.engine.core import EngineCore  # noqa: E402
from vllm_rs.engine.protocol import EngineCoreOutputs as OurOutputs  # noqa: E402
from vllm_rs.engine.protocol import EngineCoreRequest as OurRequest  # noqa: E402
from vllm_rs.engine.protocol import encode_outputs, unpack  # noqa: E402

from tests.conformance.test_request_validation import healthy  # noqa: E402
from tests.pooling_checkpoints import write_bert, write_cross_encoder  # noqa: E402
from tests.support.engine_peer import ScriptedEngine  # noqa: E402
from tests.support.frontend_stack import engine_listeners, rust_frontend  # noqa: E402
from tests.support.http import in_background, request  # noqa: E402
from tests.support.wait import DEADLINE_S, wait_until  # noqa: E402

ENCODE = MsgpackEncoder()
DECODE_OUTPUTS = MsgpackDecoder(EngineCoreOutputs)
DECODE_REQUEST = MsgpackDecoder(EngineCoreRequest)
PROMPTS = [[2, 10, 11, 12, 3], [2, 13, 3], [2, 14, 15, 16, 17, 18, 3]]


def vllm_pooling_request(request_id: str, ids: list[int], params: VllmPoolingParams) -> bytes:
    """The ADD payload vLLM's frontend would send for a pooling request."""
    request = EngineCoreRequest(request_id, ids, None, None, params, 0.0, None, None, None, external_req_id=request_id)
    (payload,) = ENCODE.encode(request)
    return payload


def pooled_by_vllms_decoder(core: EngineCore, requests: list[tuple[str, list[int], VllmPoolingParams]]) -> dict:
    """Adds each request (as vLLM encodes it), steps until done, and decodes
    every output message with vLLM's decoder: {request id: its output}."""
    for request_id, ids, params in requests:
        refused = core.add_request(OurRequest.from_wire(unpack(vllm_pooling_request(request_id, ids, params))))
        assert refused is None, refused.error
    decoded = {}
    while core.has_work():
        outputs = [o for _, o in core.step()]
        message = DECODE_OUTPUTS.decode(encode_outputs(OurOutputs(0, outputs)))
        decoded.update((o.request_id, o) for o in message.outputs)
    return decoded


def test_vllms_embed_requests_pool_and_the_outputs_decode_as_vllms_tensors(tmp_path):
    path = write_bert(str(tmp_path / "bert"), st_pooling="mean_tokens", normalize=True)
    core = EngineCore(make_engine_config(path, device="cpu"))
    requests = [(f"n{i}", ids, VllmPoolingParams(task="embed")) for i, ids in enumerate(PROMPTS)]
    requests += [
        (f"raw{i}", ids, VllmPoolingParams(task="embed", use_activation=False)) for i, ids in enumerate(PROMPTS)
    ]
    outputs = pooled_by_vllms_decoder(core, requests)
    for i in range(len(PROMPTS)):
        normalized, raw = outputs[f"n{i}"], outputs[f"raw{i}"]
        assert normalized.finish_reason == raw.finish_reason == FinishReason.STOP
        assert isinstance(normalized.pooling_output, torch.Tensor) and normalized.pooling_output.dtype == torch.float32
        assert normalized.pooling_output.shape == (32,)
        # The model's Normalize module is the default; use_activation=False skips it.
        assert torch.linalg.vector_norm(normalized.pooling_output).item() == pytest.approx(1.0, abs=1e-6)
        assert torch.linalg.vector_norm(raw.pooling_output).item() != pytest.approx(1.0, abs=1e-3)
        torch.testing.assert_close(normalized.pooling_output, torch.nn.functional.normalize(raw.pooling_output, dim=0))


def test_vllms_cross_encoder_score_requests_use_the_token_types_vllm_compresses(tmp_path):
    from transformers import AutoTokenizer, BertForSequenceClassification

    path = write_cross_encoder(str(tmp_path / "ce"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = BertForSequenceClassification.from_pretrained(path).eval()
    pair = tokenizer("the cat", "a big old dog ran")
    first_of_second = pair["token_type_ids"].index(1)
    core = EngineCore(make_engine_config(path, device="cpu"))
    # What vLLM 0.33's score route sends for a cross-encoder pair: task classify,
    # the token types compressed to where the second text starts.
    params = VllmPoolingParams(
        task="classify", use_activation=False, extra_kwargs={"compressed_token_type_ids": first_of_second}
    )
    (output,) = pooled_by_vllms_decoder(core, [("pair", pair["input_ids"], params)]).values()
    with torch.no_grad():
        want = model(**tokenizer("the cat", "a big old dog ran", return_tensors="pt")).logits[0]
    torch.testing.assert_close(output.pooling_output, want, atol=1e-5, rtol=0)


def test_the_layout_before_vllm_033_is_refused_as_a_validation_error(tmp_path):
    path = write_bert(str(tmp_path / "bert"))
    core = EngineCore(make_engine_config(path, device="cpu"))
    # Before 0.33: truncate_prompt_tokens, dimensions, normalize, ..., task in
    # slot 8. Read as 0.33's layout it has no task, so it is refused, never
    # pooled with the wrong settings.
    old_layout = [None, None, True, None, None, None, None, None, "embed"]
    wire = unpack(vllm_pooling_request("x", PROMPTS[0], VllmPoolingParams(task="embed")))
    wire[4] = old_layout
    refused = core.add_request(OurRequest.from_wire(wire))
    assert refused is not None and refused.finish_reason.name == "ERROR"
    assert refused.error.code == "validation_error"


@pytest.fixture(scope="module", params=["embed", "classify"])
def pooling_frontend(request, tmp_path_factory):
    """The Rust frontend for a tiny cross-encoder's folder (its BERT
    tokenizer encodes text pairs) run as a pooling model (`--runner pooling
    --convert TASK`), engine 0 scripted by the test."""
    folder = tmp_path_factory.mktemp("pooling")
    listeners = engine_listeners()
    args = argparse.Namespace(model=write_cross_encoder(str(folder / "ce")), runner="pooling", convert=request.param)
    log = folder / "frontend.log"
    with rust_frontend(args, listeners, log_path=log) as frontend:
        engine = ScriptedEngine(
            SimpleNamespace(input_address=listeners.input.address, output_address=listeners.output.address)
        )
        try:
            wait_until(lambda: healthy(frontend.port), "the frontend to become healthy")
            yield SimpleNamespace(port=frontend.port, engine=engine, task=request.param)
        finally:
            engine.close()


def answer_with_vllms_encoder(engine: ScriptedEngine, vectors: dict[str, list[float]]) -> list[EngineCoreRequest]:
    """Reads one ADD per entry of `vectors` (in any order, matched by
    arrival), decodes each with vLLM's decoder, and answers it with a pooled
    tensor encoded by vLLM's encoder. Returns the decoded requests."""
    from vllm.v1.engine import EngineCoreOutput

    decoded = []
    for values in vectors.values():
        add = DECODE_REQUEST.decode(engine.next_add_payload())
        decoded.append(add)
        output = EngineCoreOutput(
            request_id=add.request_id, new_token_ids=[], pooling_output=torch.tensor(values, dtype=torch.float32),
            finish_reason=FinishReason.STOP,
        )  # fmt: skip
        engine.push.send_multipart(ENCODE.encode(EngineCoreOutputs(engine_index=0, outputs=[output])))
    return decoded


def test_the_frontends_pooling_requests_decode_as_vllms_and_vllms_tensors_answer(pooling_frontend):
    served = pooling_frontend
    if served.task == "embed":
        body, path = {"input": [[5, 6, 7], [8, 9]], "use_activation": False}, "/v1/embeddings"
    else:
        body, path = {"text_1": "ab", "text_2": ["cd", "efg"]}, "/score"
    answered = in_background(request, "POST", served.port, path, body)
    vectors = {"a": [0.25, -1.5, 3.0], "b": [1.0, 2.0, -0.5]} if served.task == "embed" else {"a": [0.7], "b": [0.2]}
    adds = answer_with_vllms_encoder(served.engine, vectors)
    for add in adds:
        assert add.sampling_params is None and isinstance(add.pooling_params, VllmPoolingParams)
        params = add.pooling_params
        assert params.task == served.task and params.output_kind == RequestOutputKind.FINAL_ONLY
        if served.task == "embed":
            assert params.use_activation is False and params.extra_kwargs is None
        else:
            # A cross-encoder pair: where the second text's token type 1 starts.
            assert params.extra_kwargs["compressed_token_type_ids"] >= 1
    status, answer = answered.result(timeout=DEADLINE_S)
    assert status == 200, answer
    by_prompt = {tuple(a.prompt_token_ids): values for a, values in zip(adds, vectors.values(), strict=True)}
    if served.task == "embed":
        got = {tuple(p): d["embedding"] for p, d in zip(body["input"], answer["data"], strict=True)}
        assert got == {k: pytest.approx(v) for k, v in by_prompt.items()}
    else:
        assert sorted(d["score"] for d in answer["data"]) == pytest.approx(sorted(v[0] for v in vectors.values()))
