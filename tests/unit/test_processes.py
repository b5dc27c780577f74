"""builder.core.processes: the LocalService base class and run_command, with tiny real processes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.core.errors import UserInputError
from builder.core.processes import (AddressInUse, CommandError, LocalService, free_port, group_alive, port_open,
                               run_command)

_IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"


class HttpServer(LocalService):
    label = "test http server"

    def __init__(self, tmp: Path, code: str | None = None, ready_timeout: float = 15.0, port: int | None = None):
        super().__init__(ready_timeout=ready_timeout)
        self.log_path = tmp / "server.log"
        self.code = code
        self.requested = port
        self.port: int | None = None
        self.cleaned = 0

    def _auto_ports(self) -> bool:
        return self.requested is None

    def _pick_ports(self) -> None:
        self.port = self.requested or free_port(self.host)

    def _command(self) -> list[str]:
        if self.code is not None:
            return [sys.executable, "-c", self.code]
        return [sys.executable, "-u", "-m", "http.server", "--bind", self.host, str(self.port)]

    def _ready(self) -> bool:  # its own banner: the port may answer for another process
        return "Serving HTTP" in self.read_log() and port_open(self.host, self.port)

    def _address_in_use(self, code: int) -> str | None:
        busy = [line for line in self.read_log().splitlines() if "Address already in use" in line]
        return busy[0] if busy and self._auto_ports() else None

    def _cleanup(self) -> None:
        self.cleaned += 1


def test_start_ready_stop(tmp_path):
    with HttpServer(tmp_path) as server:
        assert server.is_running() and server.pid
        assert port_open("127.0.0.1", server.port)
        pid = server.pid
    assert not server.is_running()
    assert not group_alive(pid)
    assert server.returncode is not None and server.cleaned == 1
    assert not server.killed_at_stop  # it ended on SIGTERM
    assert server.stop() == server.returncode  # idempotent


def test_stop_kills_a_process_ignoring_sigterm(tmp_path):
    server = HttpServer(tmp_path, code=_IGNORE_TERM)
    server._ready = lambda: "up" in server.read_log()
    server.start()
    started = time.monotonic()
    code = server.stop(timeout=0.5)
    assert code == -9
    assert server.killed_at_stop  # what lets its owner call the stop a failure (a hung tritonserver)
    assert 0.4 < time.monotonic() - started < 5
    assert not server.is_running()


def test_stop_on_a_process_already_gone_does_not_raise(tmp_path):
    server = HttpServer(tmp_path)
    assert server.stop() is None  # never started
    server.start()
    subprocess.run(["kill", "-9", str(server.pid)], check=True)
    server._proc.wait(5)
    assert server.stop() == -9
    assert not server.killed_at_stop  # killed by someone else before the stop: the stop killed nothing
    assert server.stop() == -9


def test_exit_during_start_quotes_the_log(tmp_path):
    server = HttpServer(tmp_path, code="import sys; print('boom: no config', flush=True); sys.exit(3)")
    with pytest.raises(RuntimeError, match=r"test http server exited with code 3 while starting; "
                                           r"last log lines:\nboom: no config\nfull log: .*server.log"):
        server.start()
    assert not server.is_running() and server.cleaned == 1


def test_ready_timeout_quotes_the_log_and_stops(tmp_path):
    server = HttpServer(tmp_path, code="import time; print('still warming up', flush=True); time.sleep(60)",
                        ready_timeout=0.5)
    server._ready = lambda: False
    with pytest.raises(RuntimeError, match=r"was not ready within 0.5 s; last log lines:\nstill warming up"):
        server.start()
    assert not server.is_running()


def test_retries_on_new_ports_when_the_address_is_in_use(tmp_path):
    (tmp_path / "a").mkdir()
    taken = HttpServer(tmp_path / "a").start()
    try:
        server = HttpServer(tmp_path)
        first = []

        def choose():
            server.port = taken.port if not first else free_port()
            first.append(server.port)

        server._auto_ports = lambda: True
        server._pick_ports = choose
        with server:
            assert first[0] == taken.port and server.port != taken.port
        fixed = HttpServer(tmp_path, port=taken.port)
        with pytest.raises(RuntimeError, match="exited with code 1 while starting"):
            fixed.start()
        assert isinstance(AddressInUse("x"), Exception)
    finally:
        taken.stop()


def test_a_requested_port_in_use_is_refused_before_anything_starts(tmp_path):
    (tmp_path / "a").mkdir()
    taken = HttpServer(tmp_path / "a").start()
    try:
        server = HttpServer(tmp_path, port=taken.port)
        server._fixed_ports = lambda: [("--port", taken.port)]
        with pytest.raises(UserInputError, match=rf"^--port {taken.port}: 127\.0\.0\.1:{taken.port} is in use by "
                                                 r"another process; choose another port, or leave --port out"):
            server.start()
        assert server.pid is None  # nothing was launched
    finally:
        taken.stop()


def test_ready_needs_the_process_alive_not_only_an_answer(tmp_path):
    # a port answering for a process that already died (it could not bind; another holds the port)
    server = HttpServer(tmp_path, code="raise SystemExit(4)")
    server._ready = lambda: time.sleep(0.5) or True
    with pytest.raises(RuntimeError, match="exited with code 4 while starting"):
        server.start()


def test_run_command_output_timeout_and_errors():
    done = run_command([sys.executable, "-c", "print('hello')"], timeout=30)
    assert done.returncode == 0 and done.stdout == "hello\n"
    with pytest.raises(subprocess.TimeoutExpired, match=r"timed out after 0.5 seconds"):
        run_command([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    with pytest.raises(CommandError, match=r"python\S* failed \(exit 4\): bad thing"):
        run_command([sys.executable, "-c", "import sys; sys.exit('bad thing') if False else (print('bad thing', file=sys.stderr), sys.exit(4))"],
                    timeout=30, check=True)
    with pytest.raises(OSError):
        run_command(["/nonexistent/binary"], timeout=5)


def test_free_ports_never_hands_the_same_port_twice_in_a_process():
    from builder.core.processes import free_ports

    first = free_ports("127.0.0.1", 3)
    later = [port for _ in range(20) for port in free_ports("127.0.0.1", 3)]
    assert len(set(first)) == 3 and not set(first) & set(later) and len(set(later)) == len(later)
