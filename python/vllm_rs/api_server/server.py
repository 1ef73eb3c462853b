"""One Python API server process: adopt the engine listeners, wait for every
engine to register (SIGTERM/SIGINT meanwhile: exit 0), then serve HTTP with
uvicorn on uvloop on the inherited socket; on SIGTERM/SIGINT stop accepting,
drain for at most the shutdown timeout, abort what is left, exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
import uvloop
import zmq

from vllm_rs.api_server.app import build_app
from vllm_rs.api_server.engine_client import EngineClient, RegistrationError
from vllm_rs.api_server.generation_config import GenerationConfigError
from vllm_rs.api_server.http_protocol import guarded_protocol
from vllm_rs.api_server.limits import LimitError
from vllm_rs.api_server.metrics import Metrics
from vllm_rs.api_server.state import ServerSettings, ServerState
from vllm_rs.api_server.tokenizer import Tokenizer, TokenizerLoadError, load_tokenizer
from vllm_rs.envs import EnvError
from vllm_rs.logger import init_logger
from vllm_rs.network_utils import ZmqListener

logger = init_logger(__name__)

SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


#: After the drain time, the handlers of the aborted requests get this long
#: to send their error answers before uvicorn cancels them.
ABORT_ANSWER_GRACE_S = 1.0


class _Server(uvicorn.Server):
    """uvicorn's server with signals handled on the loop: a signal starts the
    graceful shutdown and is not raised again afterwards (the process then
    exits 0). Requests still running after `drain_s` are failed through the
    engine client, so they are answered in the OpenAI error shape instead of
    being cancelled by uvicorn (whose answer is a plain-text 500)."""

    def __init__(self, config: uvicorn.Config, engines: EngineClient, drain_s: float):
        super().__init__(config)
        self.engines = engines
        self.drain_s = drain_s

    async def shutdown(self, sockets: Any = None) -> None:
        """uvicorn's shutdown, with the requests left after the drain aborted."""
        loop = asyncio.get_running_loop()
        abort = loop.call_later(self.drain_s, self.engines.abort_all, "the server is shutting down", 503)
        try:
            await super().shutdown(sockets)
        finally:
            abort.cancel()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGTERM/SIGINT start the graceful shutdown while serving."""
        loop = asyncio.get_running_loop()
        for sig in SHUTDOWN_SIGNALS:
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in SHUTDOWN_SIGNALS:
                loop.remove_signal_handler(sig)

    def handle_exit(self, sig: int, frame: Any) -> None:
        """Logs the first signal, then lets uvicorn shut down."""
        if not self.should_exit:
            logger.info("%s received: shutting down", signal.Signals(sig).name)
        super().handle_exit(sig, frame)


def run_server_worker(
    listen_address: str, sock: Any, args: Any, client_config: dict[str, Any], **uvicorn_kwargs: Any
) -> None:
    """Serves the OpenAI API on `sock` for `args` (the `serve` arguments),
    talking to the engines through the listeners in `client_config`. Exits 1
    when the engines do not register."""
    try:
        settings = ServerSettings.from_args(args)
        tokenizer = load_tokenizer(settings.model_tag, settings.tokenizer)
    except (EnvError, LimitError, TokenizerLoadError, GenerationConfigError) as e:
        logger.error("%s", e)
        sys.exit(1)
    code = uvloop.run(_serve(listen_address, sock, settings, tokenizer, client_config, uvicorn_kwargs))
    if code:
        sys.exit(code)


async def _wait_for_engines_or_signal(engines: EngineClient, timeout: float) -> list | None:
    """The registrations, or None when SIGTERM/SIGINT came first."""
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    for sig in SHUTDOWN_SIGNALS:
        loop.add_signal_handler(sig, stopped.set)
    waiting = asyncio.ensure_future(engines.wait_for_engines(timeout))
    stopping = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for sig in SHUTDOWN_SIGNALS:
            loop.remove_signal_handler(sig)
        stopping.cancel()
    if not waiting.done():
        waiting.cancel()
        logger.info("stopped before every engine registered")
        return None
    return waiting.result()


async def _serve(
    listen_address: str,
    sock: Any,
    settings: ServerSettings,
    tokenizer: Tokenizer,
    client_config: dict[str, Any],
    uvicorn_kwargs: dict,
) -> int:
    engines = EngineClient(
        ZmqListener(client_config["input_address"], client_config["input_listener"], zmq.ROUTER),
        ZmqListener(client_config["output_address"], client_config["output_listener"], zmq.PULL),
        start=0,
        count=settings.engine_count,
        client_index=client_config.get("client_index", 0),
        limits=settings.limits,
        coordinator_address=client_config.get("stats_update_address"),
    )
    try:
        logger.info("waiting for engines 0..=%d to register", settings.engine_count - 1)
        try:
            registrations = await _wait_for_engines_or_signal(engines, settings.engine_ready_timeout_s)
        except RegistrationError as e:
            logger.error("%s", e)
            return 1
        if registrations is None:
            return 0
        lengths = [r.max_model_len for r in registrations if r.max_model_len is not None]
        if settings.max_model_len is not None:
            lengths.append(settings.max_model_len)
        max_model_len = min(lengths) if lengths else None
        state = ServerState(
            settings, engines, Metrics(settings.primary_model_name, engines.engine_indices()), max_model_len, tokenizer
        )
        await _serve_http(listen_address, sock, state, uvicorn_kwargs)
        return 0
    finally:
        engines.abort_all("the server is shutting down")
        await engines.close()


async def _serve_http(listen_address: str, sock: Any, state: ServerState, uvicorn_kwargs: dict) -> None:
    settings = state.settings
    logging.getLogger("uvicorn").setLevel(logging.WARNING)
    config = uvicorn.Config(
        build_app(state),
        http=guarded_protocol(settings.limits),
        ws="none",
        lifespan="off",
        access_log=False,
        log_config=None,
        timeout_keep_alive=int(settings.keep_alive_timeout_s),
        timeout_graceful_shutdown=int(settings.shutdown_timeout_s + ABORT_ANSWER_GRACE_S + 0.999),
        **uvicorn_kwargs,
    )
    server = _Server(config, state.engines, settings.shutdown_timeout_s)
    stats = None if settings.disable_log_stats else asyncio.ensure_future(_log_stats_forever(state))
    logger.info(
        "serving the OpenAI API on %s (model %s, max_model_len %s, engines 0..=%d)",
        listen_address, settings.primary_model_name, state.max_model_len, settings.engine_count - 1,
    )  # fmt: skip
    try:
        await server.serve(sockets=[sock])
    finally:
        state.engines.stopping = True
        if stats is not None:
            stats.cancel()
    logger.info("API server stopped")


async def _log_stats_forever(state: ServerState) -> None:
    """Logs prompt and generation throughput while there is traffic."""
    metrics = state.metrics
    last = (metrics.prompt_total, metrics.generation_total, time.monotonic())
    while True:
        await asyncio.sleep(state.settings.log_stats_interval_s)
        now = (metrics.prompt_total, metrics.generation_total, time.monotonic())
        elapsed = max(now[2] - last[2], 1e-9)
        if now[:2] != last[:2] or state.engines.inflight:
            logger.info(
                "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs",
                (now[0] - last[0]) / elapsed, (now[1] - last[1]) / elapsed, state.engines.inflight,
            )  # fmt: skip
        last = now
