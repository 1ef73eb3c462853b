"""`python -m vllm_rs serve`: the whole serving stack on one machine.

It validates everything first (a bad option, a bad model path or a port in
use is a one-line error and exit 2, with nothing started), creates the HTTP
socket and the ZeroMQ listeners, starts the engine cores
(`CoreEngineProcManager`) and the frontend (`RustFrontendProcessManager`, or
`APIServerProcessManager` for `--frontend python`), reports usage once,
prints one line once the frontend answers, and watches everything with
`wait_for_completion_or_failure`.

Ctrl-C or SIGTERM: everything stops, exit 0. Any process dying: everything
stops, exit 1 with a message naming it (an engine's death is first told to
the frontends as `ENGINE_CORE_DEAD`, so requests in flight end with an
error). SIGKILL of `serve`: the process core takes every child along. The
engines talk to the frontends over loopback TCP, so no socket file is ever
left behind; a `--uds` socket file is removed on every exit (the guardian removes it after a SIGKILL), and a
stale one is replaced at the next start.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import zmq

from vllm_rs.cli_args import make_arg_parser
from vllm_rs.engine.config import ClientAddresses, EngineConfig, EngineConfigError, make_engine_config
from vllm_rs.engine.models import ModelPathError
from vllm_rs.engine.protocol import ENGINE_CORE_DEAD
from vllm_rs.logger import init_logger
from vllm_rs.process import remove_on_exit
from vllm_rs.network_utils import ZmqListener, is_valid_ipv6_address, make_zmq_listener

logger = init_logger("vllm_rs.serve")

PROG = "python -m vllm_rs serve"

#: Backlog of the HTTP socket (uvicorn's default).
HTTP_BACKLOG = 2048
#: How long the exit waits for the usage report to be written.
USAGE_REPORT_WAIT_S = 1.0
#: Log levels for `VLLM_LOGGING_LEVEL`, understood by Python and the Rust frontend.
CHILD_LOG_LEVELS = {"debug": "DEBUG", "info": "INFO", "warning": "WARN", "error": "ERROR", "critical": "ERROR"}


def engine_listen_address() -> str:
    """A fresh endpoint where engines and a frontend meet: a Unix socket in
    Linux's abstract namespace, as local as vLLM's ipc:// paths and about half
    the kernel work of loopback TCP per message, with no file to leave behind."""
    return f"ipc://@vllm-rs-{os.getpid()}-{uuid.uuid4().hex[:16]}"


class ServeUsageError(Exception):
    """A problem found before anything started: exit 2 with this message."""


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a bad option is one line on stderr and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """One line on stderr, exit 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def make_serve_parser() -> argparse.ArgumentParser:
    """The `serve` argument parser."""
    return make_arg_parser(_OneLineErrorParser(prog=PROG, description="Serve the OpenAI API: engine cores plus a frontend."))


@dataclass
class HttpEndpoint:
    """The HTTP socket and how to reach it."""

    sock: socket.socket
    url: str
    uds_path: str | None = None

    @property
    def listen_address(self) -> str:
        """`http://host:port` or `unix:path`."""
        return self.url

    def probe_target(self) -> tuple[int, Any]:
        """(family, address) to connect to for the readiness probe."""
        if self.uds_path:
            return socket.AF_UNIX, self.uds_path
        host, port = self.sock.getsockname()[:2]
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        return self.sock.family, (host, port)

    def close(self) -> None:
        """Closes the socket and removes a Unix socket file."""
        self.sock.close()
        if self.uds_path:
            try:
                os.unlink(self.uds_path)
            except FileNotFoundError:
                pass


def _remove_stale_unix_socket(path: str) -> None:
    if not os.path.exists(path):
        return
    import stat

    if not stat.S_ISSOCK(os.stat(path).st_mode):
        raise ServeUsageError(f"--uds {path}: exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)  # left by a server that is gone
        return
    except OSError:
        return
    finally:
        probe.close()
    raise ServeUsageError(f"--uds {path}: a server is already listening there")


def create_http_endpoint(args: argparse.Namespace) -> HttpEndpoint:
    """Binds and listens on the HTTP socket; ServeUsageError when it cannot."""
    if args.uds:
        _remove_stale_unix_socket(args.uds)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        where = f"unix:{args.uds}"
        address: Any = args.uds
    else:
        host = args.host or "0.0.0.0"
        family = socket.AF_INET6 if is_valid_ipv6_address(host) else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        address = (host, args.port)
        where = f"[{host}]:{args.port}" if family == socket.AF_INET6 else f"{host}:{args.port}"
    try:
        sock.bind(address)
        sock.listen(HTTP_BACKLOG)
    except (OSError, OverflowError) as e:
        sock.close()
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ServeUsageError(f"cannot listen on {where}: {reason}") from None
    if args.uds:
        remove_on_exit(args.uds)  # even a SIGKILL of serve leaves no socket file
        return HttpEndpoint(sock, where, args.uds)
    host, port = sock.getsockname()[:2]
    return HttpEndpoint(sock, f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}")


@dataclass
class StackPlan:
    """Everything validated and bound, nothing started yet."""

    args: argparse.Namespace
    engine_config: EngineConfig
    http: HttpEndpoint
    listeners: list[tuple[ZmqListener, ZmqListener]]
    frontend_binary: str | None = None
    output_addresses: list[str] = field(default_factory=list)

    def cleanup(self) -> None:
        """Closes and removes every socket this plan created."""
        for pair in self.listeners:
            for listener in pair:
                listener.cleanup()
        self.http.close()


def _cuda_available() -> bool:
    """Whether torch sees a CUDA device (imports torch: only asked when
    `--device cuda` is given explicitly)."""
    import torch

    return torch.cuda.is_available()


def _validate(args: argparse.Namespace) -> tuple[EngineConfig, str | None]:
    if args.api_server_count < 1:
        raise ServeUsageError("--api-server-count must be at least 1")
    if args.frontend == "rust" and args.api_server_count != 1:
        raise ServeUsageError("--api-server-count applies to --frontend python (the Rust frontend is one process)")
    if args.engine_ready_timeout is not None and args.engine_ready_timeout < 1:
        raise ServeUsageError("--engine-ready-timeout must be at least 1 second")
    if args.shutdown_timeout is not None and args.shutdown_timeout < 0:
        raise ServeUsageError("--shutdown-timeout must not be negative")
    if not args.uds and not 0 <= args.port <= 65535:
        raise ServeUsageError(f"--port {args.port}: not a port number")
    try:
        config = make_engine_config(
            args.model,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            block_size=args.block_size,
            num_gpu_blocks=args.num_gpu_blocks,
            enable_prefix_caching=args.enable_prefix_caching,
            data_parallel_size=args.data_parallel_size,
            device=args.device,
            seed=args.seed,
            log_stats=not args.disable_log_stats,
        )
    except (ModelPathError, EngineConfigError) as e:
        raise ServeUsageError(str(e)) from None
    if args.device == "cuda" and config.model_config.spec.model_type == "toy" and not _cuda_available():
        raise ServeUsageError("--device cuda: CUDA is not available on this machine")
    binary = None
    if args.frontend == "rust":
        from vllm_rs.frontend import frontend_binary

        try:
            binary = frontend_binary()
        except FileNotFoundError as e:
            raise ServeUsageError(f"--frontend rust: {e}") from None
    return config, binary


def plan_stack(args: argparse.Namespace) -> StackPlan:
    """Validates `args` and binds every socket; raises ServeUsageError with
    nothing left open."""
    config, binary = _validate(args)
    spec = config.model_config.spec
    if spec.is_directory:
        # The frontends' built-in byte-level tokenizer is chosen by model type.
        args.model_tag = spec.model_type
        args.served_model_name = args.served_model_name or [args.model]
    http = create_http_endpoint(args)
    listeners: list[tuple[ZmqListener, ZmqListener]] = []
    try:
        for _ in range(args.api_server_count):
            listeners.append(
                (make_zmq_listener(engine_listen_address(), zmq.ROUTER), make_zmq_listener(engine_listen_address(), zmq.PULL))
            )
    except OSError as e:
        for pair in listeners:
            for listener in pair:
                listener.cleanup()
        http.close()
        raise ServeUsageError(f"cannot create the engine listeners: {e}") from None
    config.clients = [ClientAddresses(i.address, o.address) for i, o in listeners]
    return StackPlan(args, config, http, listeners, binary, [o.address for _, o in listeners])


def _set_child_environment(args: argparse.Namespace) -> None:
    os.environ["VLLM_LOGGING_LEVEL"] = CHILD_LOG_LEVELS[args.log_level]
    logging.getLogger("vllm_rs").setLevel(CHILD_LOG_LEVELS[args.log_level])
    if args.engine_ready_timeout is not None:
        os.environ["VLLM_ENGINE_READY_TIMEOUT_S"] = str(args.engine_ready_timeout)


def wait_until_ready(http: HttpEndpoint, stop: threading.Event) -> bool:
    """Polls `GET /health` until it answers 200 (True) or `stop` is set."""
    family, address = http.probe_target()
    request = b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    while not stop.is_set():
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.settimeout(2.0)
                probe.connect(address)
                probe.sendall(request)
                if probe.recv(64).startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
                    return True
        except OSError:
            pass
        stop.wait(0.1)
    return False


def notify_engine_death(output_addresses: list[str]) -> None:
    """Sends `ENGINE_CORE_DEAD` to every frontend on behalf of an engine
    that died without saying so (SIGKILL, crash)."""
    ctx = zmq.Context()
    try:
        for address in output_addresses:
            push = ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 500)
            push.connect(address)
            push.send(ENGINE_CORE_DEAD)
            push.close()
    finally:
        ctx.term()


class _StopRequested:
    """SIGTERM/SIGINT handler: remembers the signal and raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.signal = signum
        raise KeyboardInterrupt(signal.Signals(signum).name)


def _start_frontend(plan: StackPlan) -> Any:
    from vllm_rs.utils import APIServerProcessManager, RustFrontendProcessManager

    args, dp = plan.args, plan.args.data_parallel_size
    if args.frontend == "rust":
        (input_listener, output_listener), = plan.listeners
        return RustFrontendProcessManager(plan.frontend_binary, plan.http.sock, args, input_listener, output_listener, 0, dp, dp)
    return APIServerProcessManager(
        plan.http.listen_address, plan.http.sock, args, args.api_server_count,
        [i for i, _ in plan.listeners], [o for _, o in plan.listeners],
    )  # fmt: skip


def run_stack(plan: StackPlan) -> int:
    """Starts engines and frontend, waits, stops everything; the exit code."""
    from vllm_rs.engine import run_engine_core
    from vllm_rs.usage import UsageContext, report_usage_stats
    from vllm_rs.utils import CoreEngineProcManager, wait_for_completion_or_failure

    args = plan.args
    stop_requested = _StopRequested()
    signal.signal(signal.SIGTERM, stop_requested)
    signal.signal(signal.SIGINT, stop_requested)
    engines = frontend = usage_report = None
    ready_stop = threading.Event()
    failure: str | None = None
    try:
        usage_report = report_usage_stats(plan.engine_config, UsageContext.OPENAI_API_SERVER)
        engines = CoreEngineProcManager(
            run_engine_core, args.data_parallel_size, 0, 0, plan.engine_config, True,
            plan.engine_config.clients[0].input_address, None, not args.disable_log_stats,
        )  # fmt: skip
        frontend = _start_frontend(plan)
        threading.Thread(target=_announce_when_ready, args=(plan, ready_stop), daemon=True, name="ReadyProbe").start()
        wait_for_completion_or_failure(frontend, engines)
        if stop_requested.signal is None:
            failure = "the frontend exited on its own"
    except KeyboardInterrupt:
        pass  # Ctrl-C or SIGTERM while starting
    except RuntimeError as e:
        failure = str(e)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        ready_stop.set()
        if engines is not None and engines.failed_proc_name is not None:
            notify_engine_death(plan.output_addresses)
        if frontend is not None:
            frontend.shutdown()
        if engines is not None:
            engines.shutdown()
        plan.cleanup()
        if usage_report is not None:
            usage_report.join(USAGE_REPORT_WAIT_S)
    if failure is not None:
        print(f"{PROG}: error: {failure}", file=sys.stderr, flush=True)
        return 1
    logger.info("serve stopped")
    return 0


def _announce_when_ready(plan: StackPlan, stop: threading.Event) -> None:
    started = time.monotonic()
    if wait_until_ready(plan.http, stop):
        args = plan.args
        engines = f"{args.data_parallel_size} engine{'s' if args.data_parallel_size > 1 else ''}"
        print(
            f"vllm-rs: serving the OpenAI API on {plan.http.url} (model {args.model}, {args.frontend} frontend, "
            f"{engines}; ready in {time.monotonic() - started:.1f}s)",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    """Runs `serve` with `argv` (default: the command line); the exit code."""
    args = make_serve_parser().parse_args(argv)
    try:
        plan = plan_stack(args)
    except ServeUsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return 2
    _set_child_environment(args)
    return run_stack(plan)
