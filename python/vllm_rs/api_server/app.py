"""The FastAPI application: every route of the Rust frontend, bearer-token
authentication, and OpenAI-shaped errors (404, 405 and 500 included)."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from vllm_rs.api_server import misc_routes, openai_routes, responses_routes, tokenize_routes
from vllm_rs.api_server.errors import ApiError
from vllm_rs.api_server.state import ServerState
from vllm_rs.logger import init_logger

logger = init_logger(__name__)

#: Paths served without a key.
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics"})


class ApiKeyMiddleware:
    """401 for requests without `Authorization: Bearer <key>` naming one of
    the keys (`/health`, `/ping` and `/metrics` stay open)."""

    def __init__(self, app: ASGIApp, keys: list[str]):
        self.app = app
        self.keys = [k.encode() for k in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization" and value.startswith(b"Bearer "):
                given = value[len(b"Bearer ") :].strip()
                break
        # Every key is compared in full, so timing does not reveal which one is near.
        accepted = False
        for key in self.keys:
            accepted |= hmac.compare_digest(given, key)
        if accepted:
            return await self.app(scope, receive, send)
        response = ApiError(401, "Unauthorized: a valid API key is required").response()
        await response(scope, receive, send)


def _http_error(request: Request, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    message = {404: "Not Found", 405: "Method Not Allowed"}.get(status, str(getattr(exc, "detail", exc)))
    return ApiError(status, message).response()


def _api_error(request: Request, exc: Exception) -> Response:
    return exc.response()  # type: ignore[attr-defined]


def _unexpected(request: Request, exc: Exception) -> Response:
    # The details go to the log only: clients never see internal text.
    logger.exception("unexpected error in %s %s", request.method, request.url.path, exc_info=exc)
    return ApiError(500, "internal server error").response()


def _client_gone(request: Request, exc: Exception) -> Response:
    # Nobody reads this answer: the client left, or its body timed out and
    # the connection already got a 408.
    logger.debug("client disconnected during %s %s", request.method, request.url.path)
    return ApiError(400, "the client disconnected").response()


def build_app(state: ServerState) -> FastAPI:
    """The application serving `state`."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    routes: list[tuple[str, str, Any]] = [
        ("GET", "/health", misc_routes.health),
        ("GET", "/metrics", misc_routes.metrics),
        ("GET", "/load", misc_routes.load),
        ("GET", "/version", misc_routes.version),
        ("GET", "/ping", misc_routes.health),
        ("POST", "/ping", misc_routes.health),
        ("GET", "/v1/models", misc_routes.list_models),
        ("GET", "/v1/models/{model_id:path}", misc_routes.retrieve_model),
        ("POST", "/tokenize", tokenize_routes.tokenize),
        ("POST", "/detokenize", tokenize_routes.detokenize),
        ("POST", "/v1/responses", responses_routes.create_response),
        ("POST", "/v1/completions", openai_routes.create_completion),
        ("POST", "/v1/chat/completions", openai_routes.create_chat_completion),
        ("POST", "/reset_prefix_cache", misc_routes.reset_prefix_cache),
        ("POST", "/sleep", misc_routes.sleep),
        ("POST", "/wake_up", misc_routes.wake_up),
    ]
    for method, path, handler in routes:
        app.add_route(path, handler, methods=[method], include_in_schema=False)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _unexpected)
    if state.settings.api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=state.settings.api_keys)
    return app
