"""vLLM 0.33's routes, one by one, on `serve` (echo, `--enable-scale-out`):
every route vLLM serves answers here with something other than the router's
own 404 (`Not Found`: no such route), unless the table
(`tests/fixtures/vllm-0.33/routes.json`) says why not: a model kind this
server does not run, a flag it does not take,
or a known gap (a strict known difference, so that serving the route makes
the test fail until the table says `served`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conformance.support import API_KEY, known_difference, serving

TABLE = json.loads((Path(__file__).parents[1] / "fixtures" / "vllm-0.33" / "routes.json").read_text())["routes"]
AUTH = {"authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def scale_out_stack():
    with serving("--max-model-len", "512", "--enable-scale-out", env={"VLLM_API_KEY": API_KEY}) as serve:
        yield serve


def is_no_such_route(status: int, body: bytes) -> bool:
    """The router's 404 for a path it has no route for (a route's own 404, such as an unknown model's, says more)."""
    return status == 404 and json.loads(body)["error"]["message"] == "Not Found"


@pytest.mark.parametrize("route", TABLE, ids=[f"{r['method']} {r['path']}" for r in TABLE])
def test_vllm_route(scale_out_stack, request, route):
    path = route["path"].replace("{response_id}", "resp_0")
    body = {} if route["method"] == "POST" else None
    status, answer = scale_out_stack.http(route["method"], path, body, headers=AUTH)
    if route["status"] == "missing":
        known_difference(request, f"{route['method']} {route['path']} is not served yet: {route['why']}")
    if route["status"] in ("served", "missing"):
        assert not is_no_such_route(status, answer), (route, status, answer)
    else:
        # Not served here, for the reason the table gives; vLLM answers 404 too without it.
        assert is_no_such_route(status, answer), (route, status, answer)
