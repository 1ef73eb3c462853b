"""Engines on more than one host: the data-parallel flags' meaning (vLLM's),
checked before anything starts.

Topology: the head runs the frontends and ranks `0 .. --data-parallel-size-local`;
each headless node runs `--data-parallel-size-local` ranks from
`--data-parallel-start-rank`. The head binds its frontends' engine sockets
as TCP on `--data-parallel-address` (never on every interface) and the node
channel (`node_channel.py`) on `--data-parallel-address:--data-parallel-rpc-port`;
a headless node connects there, says which ranks it runs, and gets the engine
socket addresses back. The channel then carries heartbeats both ways, so either
side notices the other's loss (a closed connection at once, a cut link
within `host_heartbeat_timeout_s()`).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
from dataclasses import dataclass

#: vLLM's default `--data-parallel-rpc-port`.
DEFAULT_RPC_PORT = 29550
#: Environment variable for the heartbeat timeout.
HEARTBEAT_TIMEOUT_ENV = "VLLM_RS_HOST_HEARTBEAT_TIMEOUT_S"
DEFAULT_HEARTBEAT_TIMEOUT_S = 5.0


class TopologyError(ValueError):
    """The data-parallel flags do not describe a deployment (exit 2)."""


def host_heartbeat_timeout_s() -> float:
    """`VLLM_RS_HOST_HEARTBEAT_TIMEOUT_S` (default 5, 2 to 3600): how long a
    peer host may stay silent before it counts as lost. The engines' ZeroMQ
    heartbeat TTL toward the frontends is the same."""
    raw = os.environ.get(HEARTBEAT_TIMEOUT_ENV) or str(DEFAULT_HEARTBEAT_TIMEOUT_S)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 2 <= value <= 3600:
        raise TopologyError(f"{HEARTBEAT_TIMEOUT_ENV}={raw!r}: must be a number of seconds from 2 to 3600")
    return value


@dataclass(frozen=True)
class Topology:
    """Which data-parallel ranks this host runs, and where the head is."""

    data_parallel_size: int
    local_count: int
    start_rank: int
    #: The head's address on the trusted network; None on a single host.
    address: str | None
    rpc_port: int
    headless: bool
    backend: str

    @property
    def spans_hosts(self) -> bool:
        """Whether engines run elsewhere than on the head (TCP engine sockets)."""
        return self.headless or self.local_count < self.data_parallel_size or self.backend == "ray"

    @property
    def local_ranks(self) -> range:
        """The ranks this host runs."""
        return range(self.start_rank, self.start_rank + self.local_count)

    @property
    def remote_ranks(self) -> range:
        """On the head, the ranks headless nodes run."""
        return range(self.local_count, self.data_parallel_size)


def _check_address(option: str, address: str) -> str:
    """`address` as an IP literal: a name is resolved (once, here), a
    wildcard is refused (the other hosts must be able to connect to it, and
    engine sockets must not listen on every interface)."""
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        try:
            infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            raise TopologyError(f"{option} {address}: cannot resolve it: {e}") from None
        ip = ipaddress.ip_address(infos[0][4][0])
    if ip.is_unspecified:
        raise TopologyError(
            f"{option} {address}: a wildcard address would expose the engine sockets on every interface; "
            "give the head's address on the trusted network"
        )
    return str(ip)


def plan_topology(args: argparse.Namespace) -> Topology:
    """Checks the data-parallel flags as vLLM reads them; TopologyError names
    the flag that is wrong."""
    size = args.data_parallel_size
    local = size if args.data_parallel_size_local is None else args.data_parallel_size_local
    backend = args.data_parallel_backend
    rpc_port = DEFAULT_RPC_PORT if args.data_parallel_rpc_port is None else args.data_parallel_rpc_port
    if not 1 <= rpc_port <= 65535:
        raise TopologyError(f"--data-parallel-rpc-port {rpc_port}: must be a port from 1 to 65535")
    if not 0 <= local <= size:
        raise TopologyError(f"--data-parallel-size-local {local}: must be from 0 to --data-parallel-size ({size})")
    start = args.data_parallel_start_rank
    if args.headless:
        if backend == "ray":
            raise TopologyError("--headless: not with --data-parallel-backend ray (Ray places the engines)")
        if local < 1:
            raise TopologyError("--headless: needs --data-parallel-size-local of at least 1")
        if start is None:
            raise TopologyError("--headless: needs --data-parallel-start-rank (this node's first rank)")
        if not 1 <= start <= size - local:
            raise TopologyError(
                f"--data-parallel-start-rank {start}: a headless node's ranks must lie within 1 .. {size - 1} "
                f"(rank 0 is the head's), and {local} rank(s) from {start} do not"
            )
        if args.data_parallel_address is None:
            raise TopologyError("--headless: needs --data-parallel-address (the head node's address)")
    else:
        if start not in (None, 0):
            raise TopologyError("--data-parallel-start-rank: applies to --headless nodes (the head runs from rank 0)")
        if backend == "mp" and local < 1:
            raise TopologyError("--data-parallel-size-local 0: the head runs at least one engine here")
        start = 0
    address = None
    spans = args.headless or local < size or backend == "ray"
    if args.data_parallel_address is not None:
        address = _check_address("--data-parallel-address", args.data_parallel_address)
    elif spans and backend == "mp":
        raise TopologyError(
            f"--data-parallel-size-local {local} < --data-parallel-size {size}: engines on other hosts need "
            "--data-parallel-address (the head's address on a trusted network)"
        )
    if backend == "ray" and address is None:
        address = _check_address("--data-parallel-address", _ray_node_ip())
    return Topology(size, local, start, address, rpc_port, bool(args.headless), backend)


def _ray_node_ip() -> str:
    """This host's address as Ray sees it (the default address for Ray)."""
    try:
        from ray.util import get_node_ip_address
    except ImportError:
        raise TopologyError("--data-parallel-backend ray: Ray is not installed (pip install 'vllm-rs[ray]')") from None
    return get_node_ip_address()


def tcp_endpoint(address: str, port: int) -> str:
    """`tcp://address:port`, brackets around an IPv6 address."""
    return f"tcp://[{address}]:{port}" if ":" in address else f"tcp://{address}:{port}"
