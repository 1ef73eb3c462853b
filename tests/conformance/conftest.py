"""The stacks every conformance test runs against: `python -m vllm_rs serve`
with the reference engine's `echo` model behind the Rust frontend.
Module-scoped, so each test module starts its stacks once; every test here
is skipped, saying why, where the frontend binary is not built."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.support import API_KEY, serving
from tests.test_serve import Serve, needs_frontend


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every conformance test starts the frontend."""
    for item in items:
        if "tests/conformance/" in str(item.path).replace("\\", "/"):
            item.add_marker(needs_frontend)


@pytest.fixture(scope="module")
def stack() -> Iterator[Serve]:
    """echo on 2 engines behind an API key (given in the environment, as
    vLLM takes it), `--max-model-len 512`."""
    with serving("--data-parallel-size", "2", "--max-model-len", "512", env={"VLLM_API_KEY": API_KEY}) as serve:
        yield serve


@pytest.fixture(scope="module")
def open_stack() -> Iterator[Serve]:
    """echo on 1 engine, no API key, header and body deadlines of 1 s
    (`VLLM_RS_HTTP_HEADER_TIMEOUT_S`, `VLLM_RS_HTTP_BODY_TIMEOUT_S`)."""
    env = {"VLLM_RS_HTTP_HEADER_TIMEOUT_S": "1", "VLLM_RS_HTTP_BODY_TIMEOUT_S": "1"}
    with serving("--max-model-len", "512", env=env) as serve:
        yield serve
