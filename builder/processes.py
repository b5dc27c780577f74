"""Small process and port helpers shared by every local service we start (tritonserver, Prometheus,
the exporter, nginx, moto, Locust).

Usage::

    port = free_port("127.0.0.1")
    proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=die_with_parent())
    killpg(proc.pid, signal.SIGTERM)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from typing import Iterator


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports the OS says are free on ``host`` right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(host, 1)[0]


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def killpg(pgid: int, sig: int) -> None:
    """Signal a process group; one that is already gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent():
    """A ``preexec_fn`` giving the child SIGTERM when the thread that started it dies (Linux
    ``PR_SET_PDEATHSIG``), so a parent killed without cleanup leaves nothing behind; None elsewhere."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None

    def preexec() -> None:
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return preexec


@contextlib.contextmanager
def stop_signals() -> Iterator[list[int]]:
    """Record SIGINT/SIGTERM instead of dying, for foreground loops that must stop their services
    cleanly; yields the list of signals received and restores the previous handlers on exit.
    Outside the main thread (where handlers cannot be installed) it records nothing.

    Usage::

        with stop_signals() as received:
            while not received:
                time.sleep(0.2)
    """
    received: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, _frame: received.append(signum))
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
