"""The stacks every conformance test runs against: `python -m vllm_rs serve`
with the reference engine's `echo` model, once per frontend (the `frontend`
attribute says which). Module-scoped, so each test module starts its stacks
once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.support import API_KEY, serving
from tests.test_serve import FRONTENDS, Serve


@pytest.fixture(scope="module", params=FRONTENDS)
def stack(request) -> Iterator[Serve]:
    """echo on 2 engines behind an API key (given in the environment, as
    vLLM takes it), `--max-model-len 512`; the Python frontend runs 2 API
    servers."""
    extra = ["--api-server-count", "2"] if request.param == "python" else []
    with serving(request.param, "--data-parallel-size", "2", "--max-model-len", "512", *extra,
                 env={"VLLM_API_KEY": API_KEY}) as serve:  # fmt: skip
        yield serve


@pytest.fixture(scope="module", params=FRONTENDS)
def open_stack(request) -> Iterator[Serve]:
    """echo on 1 engine, no API key, header and body deadlines of 1 s
    (`VLLM_RS_HTTP_HEADER_TIMEOUT_S`, `VLLM_RS_HTTP_BODY_TIMEOUT_S`)."""
    env = {"VLLM_RS_HTTP_HEADER_TIMEOUT_S": "1", "VLLM_RS_HTTP_BODY_TIMEOUT_S": "1"}
    with serving(request.param, "--max-model-len", "512", env=env) as serve:
        yield serve
