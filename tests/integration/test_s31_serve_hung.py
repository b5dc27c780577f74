"""A tritonserver that hangs while served (heap corruption did it once; SIGSTOP stands in for it here):
its stop is a failure that keeps and names the log, and ``serve`` announces the silence while serving.

Real servers, no mocks; every wait is bounded, and every stopped process is resumed or killed after.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from builder.core.errors import ServerDiedError
from builder.serving.embedded import EmbeddedServer
from tests.integration.python_models import ADD_ONE_PY, python_model
from tests.integration.test_embedded_server import _read_until, _tree, _wait_gone

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("hung_repo")
    python_model(repo, "add_one", ADD_ONE_PY)
    return repo


def _resume(server: EmbeddedServer) -> None:
    """A test that failed midway must not leave a stopped server behind."""
    if server.is_running():
        os.kill(server.pid, signal.SIGCONT)
    server.stop()


def test_stop_of_a_hung_server_kills_it_keeps_its_log_and_says_so(repo):
    server = EmbeddedServer(repo, load_models=["add_one"])
    server.start()
    pid, log = server.pid, server.log_path
    try:
        os.kill(pid, signal.SIGSTOP)
        assert server.stop(timeout=1) == -signal.SIGKILL
        assert server.killed_at_stop
        assert server.stop_failure.startswith(
            f"tritonserver (pid {pid}) did not stop on SIGTERM within 1 s: killed; last log lines:\n  ")
        assert server.stop_failure.endswith(f"\nlog kept at {log}")
        assert "crash" not in server.stop_failure  # nothing in its log says why: the tail is all there is
        assert log.is_file() and "Started HTTPService" in log.read_text()  # the only record is kept
        server.stop()
        assert server.stop_failure.endswith(f"\nlog kept at {log}") and log.is_file()  # a second stop keeps both
    finally:
        _resume(server)
        shutil.rmtree(log.parent, ignore_errors=True)


def test_a_crash_in_the_log_makes_a_stop_a_failure(repo, tmp_path):
    log = tmp_path / "own.log"
    server = EmbeddedServer(repo, load_models=["add_one"], log_path=log)
    server.start()
    pid = server.pid
    try:
        with open(log, "a") as f:  # what tritonserver printed before it hung in the incident
            f.write("malloc_consolidate(): unaligned fastbin chunk detected\nSignal (6) received.\n")
        assert server.stop() == 0  # this one still ends on SIGTERM, which Triton logs as "Signal (15)"
        assert not server.killed_at_stop
        assert server.stop_failure == (f"tritonserver (pid {pid}) stopped, but its log reports a crash:\n"
                                       "  malloc_consolidate(): unaligned fastbin chunk detected\n"
                                       f"  Signal (6) received.\nlog kept at {log}")
        assert log.is_file()
        server.start()  # a new run: the old crash is in the log, but not in this run's part of it
        assert server.stop_failure is None
        server.stop()
        assert server.stop_failure is None
    finally:
        _resume(server)


def test_serve_warns_once_of_a_silent_server_then_keeps_its_log_when_it_must_be_killed(repo):
    code = ("import sys; from builder.serving.embedded import EmbeddedServer; EmbeddedServer.stop_timeout = 1.0; "
            "from builder.serving.serve import serve_forever; "
            f"sys.exit(serve_forever({str(repo)!r}, hang_probe_interval=0.2, hang_probe_misses=3))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = _pump(proc)
    pid = None
    log = None
    try:
        out = _read_until(lines, "Stop with", timeout=60)
        pid = int(re.search(r"pid (\d+)", out).group(1))
        http = re.search(r"HTTP\s+(\S+)", out).group(1)
        log = Path(re.search(r"log\s+(/\S+tritonserver\.log)", out).group(1))
        pids = _tree(pid)

        os.kill(pid, signal.SIGSTOP)
        warned = _read_until(lines, "has not answered", timeout=30)
        assert re.search(rf"WARNING: tritonserver at {re.escape(http)} \(pid {pid}\) has not answered for \d+ s "
                         rf"\(hung\?\); its log: {re.escape(str(log))}$", warned, re.M)
        silence = _read_until(lines, "goes on waiting", timeout=10)
        assert "serve leaves it running and goes on waiting; Ctrl-C or SIGTERM stops it" in silence
        assert proc.poll() is None  # serve leaves the server to the user: it may only be overloaded

        os.kill(pid, signal.SIGCONT)
        back = _read_until(lines, "answers again", timeout=30)
        assert re.search(rf"tritonserver at {re.escape(http)} answers again, after \d+ s without an answer", back)
        assert "has not answered" not in back  # one warning for one silence

        os.kill(pid, signal.SIGSTOP)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == ServerDiedError.exit_code
        rest = _read_until(lines, "log kept at", timeout=10)
        assert f"tritonserver (pid {pid}) did not stop on SIGTERM within 1 s: killed; last log lines:" in rest
        assert rest.rstrip().endswith(f"log kept at {log}") and "nothing failed" not in rest
        assert log.is_file()
        assert _wait_gone(pids, 10) == []
    finally:
        if pid is not None and proc.poll() is None:
            os.kill(pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if log is not None:
            shutil.rmtree(log.parent, ignore_errors=True)


def _pump(proc: subprocess.Popen):
    import queue
    import threading

    lines: queue.Queue[str] = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    return lines
