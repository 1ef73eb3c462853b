"""Hosts for multi-node tests: Linux network namespaces on one small subnet.

`Hosts(n)` makes namespaces `<prefix>-0 .. <prefix>-(n-1)`; host 0 holds a
bridge with address 10.R.0.1/24, each other host i a veth pair to it with
10.R.0.(i+1)/24 (R random per run). Every namespace has its own loopback
and nothing else: traffic between them never leaves the machine, and
nothing outside them is reachable. `close()` deletes them (a process left
inside keeps no network). `unavailable_reason()` says why namespaces cannot
be made here (not root, no `ip`), for a skip."""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import subprocess
from collections.abc import Iterator

#: setns(2)'s flag for a network namespace.
CLONE_NEWNET = 0x40000000


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def unavailable_reason() -> str | None:
    """None when this process can make network namespaces, else why not."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    name = f"vrs-probe-{os.getpid()}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns add` failed: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


class Hosts:
    """`count` namespaces joined on one subnet; see the module docstring."""

    def __init__(self, count: int, default_route: bool = False):
        self.prefix = f"vrs{os.getpid() % 100000}{random.randrange(100, 999)}"
        self.subnet = random.randrange(64, 250)
        self.names: list[str] = []
        try:
            for i in range(count):
                name = f"{self.prefix}-{i}"
                _ip("netns", "add", name)
                self.names.append(name)
                _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", self.names[0], "link", "add", "br0", "type", "bridge")
            _ip("-n", self.names[0], "addr", "add", f"{self.address(0)}/24", "dev", "br0")
            _ip("-n", self.names[0], "link", "set", "br0", "up")
            for i in range(1, count):
                # Created in host i's namespace, the peer end moved to host 0's bridge.
                _ip("-n", self.names[i], "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}")
                _ip("-n", self.names[i], "link", "set", f"p{i}", "netns", self.names[0])
                _ip("-n", self.names[0], "link", "set", f"p{i}", "master", "br0")
                _ip("-n", self.names[0], "link", "set", f"p{i}", "up")
                _ip("-n", self.names[i], "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                _ip("-n", self.names[i], "link", "set", "eth0", "up")
            if default_route:
                # Programs that find "their" address by routing toward the
                # internet (Ray does) get the subnet's; nothing leaves it.
                _ip("-n", self.names[0], "route", "add", "default", "dev", "br0")
                for i in range(1, count):
                    _ip("-n", self.names[i], "route", "add", "default", "via", self.address(0))
        except BaseException:
            self.close()
            raise

    def address(self, i: int) -> str:
        """Host i's address on the subnet."""
        return f"10.{self.subnet}.0.{i + 1}"

    def command(self, i: int, argv: list[str]) -> list[str]:
        """`argv` to run inside host i."""
        return ["ip", "netns", "exec", self.names[i], *argv]

    @contextlib.contextmanager
    def inside(self, i: int) -> Iterator[None]:
        """Runs the block with the calling thread in host i's namespace (a
        network namespace is per thread): sockets it opens stay there."""
        libc = ctypes.CDLL(None, use_errno=True)
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{self.names[i]}", os.O_RDONLY)
        try:
            if libc.setns(target, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {self.names[i]}")
            yield
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
            os.close(own)
            os.close(target)

    def cut_link(self, i: int) -> None:
        """Takes host i's link down (`ip link set down`): no FIN, no RST, silence."""
        _ip("-n", self.names[i], "link", "set", "eth0", "down")

    def add_delay(self, i: int, delay_ms: float) -> None:
        """`tc netem` delay on host i's side of its link (both directions
        when given to every host: each host delays what it sends)."""
        device = "br0" if i == 0 else "eth0"
        _ip(
            "netns",
            "exec",
            self.names[i],
            "tc",
            "qdisc",
            "add",
            "dev",
            device,
            "root",
            "netem",
            "delay",
            f"{delay_ms}ms",
        )

    def close(self) -> None:
        """Deletes every namespace (and so its links)."""
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.names = []
