"""Port helpers for the local services we start (builder.core.processes re-exports them): free ports,
whether a requested port can be bound (and why not, in words), the address a client uses. Standard
library only, like builder/core/processes.py.

Usage::

    port = free_port("127.0.0.1")                        # a port free now, not handed out lately
    refuse_taken_ports("127.0.0.1", [("--port", 8000)])  # UserInputError naming --port if 8000 can't be bound
    bind_refusal("127.0.0.1", 80)                        # "needs privileges: ..." for a user who is not root
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from pathlib import Path

from builder.core.errors import UserInputError  # standard library only as well


def client_host(host: str) -> str:
    """The address a client on this machine uses for a service bound to ``host`` (any-address binds
    are reached on loopback; IPv6 literals are bracketed)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


_HANDED_OUT: dict[int, float] = {}  # port -> when free_ports gave it, in this process
_HANDED_OUT_LOCK = threading.Lock()


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports free on ``host`` now, none given by this process in the last 2 minutes:
    replicas started side by side pick ports before binding them, and the OS may give a port just
    released to the next caller (a replica's HTTP port was another one's metrics port)."""
    with _HANDED_OUT_LOCK:
        now = time.monotonic()
        [_HANDED_OUT.pop(port) for port, when in list(_HANDED_OUT.items()) if now - when > 120]
        sockets, ports = [], []
        try:
            while len(ports) < count:
                if len(sockets) >= count + 256:
                    raise OSError(f"no {count} free ports on {host}")
                s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
                s.bind((host, 0))
                sockets.append(s)
                if s.getsockname()[1] not in _HANDED_OUT:
                    ports.append(s.getsockname()[1])
        finally:
            for s in sockets:
                s.close()
        _HANDED_OUT.update({port: now for port in ports})
        return ports


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(host, 1)[0]


def _bind_error(host: str, port: int) -> OSError | None:
    """Why a server could not bind ``host:port`` now (None: it could). A port in TIME_WAIT is free, as
    for servers (SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None


def _unprivileged_start() -> int:
    """The lowest port a user without privileges may bind here (Linux lets it be lowered)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    except (OSError, ValueError):
        return 1024


IN_USE = "is in use by another process"


def _refusal(host: str, port: int) -> tuple[str, bool] | None:
    """None when a server could bind ``host:port`` now; else why not with its fix, in words that follow
    "HOST:PORT", and whether another port would do (not when the address is the trouble)."""
    if not 0 < port <= 65535:  # socket.bind would raise OverflowError, not OSError
        return "is not a port: pick one from 1 to 65535", True
    exc = _bind_error(host, port)
    if exc is None:
        return None
    if exc.errno == errno.EADDRINUSE:
        return IN_USE + "; choose another port", True
    if exc.errno == errno.EACCES:  # as "in use" it read as if another process held port 80
        lowest = _unprivileged_start()
        return (f"needs privileges: ports below {lowest} need root here (permission denied); pick one from "
                f"{lowest} up"), True
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"cannot be listened on: {host} is not an address of this machine ({exc.strerror}); bind an "
                "address it has (127.0.0.1, 0.0.0.0 for all)"), False
    return f"cannot be listened on: {exc.strerror or exc}", False


def bind_refusal(host: str, port: int) -> str | None:
    """None when a server could bind ``host:port`` now; else why not and its fix, in words that follow
    "HOST:PORT": in use, needing privileges (a port below 1024 for a user who is not root) and any
    other refusal are different fixes, so they are told apart."""
    refusal = _refusal(host, port)
    return None if refusal is None else refusal[0]


def port_in_use(host: str, port: int) -> bool:
    """Whether another socket listens on ``host:port`` (a port in TIME_WAIT is free, as for servers).
    A port that cannot be bound for another reason (privileges, an address not of this machine) is a
    ``UserInputError`` saying why: choosing other ports would not help."""
    refusal = bind_refusal(host, port)
    if refusal is None:
        return False
    if refusal.startswith(IN_USE):
        return True
    raise UserInputError(f"{host}:{port} {refusal}")


def refuse_taken_ports(host: str, requested) -> None:
    """``UserInputError`` naming the option of the first ``(option, port)`` of ``requested`` that a
    service could not bind (another process listens there, it needs privileges, ...; None and 0 are
    skipped: those services pick a free port for either): a service asked for a fixed port must not start there, since a readiness probe would be
    answered by the other process."""
    for option, port in requested:
        refusal = _refusal(host, port) if port else None
        if refusal is not None:
            text, another_port_helps = refusal
            leave_out = f", or leave {option} out to have a free one picked" if another_port_helps else ""
            raise UserInputError(f"{option} {port}: {host}:{port} {text}{leave_out}")


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
