"""The frontend against vLLM 0.33's engine-side decoding: every request a
frontend accepts (the accepted cases of request_validation.json, and the
extremes of every range) arrives as an ADD that vLLM's
`MsgpackDecoder(EngineCoreRequest)` decodes, which builds vLLM's
`SamplingParams` and so runs its `_verify_args`, and whose SamplingParams pass
`SamplingParams.verify` for the frontend's vocabulary. A real vLLM engine
decodes ADDs outside any `try`: one that fails there kills its input thread."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed: tests/compat runs with a vLLM 0.33 venv (README.md)")

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.engine import EngineCoreRequest  # noqa: E402
from vllm.v1.serial_utils import MsgpackDecoder  # noqa: E402

from tests.conformance.test_request_validation import CASES, FINISH_LENGTH, NOW_SERVED, post, served  # noqa: E402, F401
from tests.support.http import in_background  # noqa: E402
from tests.support.wait import DEADLINE_S  # noqa: E402

DECODE_REQUEST = MsgpackDecoder(EngineCoreRequest)

#: Accepted bodies at the edges of every rule, beyond the fixture's cases.
EXTREMES = [
    ("completions", {"prompt": [1, 2, 256], "max_tokens": 509, "min_tokens": 509}),
    ("completions", {"prompt": "x", "temperature": 1e-9, "top_p": 1e-9, "top_k": 2**31 - 1, "min_p": 0.0}),
    ("completions", {"prompt": "x", "repetition_penalty": 1e300, "presence_penalty": -2, "frequency_penalty": -2}),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "seed": -(2**63), "stop": ["a", "b", "c", "d"]}),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "stop_token_ids": list(range(257)), "ignore_eos": True}),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "logit_bias": {" 256 ": -100, "+0": 100}}),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 1, "min_tokens": 1}),
]
ACCEPTED = [
    (case["name"], case["endpoint"], case["body"])
    for case in CASES["cases"]
    if case["vllm"]["accepted"] and (not case["project_limit"] or case["name"] in NOW_SERVED)
] + [(f"extreme{i}", endpoint, body) for i, (endpoint, body) in enumerate(EXTREMES)]


def vocabulary() -> SimpleNamespace:
    """The parts of vLLM's ModelConfig `SamplingParams.verify` reads, for the byte-level toy model."""
    return SimpleNamespace(
        max_logprobs=20,
        max_model_len=CASES["max_model_len"],
        is_diffusion=False,
        get_vocab_size=lambda: CASES["vocab_size"],
    )


@pytest.mark.parametrize("name, endpoint, body", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_every_accepted_request_decodes_as_vllms_engine_decodes_it(served, name, endpoint, body):  # noqa: F811
    answered = in_background(post, served, endpoint, body, f"compat-{name}")
    engine = served.engine
    for _choice in range(body.get("n", 1)):  # n > 1: one child request per choice
        request = DECODE_REQUEST.decode(engine.next_add_payload())  # builds SamplingParams: runs _verify_args
        assert isinstance(request.sampling_params, SamplingParams)
        request.sampling_params.verify(vocabulary(), None, None, None)
        engine.send_outputs([[request.request_id, [65], None, None, None, FINISH_LENGTH]])
    status, answer = answered.result(timeout=DEADLINE_S)
    assert status == 200, answer
