"""The cores a server on this machine may use, found from the port it listens on.

``tune`` sizes its instance x thread layouts to the server's cores. The server may run on other cores
than the tuning process (``taskset -c 0-7 triton-builder serve`` beside ``taskset -c 8-15 triton-builder
tune``, so that the load generator does not take the server's CPU): the layouts must then follow the
server's affinity, not tune's. Linux only (/proc/net/tcp*, /proc/PID/fd); None wherever the listener
cannot be found (another machine, another user's process, no /proc).

It also holds the two steps of putting a server and its load generator on separate cores, as the
benchmarks and tests do: ``split_cores`` cuts the usable cores in two, ``pin_process`` moves every thread
of this process (the processes it starts from then on inherit the affinity).

Usage::

    pid = listening_pid(8001)                    # the process listening on 127.0.0.1:8001, or None
    cores = server_usable_cores("127.0.0.1:8001")  # its usable cores (affinity, this cgroup's quota)
    server, client = split_cores(sorted(os.sched_getaffinity(0)), usable_cores())
    pin_process(server)                          # start the server now, then pin_process(client)
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from builder.core.host import usable_cores

LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")  # urlsplit's hostname drops IPv6 brackets
_LISTEN = "0A"  # the TCP_LISTEN state in /proc/net/tcp


def listening_inodes(port: int, tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")) -> set[str]:
    """The socket inodes listening on ``port`` (any local address)."""
    inodes = set()
    for table in tables:
        try:
            with open(table) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            local_port = fields[1].rpartition(":")[2]
            if int(local_port, 16) == port:
                inodes.add(fields[9])
    return inodes


def listening_pid(port: int, proc: str = "/proc") -> int | None:
    """The pid of the process that holds the socket listening on ``port``; None where none is visible."""
    inodes = listening_inodes(port, (f"{proc}/net/tcp", f"{proc}/net/tcp6"))
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        folder = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(folder)
        except OSError:  # another user's process, or gone
            continue
        for fd in fds:
            try:
                if os.readlink(f"{folder}/{fd}") in targets:
                    return int(pid)
            except OSError:
                continue
    return None


def server_usable_cores(url: str) -> tuple[int, int] | None:
    """(usable cores, pid) of the server listening at ``url`` on this machine (host:port or a URL with a
    scheme); None for another machine or where the listener cannot be seen. The affinity is the server's;
    the cgroup quota is this process's (a server in another container is not found: its sockets are in
    another network namespace)."""

    parts = urlsplit(url if "://" in url else f"//{url}")
    if parts.hostname not in LOOPBACK or not hasattr(os, "sched_getaffinity"):
        return None
    try:
        port = parts.port
    except ValueError:
        return None
    pid = listening_pid(port) if port else None
    if pid is None:
        return None
    try:
        return usable_cores(affinity=len(os.sched_getaffinity(pid))), pid
    except OSError:
        return None


def split_cores(cpus: list[int], usable: int) -> tuple[list[int], list[int]] | None:
    """(server cores, client cores): the usable cores cut in two, the server taking the larger half;
    None where fewer than 2 are usable."""
    cpus = sorted(cpus)[:max(1, usable)]
    if len(cpus) < 2:
        return None
    half = (len(cpus) + 1) // 2
    return cpus[:half], cpus[half:]


def pin_process(cpus) -> None:
    """Every thread of this process on ``cpus`` (an affinity is per thread on Linux: the forker thread of
    builder/core/processes.py starts tritonserver and perf_analyzer, and they inherit its affinity)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), set(cpus))
        except OSError:  # a thread that ended meanwhile
            pass
