"""`triton-builder replicas` watching what it started: a balancer port another process holds is refused
before anything starts, nginx dying ends the session (exit 2, its error log kept), each replica that
dies is announced with its log, and a rollout that failed its check makes the session exit 1.
Real tritonserver and nginx processes, as test_replica_logs.py starts them."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from builder.core.processes import free_port, pid_alive, stop_signals
from tests.conftest import run_cli
from tests.integration.test_embedded_server import _read_until
from tests.integration.test_replica_logs import nginx, spaced_repo  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration

MODEL = "digits_cnn"


def _session(repository: Path, driver, replicas: int = 1, **kwargs) -> tuple[int, str]:
    """``run_replicas`` in this (the main) thread, as the CLI runs it, while ``driver(lines)`` acts on
    its announcements in another; SIGINT stops the session once the driver returns. Returns the exit
    code and the announced text; re-raises what the driver raised."""
    from builder.scaleout.replicas import run_replicas

    lines: "queue.Queue[str]" = queue.Queue()
    said: list[str] = []
    done = threading.Event()
    raised: list[BaseException] = []

    def announce(text: str) -> None:
        said.append(text)
        lines.put(text + "\n")

    def drive() -> None:
        try:
            driver(lines)
        except BaseException as err:  # noqa: BLE001 - re-raised in the test's thread
            raised.append(err)
        finally:
            if not done.is_set():
                os.kill(os.getpid(), signal.SIGINT)

    # a SIGINT arriving just after run_replicas returned is recorded here instead of interrupting pytest
    with stop_signals():
        thread = threading.Thread(target=drive, daemon=True)
        thread.start()
        try:
            code = run_replicas(repository, replicas, prometheus=False, announce=announce, **kwargs)
        finally:
            done.set()
            thread.join(60)
    if raised:
        raise raised[0]
    return code, "\n".join(said)


def test_a_balancer_port_in_use_is_refused_before_any_replica_starts(nginx, spaced_repo):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = run_cli("replicas", "--repository", str(spaced_repo), "--replicas", "1", "--http-port", str(port),
                         "--no-prometheus", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert re.search(rf"--http-port {port}: 127\.0\.0\.1:{port} is in use by another process; choose another "
                     r"port, or leave --http-port out", result.stderr), result.stderr
    assert "Triton replicas" not in result.stdout and time.monotonic() - started < 60


def test_nginx_dying_ends_the_session_and_keeps_its_error_log(nginx, spaced_repo):
    def kill_nginx(lines):
        out = _read_until(lines, "Stop with Ctrl-C", timeout=120)
        os.kill(int(re.search(r"nginx    pid (\d+)", out).group(1)), signal.SIGKILL)
        _read_until(lines, "stopping", timeout=30)

    code, out = _session(spaced_repo, kill_nginx, watch_seconds=1)
    assert code == 2, out
    assert re.search(r"nginx \(the balancer on 127\.0\.0\.1:\d+ / 127\.0\.0\.1:\d+\) exited with code -9: .*; "
                     r"stopping", out), out
    kept = Path(re.search(r"logs kept in (\S+)", out).group(1))
    try:
        assert (kept / "replica-0.log").is_file() and (kept / "nginx-error.log").is_file()
        replica_pid = int(re.search(r"replica 0: .* pid (\d+)", out).group(1))
        assert not pid_alive(replica_pid)
    finally:
        shutil.rmtree(kept, ignore_errors=True)


@pytest.fixture
def digits_repo(built_repository, tmp_path) -> Path:
    repo = tmp_path / "model_repository"
    shutil.copytree(built_repository / MODEL, repo / MODEL,
                    ignore=shutil.ignore_patterns("__pycache__", ".triton-builder.lock"))
    return repo


def test_a_dead_replica_is_announced_and_a_failed_rollout_makes_the_session_exit_1(nginx, digits_repo):
    from tests.integration.test_scaleout import _add_version

    def crash_then_publish_a_failing_version(lines):
        out = _read_until(lines, "Stop with Ctrl-C", timeout=180)
        os.kill(int(re.search(r"replica 1: .* pid (\d+)", out).group(1)), signal.SIGKILL)
        _read_until(lines, "replica 1 exited", timeout=30)
        assert _add_version(digits_repo, reference_shift=1.0) == 2
        _read_until(lines, "rollout stopped", timeout=180)

    code, out = _session(digits_repo, crash_then_publish_a_failing_version, replicas=2, watch_seconds=1)
    kept = Path(re.search(r"logs kept in (\S+)", out).group(1))
    try:
        assert code == 1, out
        assert re.search(r"replica 1 exited \(code -9\); the balancer skips it; its log is kept: \S+replica-1\.log",
                         out), out
        assert out.count("replica 1 exited") == 1, out  # announced once, not at every poll
        assert f"rollout stopped: rollout of {MODEL} version 2 stopped at replica 0: the served check failed" in out
        assert "received SIGINT; stopping (exit 1: a rollout failed in this session)" in out
        assert (kept / "replica-1.log").is_file()
    finally:
        shutil.rmtree(kept, ignore_errors=True)
