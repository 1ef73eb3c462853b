"""`python -m vllm_rs serve`: the whole serving stack on one machine.

It validates everything first (a bad option, a bad model path or a port in
use is a one-line error and exit 2, with nothing started), creates the HTTP
socket and the ZeroMQ listeners, starts the engine cores
(`CoreEngineProcManager`) and the Rust frontend (`RustFrontendProcessManager`,
one process that serves every engine), reports usage once,
prints one line once the frontend answers, and watches everything with
`wait_for_completion_or_failure` plus the frontend's `/health`.

Ctrl-C or SIGTERM: everything stops, exit 0. Any process dying, or the
frontend reporting an engine lost (`/health` 503): everything stops, exit 1
with a message naming it (an engine's death is first told to the frontends
as `ENGINE_CORE_DEAD`, so requests in flight end with an error). SIGKILL of
`serve`: the process core takes every child along.

Engines and frontends meet on Unix sockets in a directory of mode 0700 that
only this user can enter (engine sockets carry every prompt and answer and
have no authentication of their own); the directory and the sockets in it
are removed on every exit, by the guardian after a SIGKILL. A `--uds` socket
file is removed the same way, and a stale one is replaced at the next start.
The API key reaches the frontends only through their environment
(`VLLM_API_KEY`), never through a command line.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from vllm_rs.engine.config import ClientAddresses, EngineConfig, EngineConfigError, make_engine_config
from vllm_rs.engine.cuda_probe import cuda_available
from vllm_rs.engine.model_loader.pooler_config import PoolerConfigError, parse_pooler_config
from vllm_rs.engine.model_loader.registry import ModelPathError
from vllm_rs.engine.protocol import ENGINE_CORE_DEAD
from vllm_rs.generation_config import GenerationConfig, GenerationConfigError
from vllm_rs.logger import init_logger
from vllm_rs.multinode.topology import Topology, TopologyError, host_heartbeat_timeout_s, plan_topology, tcp_endpoint
from vllm_rs.network_utils import PrivateSocketDir, ZmqListener, is_valid_ipv6_address, make_zmq_listener
from vllm_rs.process.core import remove_on_exit
from vllm_rs.process.core import wait as wait_fds
from vllm_rs.process.rust_frontend import API_KEY_ENV
from vllm_rs.serving.cli_args import make_arg_parser
from vllm_rs.serving.coordinator import CoordinatorListeners, CoordinatorProcManager
from vllm_rs.serving.serve_model import ModelArgumentError, ServedModel, model_argument, resolve_served_model

logger = init_logger("vllm_rs.serving.serve")

PROG = "python -m vllm_rs serve"

#: Backlog of the HTTP socket (uvicorn's default).
HTTP_BACKLOG = 2048
#: How long the exit waits for the usage report to be written.
USAGE_REPORT_WAIT_S = 1.0
#: Log levels for `VLLM_LOGGING_LEVEL`, understood by Python and the Rust frontend.
CHILD_LOG_LEVELS = {"debug": "DEBUG", "info": "INFO", "warning": "WARN", "error": "ERROR", "critical": "ERROR"}
#: How often the frontend's `/health` is asked once the stack is ready.
HEALTH_POLL_INTERVAL_S = 1.0
#: After a 503 from `/health`, how long an engine process has to be seen
#: exiting, so that its death (which names it) is what gets reported.
ENGINE_EXIT_GRACE_S = 2.0
#: Largest `/health` answer read.
HEALTH_RESPONSE_LIMIT = 65536

#: (least, most) value of every numeric option; checked before anything
#: starts. The bounds keep every value meaningful and representable in each
#: part it reaches (JSON, the Rust frontend's integers and durations, torch).
NUMERIC_OPTION_RANGES: dict[str, tuple[float, float]] = {
    "port": (0, 65535),
    "grpc_port": (1, 65535),
    "data_parallel_size": (1, 1024),
    "data_parallel_size_local": (0, 1024),
    "data_parallel_start_rank": (0, 1023),
    "data_parallel_rpc_port": (1, 65535),
    "max_model_len": (1, 2**31 - 1),
    "engine_ready_timeout": (1, 7 * 24 * 3600),
    "shutdown_timeout": (0, 24 * 3600),
    "max_num_seqs": (1, 2**20),
    "max_num_batched_tokens": (1, 2**31 - 1),
    "block_size": (1, 4096),
    "num_gpu_blocks": (1, 2**31 - 1),
    "kv_cache_memory_bytes": (1, 2**62),
    "seed": (0, 2**63 - 1),
    "stream_interval": (1, 2**31 - 1),
}


class ServeUsageError(Exception):
    """A problem found before anything started: exit 2 with this message."""


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a bad option is one line on stderr and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """One line on stderr, exit 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def make_serve_parser() -> argparse.ArgumentParser:
    """The `serve` argument parser."""
    return make_arg_parser(
        _OneLineErrorParser(prog=PROG, description="Serve the OpenAI API: engine cores plus a frontend.")
    )


@dataclass
class HttpEndpoint:
    """The HTTP socket and how to reach it, and the gRPC socket of `--grpc-port`."""

    sock: socket.socket
    url: str
    uds_path: str | None = None
    grpc_sock: socket.socket | None = None

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
        """Closes the sockets and removes a Unix socket file."""
        self.sock.close()
        if self.grpc_sock is not None:
            self.grpc_sock.close()
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
    socket_dir: PrivateSocketDir
    listeners: list[tuple[ZmqListener, ZmqListener]]
    frontend_binary: str | None = None
    output_addresses: list[str] = field(default_factory=list)
    topology: Topology | None = None
    #: The node channel's listener, when headless nodes are expected.
    node_listener: socket.socket | None = None
    #: The data-parallel coordinator's sockets (DP > 1).
    coordinator_listeners: CoordinatorListeners | None = None
    #: The frontend's `model`: the folder of the model's generation config.
    frontend_model: str | None = None

    def all_listeners(self) -> list[ZmqListener]:
        """The frontends' engine listeners and the coordinator's."""
        coordinator = self.coordinator_listeners.all() if self.coordinator_listeners else []
        return [listener for pair in self.listeners for listener in pair] + coordinator

    def cleanup(self) -> None:
        """Closes and removes every socket this plan created, and the socket
        directory."""
        for listener in self.coordinator_listeners.all() if self.coordinator_listeners else ():
            listener.cleanup()
        _cleanup_listeners(self.listeners, self.socket_dir)
        self.http.close()
        if self.node_listener is not None:
            self.node_listener.close()


def _bind_grpc_socket(args: argparse.Namespace, http: HttpEndpoint) -> socket.socket:
    """Binds and listens on `--grpc-port` (on `--host`); closes `http` and
    raises ServeUsageError when it cannot."""
    host = args.host or "0.0.0.0"
    family = socket.AF_INET6 if is_valid_ipv6_address(host) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, args.grpc_port))
        sock.listen(HTTP_BACKLOG)
    except OSError as e:
        sock.close()
        http.close()
        raise ServeUsageError(f"--grpc-port {args.grpc_port}: cannot listen on {host}: {e.strerror or e}") from None
    return sock


def _cleanup_listeners(listeners: list[tuple[ZmqListener, ZmqListener]], socket_dir: PrivateSocketDir) -> None:
    for pair in listeners:
        for listener in pair:
            listener.cleanup()
    socket_dir.remove()


def _validate_numbers(args: argparse.Namespace) -> None:
    """Every numeric option finite and within `NUMERIC_OPTION_RANGES`."""
    for name, (least, most) in NUMERIC_OPTION_RANGES.items():
        value = getattr(args, name)
        if value is None or (name == "port" and args.uds):
            continue
        if (isinstance(value, float) and not math.isfinite(value)) or not least <= value <= most:
            option = "--" + name.replace("_", "-")
            raise ServeUsageError(f"{option} {value}: must be a number from {least} to {most}")


def _validate_parsers(args: argparse.Namespace) -> None:
    """The output parser flags name parsers the frontend has, and auto
    tool choice comes with its parser (as vLLM requires)."""
    from vllm_rs._core import REASONING_PARSER_NAMES, TOOL_PARSER_NAMES

    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ServeUsageError("--enable-auto-tool-choice requires --tool-call-parser")
    for option, name, names in (
        ("--tool-call-parser", args.tool_call_parser, TOOL_PARSER_NAMES),
        ("--reasoning-parser", args.reasoning_parser, REASONING_PARSER_NAMES),
    ):
        if name is not None and name not in names:
            raise ServeUsageError(f"{option} {name!r}: not a parser here; choose one of {', '.join(names)}")


def _locate_model_files(args: argparse.Namespace) -> ServedModel:
    """The model of `args` located (`serve_model`), its generation config
    checked (the frontend loads it again; errors are caught here, before
    anything starts); ServeUsageError naming what is wrong."""
    try:
        served = resolve_served_model(args)
        # One model argument from here on (headless nodes compare it with the head's).
        args.model = model_argument(args)
    except ModelArgumentError as e:
        raise ServeUsageError(str(e)) from None
    try:
        GenerationConfig.load(
            args.generation_config, args.override_generation_config or {}, _generation_config_dir(served)
        )
    except GenerationConfigError as e:
        raise ServeUsageError(str(e)) from None
    return served


def _generation_config_dir(served: ServedModel) -> str | None:
    """Where the model's `generation_config.json` is: a GGUF's is written
    next to its rebuilt tokenizer; a directory holds its own."""
    if served.engine_model.endswith(".gguf") and os.path.isfile(served.engine_model):
        return served.tokenizer_dir
    return served.engine_model if os.path.isdir(served.engine_model) else None


def _validate(args: argparse.Namespace) -> tuple[EngineConfig, str | None]:
    _validate_numbers(args)
    try:
        args._topology = plan_topology(args)
        heartbeat_timeout_s = host_heartbeat_timeout_s() if args._topology.spans_hosts else None
    except TopologyError as e:
        raise ServeUsageError(str(e)) from None
    if args.api_server_count != 1:
        raise ServeUsageError(
            f"--api-server-count {args.api_server_count}: one Rust frontend serves every engine; leave it at 1"
        )
    _validate_parsers(args)
    if args.api_key is not None and not args.api_key:
        raise ServeUsageError("--api-key: empty; give the key, or leave the option out to serve without one")
    served = _locate_model_files(args)
    args._served = served
    try:
        config = make_engine_config(
            served.engine_model,
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
            dtype=args.dtype,
            kv_cache_memory_bytes=args.kv_cache_memory_bytes,
            quantization=args.quantization,
            enforce_eager=args.enforce_eager,
            kernel_precision=args.kernel_precision,
            kv_cache_dtype=args.kv_cache_dtype,
            runner=args.runner,
            convert=args.convert,
            pooler_config=parse_pooler_config(args.pooler_config) if args.pooler_config is not None else None,
        )
    except (ModelPathError, EngineConfigError, PoolerConfigError) as e:
        raise ServeUsageError(str(e)) from None
    if served.tokenizer_dir is not None:
        config.model_config.spec.tokenizer_dir = served.tokenizer_dir
    if args.device == "cuda" and config.model_config.spec.model_type != "echo" and not cuda_available():
        raise ServeUsageError("--device cuda: CUDA is not available on this machine")
    config.heartbeat_ttl_s = heartbeat_timeout_s
    binary = None
    if not args.headless:
        from vllm_rs.serving.frontend_binary import frontend_binary

        try:
            binary = frontend_binary()
        except FileNotFoundError as e:
            raise ServeUsageError(f"the Rust frontend: {e}") from None
    return config, binary


def plan_stack(args: argparse.Namespace) -> StackPlan:
    """Validates `args` and binds every socket; raises ServeUsageError with
    nothing left open."""
    config, binary = _validate(args)
    spec, served = config.model_config.spec, args._served
    runner = config.model_config.runner
    if runner.is_pooling:
        # Resolved here, so the frontend knows the model's task (`--args-json`).
        args.runner, args.convert = "pooling", runner.task
    args.served_model_name = args.served_model_name or [served.name]
    frontend_model = _generation_config_dir(served) or served.engine_model
    if served.tokenizer_dir is not None:
        args.tokenizer = served.tokenizer_dir
        args.model_tag = served.name
    elif spec.is_directory:
        # The frontends' built-in byte-level tokenizer is chosen by model type.
        args.model_tag = spec.model_type
    else:
        args.model_tag = served.name
    topology: Topology = args._topology
    http = create_http_endpoint(args)
    if args.grpc_port is not None:
        http.grpc_sock = _bind_grpc_socket(args, http)
    try:
        socket_dir = PrivateSocketDir()
    except OSError as e:
        http.close()
        raise ServeUsageError(f"cannot create the engine socket directory: {e}") from None
    listeners: list[tuple[ZmqListener, ZmqListener]] = []
    # Engines on other hosts reach the frontend over TCP on the trusted address only.
    tcp_address = topology.address if topology.spans_hosts else None
    try:
        listeners.append(
            (
                make_zmq_listener(
                    tcp_endpoint(tcp_address, 0) if tcp_address else socket_dir.endpoint("input-0"), zmq.ROUTER
                ),
                make_zmq_listener(
                    tcp_endpoint(tcp_address, 0) if tcp_address else socket_dir.endpoint("output-0"), zmq.PULL
                ),
            )
        )
        # Engines on other hosts reach the coordinator over TCP like the
        # frontends; the frontends' side stays in the private directory.
        coordinator = (
            CoordinatorListeners.create(socket_dir, engine_host=tcp_address) if args.data_parallel_size > 1 else None
        )
    except OSError as e:
        _cleanup_listeners(listeners, socket_dir)
        http.close()
        where = tcp_address or socket_dir.path
        raise ServeUsageError(f"cannot create the engine listeners on {where}: {e.strerror or e}") from None
    outputs = [o.address for _, o in listeners]
    plan = StackPlan(
        args, config, http, socket_dir, listeners, binary, outputs, topology, coordinator_listeners=coordinator,
        frontend_model=frontend_model,
    )  # fmt: skip
    if tcp_address:
        logger.warning(
            "engine sockets on %s: TCP without authentication, reachable from the network of %s: "
            "keep that network trusted",
            ", ".join(listener.address for listener in plan.all_listeners() if listener.address.startswith("tcp://")),
            tcp_address,
        )  # fmt: skip
        if topology.backend == "mp" and topology.remote_ranks:
            plan.node_listener = _bind_node_listener(plan, tcp_address, topology.rpc_port)
    else:
        logger.info("engine sockets in %s (mode 0700: this user only)", socket_dir.path)
    config.clients = [ClientAddresses(i.address, o.address) for i, o in listeners]
    if coordinator is not None:
        config.coordinator = coordinator.addresses()
    return plan


def _bind_node_listener(plan: StackPlan, address: str, port: int) -> socket.socket:
    """The node channel's listener on `address:port`; ServeUsageError (with
    everything of `plan` closed) when it cannot be had."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(64)
    except OSError as e:
        sock.close()
        plan.cleanup()
        raise ServeUsageError(
            f"--data-parallel-rpc-port {port}: cannot listen on {address}: {e.strerror or e}"
        ) from None
    logger.info("waiting for headless nodes on %s:%d", address, port)
    return sock


def _set_child_environment(args: argparse.Namespace) -> None:
    if args.api_key is not None:
        logger.warning(
            "--api-key is visible to every local user (ps, /proc/PID/cmdline); "
            "set %s in the environment instead", API_KEY_ENV,
        )  # fmt: skip
        os.environ[API_KEY_ENV] = args.api_key
        # The frontends read the key from their environment; out of `args`, it
        # can reach no command line (`--args-json`).
        args.api_key = None
    os.environ["VLLM_LOGGING_LEVEL"] = CHILD_LOG_LEVELS[args.log_level]
    logging.getLogger("vllm_rs").setLevel(CHILD_LOG_LEVELS[args.log_level])
    if args.engine_ready_timeout is not None:
        os.environ["VLLM_ENGINE_READY_TIMEOUT_S"] = str(args.engine_ready_timeout)


def ask_health(http: HttpEndpoint) -> tuple[int, str] | None:
    """`GET /health` once: (status, the error message of a non-200 answer),
    or None when the frontend did not answer (within 2 s)."""
    family, address = http.probe_target()
    response = b""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(2.0)
            probe.connect(address)
            probe.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            while len(response) < HEALTH_RESPONSE_LIMIT and (chunk := probe.recv(HEALTH_RESPONSE_LIMIT)):
                response += chunk
    except OSError:
        if not response:
            return None
    head, _, body = response.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        return None
    status = int(status_line[1])
    if status == 200:
        return status, ""
    try:
        message = str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {status}"
    return status, message


class FrontendHealthWatch:
    """Asks the frontend's `GET /health` until `stop` is set: every 0.1 s
    until the first answer (the frontends answer HTTP only once every engine
    has registered), then every `HEALTH_POLL_INTERVAL_S`. The first 200 calls
    `on_ready`. A 503, at any time, means the frontend has lost an engine
    (dead, hung, or its connection gone) and fails what is sent to it, so
    the stack must stop: unless an engine process is seen exiting within
    `ENGINE_EXIT_GRACE_S` (its death names it and is reported the usual way),
    `failure` gets the frontend's reason and the main thread is interrupted
    with `STOP_SIGNAL`. No answer within 2 s (a busy frontend) is no verdict."""

    STOP_SIGNAL = signal.SIGUSR1

    def __init__(self, http: HttpEndpoint, engine_sentinels: list[int], stop: threading.Event):
        self.failure: str | None = None
        self._http = http
        self._engine_sentinels = engine_sentinels
        self._stop = stop
        self._main_thread = threading.main_thread().ident

    def watch(self, on_ready: Callable[[], None]) -> None:
        """Polls until `stop` is set or the frontend answers 503."""
        ready = False
        while not self._stop.is_set():
            answer = ask_health(self._http)
            if answer is not None and answer[0] == 503:
                self._engine_lost(answer[1])
                return
            if answer is not None and answer[0] == 200 and not ready:
                ready = True
                on_ready()
            self._stop.wait(HEALTH_POLL_INTERVAL_S if ready else 0.1)

    def _engine_lost(self, reason: str) -> None:
        if wait_fds(self._engine_sentinels, ENGINE_EXIT_GRACE_S) or self._stop.is_set():
            return  # an engine died: wait_for_completion_or_failure names it
        self.failure = f"the frontend reports an engine lost: {reason}"
        signal.pthread_kill(self._main_thread, self.STOP_SIGNAL)


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
    from vllm_rs.utils import RustFrontendProcessManager

    # The frontend reads the generation config from `model` (a GGUF's is
    # next to its rebuilt tokenizer); the model's name reaches it as `model_tag`.
    args = argparse.Namespace(**{**vars(plan.args), "model": plan.frontend_model})
    dp = args.data_parallel_size
    coordinator = plan.engine_config.coordinator
    stats_update_address = coordinator.front_publish if coordinator is not None else None
    ((input_listener, output_listener),) = plan.listeners
    return RustFrontendProcessManager(
        plan.frontend_binary, plan.http.sock, args, input_listener, output_listener, 0, dp, dp,
        stats_update_address=stats_update_address,
        grpc_sock=plan.http.grpc_sock,
    )  # fmt: skip


def run_stack(plan: StackPlan) -> int:
    """Starts engines and frontend, waits, stops everything; the exit code."""
    from vllm_rs.engine import run_engine_core
    from vllm_rs.usage import UsageContext, report_usage_stats
    from vllm_rs.utils import CoreEngineProcManager, wait_for_completion_or_failure

    args = plan.args
    stop_requested = _StopRequested()
    for signum in (signal.SIGTERM, signal.SIGINT, FrontendHealthWatch.STOP_SIGNAL):
        signal.signal(signum, stop_requested)
    engines = frontend = usage_report = health = coordinator = nodes = None
    probe_stop = threading.Event()
    failure: str | None = None
    try:
        usage_report = report_usage_stats(plan.engine_config, UsageContext.OPENAI_API_SERVER)
        if plan.coordinator_listeners is not None:
            coordinator = CoordinatorProcManager(args.data_parallel_size, plan.coordinator_listeners)
        nodes = _start_node_registry(plan)
        topology = plan.topology
        if topology is not None and topology.backend == "ray":
            from vllm_rs.multinode.ray_engines import RayEngineActorManager

            engines = RayEngineActorManager(plan.engine_config, topology, not args.disable_log_stats)
        else:
            engines = CoreEngineProcManager(
                run_engine_core, topology.local_count if topology else args.data_parallel_size, 0, 0,
                plan.engine_config, True, plan.engine_config.clients[0].input_address, None,
                not args.disable_log_stats,
            )  # fmt: skip
        frontend = _start_frontend(plan)
        health = FrontendHealthWatch(plan.http, engines.sentinels(), probe_stop)
        announce = functools.partial(_announce_ready, plan, time.monotonic())
        threading.Thread(target=health.watch, args=(announce,), daemon=True, name="HealthProbe").start()
        wait_for_completion_or_failure(frontend, engines, coordinator)
        if stop_requested.signal is None:
            failure = "the frontend exited on its own"
    except KeyboardInterrupt:
        pass  # Ctrl-C or SIGTERM while starting
    except RuntimeError as e:
        failure = str(e)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, FrontendHealthWatch.STOP_SIGNAL):
            signal.signal(signum, signal.SIG_IGN)
        probe_stop.set()
        if failure is None and health is not None:
            failure = health.failure
        if nodes is not None and nodes.failure is not None:
            failure = nodes.failure  # names the lost host and its ranks
        if (engines is not None and engines.failed_proc_name is not None) or (nodes and nodes.failure):
            notify_engine_death(plan.output_addresses)
        if nodes is not None:
            nodes.stop()
        if frontend is not None:
            frontend.shutdown()
        if engines is not None:
            engines.shutdown()
        if coordinator is not None:
            coordinator.shutdown()
        plan.cleanup()
        if usage_report is not None:
            usage_report.join(USAGE_REPORT_WAIT_S)
    if failure is not None:
        print(f"{PROG}: error: {failure}", file=sys.stderr, flush=True)
        return 1
    logger.info("serve stopped")
    return 0


def _start_node_registry(plan: StackPlan) -> Any:
    """Starts accepting headless nodes when some are expected; losing one
    stops the stack like a lost engine (`FrontendHealthWatch.STOP_SIGNAL`)."""
    if plan.node_listener is None or plan.topology is None:
        return None
    from vllm_rs.multinode.node_registry import NodeRegistry

    registry = NodeRegistry(
        plan.node_listener, plan.topology.remote_ranks, plan.topology.data_parallel_size, plan.args.model,
        [c.input_address for c in plan.engine_config.clients], [c.output_address for c in plan.engine_config.clients],
        plan.engine_config.heartbeat_ttl_s or host_heartbeat_timeout_s(), plan.engine_config.coordinator,
    )  # fmt: skip
    plan.node_listener = None  # the registry owns it now
    main_thread = threading.main_thread().ident
    registry.on_lost = lambda: signal.pthread_kill(main_thread, FrontendHealthWatch.STOP_SIGNAL)
    registry.start()
    return registry


def _announce_ready(plan: StackPlan, started: float) -> None:
    args = plan.args
    engines = f"{args.data_parallel_size} engine{'s' if args.data_parallel_size > 1 else ''}"
    print(
        f"vllm-rs: serving the OpenAI API on {plan.http.url} (model {args.served_model_name[0]}, "
        f"{engines}; ready in {time.monotonic() - started:.1f}s)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    """Runs `serve` with `argv` (default: the command line); the exit code."""
    args = make_serve_parser().parse_args(argv)
    try:
        if args.headless:
            config, _ = _validate(args)
        else:
            plan = plan_stack(args)
    except ServeUsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return 2
    if args.headless:
        from vllm_rs.multinode.headless import run_headless

        _set_child_environment(args)
        return run_headless(args, args._topology, config, PROG)
    _set_child_environment(args)
    return run_stack(plan)
