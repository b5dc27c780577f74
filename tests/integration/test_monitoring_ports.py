"""`python -m builder.monitoring.prometheus` next to another process on its ports: a busy --port or
--exporter-port is refused naming the flag before anything starts (it used to announce the other
process's Prometheus or exporter as its own), and the exporter dying is noticed like Prometheus
dying. Real prometheus and exporter processes; Triton is not needed (its address may be down)."""

from __future__ import annotations

import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading

import pytest

from builder.core.processes import free_ports, pid_alive
from tests.conftest import ROOT, in_ci
from tests.integration.test_embedded_server import _read_until

pytestmark = pytest.mark.integration

DOWN = "127.0.0.1:1"  # nothing listens there: the exporter and Prometheus start all the same


@pytest.fixture
def prometheus_binary():
    if shutil.which("prometheus") is None:
        message = "prometheus not installed: run scripts/install-system-deps.sh (or `make setup`)"
        if in_ci():
            pytest.fail(message + " -- CI is set, so this is a failure")
        pytest.skip(message)


def _command(port: int, exporter_port: int) -> list[str]:
    return [sys.executable, "-m", "builder.monitoring.prometheus", "--triton-url", DOWN, "--triton-metrics", DOWN,
            "--port", str(port), "--exporter-port", str(exporter_port)]


@pytest.mark.parametrize("busy", ["--port", "--exporter-port"])
def test_a_busy_port_is_refused_naming_its_flag(prometheus_binary, busy):
    port, exporter_port = free_ports("127.0.0.1", 2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        if busy == "--port":
            port = held
        else:
            exporter_port = held
        done = subprocess.run(_command(port, exporter_port), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert re.search(rf"^error: {busy} {held}: 127\.0\.0\.1:{held} is in use by another process; choose another "
                     rf"port, or leave {busy} out", done.stderr, re.M), done.stderr
    assert "Prometheus" not in done.stdout and "exporter" not in done.stdout, done.stdout


def test_the_exporter_dying_is_noticed(prometheus_binary):
    proc = subprocess.Popen(_command(*free_ports("127.0.0.1", 2)), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        out = _read_until(lines, "Stop with Ctrl-C", timeout=60)
        prometheus_pid = int(re.search(r"^Prometheus .*\(pid (\d+)", out, re.M).group(1))
        exporter_pid = int(re.search(r"^exporter .*\(pid (\d+)\)", out, re.M).group(1))
        subprocess.run(["kill", "-9", str(exporter_pid)], check=True)
        assert proc.wait(timeout=30) == 2
        assert "the exporter exited on its own (code -9)" in _read_until(lines, "exited on its own", 10)
        assert not pid_alive(prometheus_pid)  # stopped with the session, not left scraping nothing
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
