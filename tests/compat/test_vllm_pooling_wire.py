"""Pooling on the wire against vLLM 0.33's own codec: pooling requests that
vLLM's `MsgpackEncoder` writes (its `PoolingParams`, array_like) drive the
reference engine on a tiny BERT, and the outputs the engine sends decode
with vLLM's `MsgpackDecoder(EngineCoreOutputs)` into the tensors the engine
computed."""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from vllm.pooling_params import PoolingParams as VllmPoolingParams  # noqa: E402
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest, FinishReason  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder  # noqa: E402
from vllm_rs.engine.config import make_engine_config  # noqa: E402
from vllm_rs.engine.core import EngineCore  # noqa: E402
from vllm_rs.engine.protocol import EngineCoreOutputs as OurOutputs  # noqa: E402
from vllm_rs.engine.protocol import EngineCoreRequest as OurRequest  # noqa: E402
from vllm_rs.engine.protocol import encode_outputs, unpack  # noqa: E402

from tests.pooling_checkpoints import write_bert, write_cross_encoder  # noqa: E402

ENCODE = MsgpackEncoder()
DECODE_OUTPUTS = MsgpackDecoder(EngineCoreOutputs)
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
