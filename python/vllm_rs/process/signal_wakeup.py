"""A socket that becomes readable whenever a signal arrives.

The kernel hands a process-directed signal (kill(2)) to any of its threads
that does not block it: often the main thread, sometimes a library's helper
thread. Python runs handlers on the main thread only, at its next bytecode;
a main thread blocked in a wait on sockets or sentinels then sleeps on and
never runs the handler. Waiting on this socket too ends that wait.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def signal_wakeup() -> Iterator[socket.socket | None]:
    """While inside, yields a non-blocking socket that becomes readable on
    every signal whose handler is a Python function (`signal.set_wakeup_fd`);
    the wait that sees it readable should `drain` it and go on, the handler
    having run by then. Yields None off the main thread, where Python allows
    no wakeup fd. Restores the previous wakeup fd on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    reader, writer = socket.socketpair()
    try:
        for end in (reader, writer):
            end.setblocking(False)
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        try:
            yield reader
        finally:
            signal.set_wakeup_fd(previous)
    finally:
        reader.close()
        writer.close()


def drain(wakeup: socket.socket) -> None:
    """Reads the signal numbers waiting in `wakeup`, so the next wait blocks."""
    try:
        while wakeup.recv(4096):
            pass
    except BlockingIOError:
        pass
