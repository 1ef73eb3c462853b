"""A running `serve` stack as another local user sees it. An unprivileged
uid (65534, started with `setpriv` by this root test) attacks the stack
the way a security review did: it cannot connect to any
engine socket (a raw connect fails with EACCES; a pyzmq DEALER with engine
0's identity and a PUSH never get connected), cannot list the socket
directory, and reads no API key from any process of the stack (command
lines hold none, environments are unreadable)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import zmq

from tests.conformance.support import serving
from tests.test_serve import needs_frontend

NOBODY = 65534
API_KEY = "sk-trust-boundary-key"
#: A Python every user may run (the test's own lives under root's 0700 home).
SYSTEM_PYTHON = "/usr/bin/python3"

ATTACKER = r"""
import errno, json, os, socket, sys
import zmq
from zmq.utils.monitor import recv_monitor_message

socket_dir, pids = sys.argv[1], [int(p) for p in sys.argv[2].split(",")]
report = {"uid": os.getuid(), "list_dir": None, "raw_connect": {}, "zmq": {}, "cmdline": {}, "environ": {}}
try:
    report["list_dir"] = os.listdir(socket_dir)
except OSError as e:
    report["list_dir"] = errno.errorcode[e.errno]

for name in ("input-0", "output-0"):
    path = os.path.join(socket_dir, name)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        report["raw_connect"][name] = "connected"
    except OSError as e:
        report["raw_connect"][name] = errno.errorcode[e.errno]
    finally:
        s.close()

# As an engine would: a DEALER with engine 0's identity on the input socket,
# a PUSH on the output socket. ZeroMQ connects in the background, so each
# socket's monitor says what became of the attempt.
ctx = zmq.Context()
for name, kind in (("input-0", zmq.DEALER), ("output-0", zmq.PUSH)):
    sock = ctx.socket(kind)
    if kind == zmq.DEALER:
        sock.setsockopt(zmq.IDENTITY, b"\x00\x00")
    monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED)
    sock.connect("ipc://" + os.path.join(socket_dir, name))
    outcome = "no event within 30 s"
    if monitor.poll(30_000):
        event = recv_monitor_message(monitor)["event"]
        outcome = "connected" if event == zmq.EVENT_CONNECTED else "connect retried"
    report["zmq"][name] = outcome
    sock.disable_monitor()
    monitor.close(linger=0)
    sock.close(linger=0)
ctx.term()

for pid in pids:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            report["cmdline"][pid] = f.read().decode(errors="replace")
    except OSError as e:
        report["cmdline"][pid] = errno.errorcode[e.errno]
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            report["environ"][pid] = f.read().decode(errors="replace")
    except OSError as e:
        report["environ"][pid] = errno.errorcode[e.errno]
print(json.dumps(report))
"""


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to run a client as another uid"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is missing"
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        check=False,
        capture_output=True,
        text=True,
    )
    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if probe.stdout.strip() != ours:
        return f"{SYSTEM_PYTHON} is Python {probe.stdout.strip()}, not {ours}: this pyzmq cannot be lent to it"
    return None


SKIP_REASON = _skip_reason()
if SKIP_REASON:
    print(f"test_trust_boundary skipped: {SKIP_REASON}", file=sys.stderr)
pytestmark = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


@pytest.fixture(scope="module")
def attacker_files():
    """The attack script and a copy of this pyzmq, in a directory the
    unprivileged user can read (root's home is closed to it)."""
    root = Path(tempfile.mkdtemp(prefix="vllm-rs-attacker-"))
    try:
        root.chmod(0o755)
        package = Path(zmq.__file__).parent
        shutil.copytree(package, root / "zmq")
        bundled_libs = package.parent / "pyzmq.libs"  # the wheel's libzmq, found relative to the package
        if bundled_libs.is_dir():
            shutil.copytree(bundled_libs, root / "pyzmq.libs")
        script = root / "attack.py"
        script.write_text(ATTACKER)
        for path in [root, *root.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o555 if path.is_dir() else path.stat().st_mode | 0o444)
        yield root
    finally:
        shutil.rmtree(root)


@pytest.fixture(scope="module")
def stack():
    """echo on one engine behind an API key given in the environment."""
    with serving(env={"VLLM_API_KEY": API_KEY}) as serve:
        yield serve


def run_as_nobody(attacker_files: Path, *args: str) -> dict:
    result = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         SYSTEM_PYTHON, "-s", str(attacker_files / "attack.py"), *args],
        check=False, capture_output=True, text=True, timeout=120, cwd="/",
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(attacker_files)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@needs_frontend
def test_another_user_reaches_no_engine_socket_and_reads_no_key(stack, attacker_files):
    directory = stack.socket_dir
    processes = stack.stack_processes()
    report = run_as_nobody(attacker_files, directory, ",".join(str(p.pid) for p in processes))
    assert report["uid"] == NOBODY
    assert report["list_dir"] == "EACCES"
    assert report["raw_connect"] == {"input-0": "EACCES", "output-0": "EACCES"}
    assert report["zmq"] == {"input-0": "connect retried", "output-0": "connect retried"}
    for process in processes:
        cmdline = report["cmdline"][str(process.pid)]
        assert cmdline not in ("", "EACCES") and API_KEY not in cmdline, cmdline  # readable, and keyless
        assert report["environ"][str(process.pid)] == "EACCES"
    # The stack itself still serves, with the key.
    assert stack.http("GET", "/v1/models", headers={"authorization": f"Bearer {API_KEY}"})[0] == 200
