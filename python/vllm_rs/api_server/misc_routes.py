"""The small routes: health, models, load, version, metrics, and the engine
utility calls (`/reset_prefix_cache`, `/sleep`, `/wake_up`)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from vllm_rs import __version__
from vllm_rs.api_server.engine_client import EngineUnavailableError
from vllm_rs.api_server.errors import ApiError
from vllm_rs.api_server.openai_routes import json_response
from vllm_rs.api_server.params import parse_decimal
from vllm_rs.api_server.state import ServerState
from vllm_rs.api_server.submit import check_model

#: How long a utility call may take per engine (seconds).
UTILITY_TIMEOUT_S = 60.0
#: Highest `/sleep?level=` (vLLM knows levels 1 and 2).
SLEEP_LEVEL_MAX = 9


def _state(request: Request) -> ServerState:
    return request.app.state.server


async def health(request: Request) -> Response:
    """`/health` (and `/ping`, GET or POST, as vLLM serves it): 200 while the
    engines are usable, 503 after one died or while one is hung."""
    failure = _state(request).engines.unhealthy
    if failure is not None:
        raise ApiError(503, failure)
    return Response(status_code=200)


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": state.created,
        "owned_by": "vllm-rs",
        "root": state.settings.model_tag,
        "parent": None,
        "max_model_len": state.max_model_len,
    }


async def list_models(request: Request) -> Response:
    """Every served name."""
    state = _state(request)
    return json_response({"object": "list", "data": [_model_card(state, n) for n in state.settings.served_model_names]})


async def retrieve_model(request: Request) -> Response:
    """`GET /v1/models/{id}`: the card of one served name; 404 naming
    `model` for any other, in vLLM's words."""
    state = _state(request)
    model_id = request.path_params["model_id"]
    check_model(state, model_id)
    return json_response(_model_card(state, model_id))


async def load(request: Request) -> Response:
    """Requests in flight."""
    return json_response({"server_load": _state(request).engines.inflight})


async def version(request: Request) -> Response:
    """The package version."""
    return json_response({"version": __version__})


async def metrics(request: Request) -> Response:
    """Prometheus text (OpenMetrics when the Accept header asks for it)."""
    state = _state(request)
    body, content_type = state.metrics.render(state.engines.inflight_of, request.headers.get("accept"))
    return Response(body, headers={"Content-Type": content_type})


async def _call_all_engines(request: Request, method: str, args: list[Any]) -> Response:
    engines = _state(request).engines
    for engine in engines.engine_indices():
        try:
            await engines.call_utility(engine, method, args, UTILITY_TIMEOUT_S)
        except EngineUnavailableError as e:
            raise ApiError(500, f"{method} failed on engine {engine}: {e}") from None
    return Response(status_code=200)


async def reset_prefix_cache(request: Request) -> Response:
    """`POST /reset_prefix_cache` on every engine."""
    return await _call_all_engines(request, "reset_prefix_cache", [])


async def sleep(request: Request) -> Response:
    """`POST /sleep?level=N` (level 1 by default) on every engine."""
    level = parse_decimal(request.query_params.get("level", "1"), SLEEP_LEVEL_MAX)
    if level is None:
        raise ApiError.invalid_param("level", f"`level` must be an integer from 0 to {SLEEP_LEVEL_MAX}")
    return await _call_all_engines(request, "sleep", [level])


async def wake_up(request: Request) -> Response:
    """`POST /wake_up` on every engine."""
    return await _call_all_engines(request, "wake_up", [None])
