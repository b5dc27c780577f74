"""tune against a real tritonserver that stops answering mid-search (SIGSTOP: what a hung server looks like
from outside): tune exits 2 naming the server, within seconds of the watch's limit rather than after a
load's timeout per candidate, and the server, once it answers again, is left with no copy of tune's.
The same without a server: tests/unit/test_tune_unreachable.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from builder.serving.client import TritonClient
from builder.serving.embedded import EmbeddedServer
from tests.integration.python_models import python_model

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.faults]

MODEL = "add_one"
#: well over the watch's 15 s and a level's request timeouts, well under the 2 minutes one load used to wait
EXIT_WITHIN_S = 100


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("tune_dead") / "repo"
    python_model(repo, MODEL)
    with EmbeddedServer(repo, ready_timeout=90) as served:
        yield served


def test_tune_exits_2_when_the_server_stops_answering_and_leaves_no_copy(server, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "builder", "tune", MODEL, "--repository", str(server.repository), "--url",
         server.grpc_url, "--p99-budget-ms", "500", "--seconds-per-candidate", "2", "--levels", "1,2",
         "--instances", "1,2,3", "--engine", "python", "--out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    copies = [f"{MODEL}__tune{proc.pid}_{n}" for n in range(1, 12)]
    stopped = False
    try:
        with TritonClient(server.http_url, "http", network_timeout=10) as client:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None and not client.model_ready(copies[0]):
                time.sleep(0.05)
            assert proc.poll() is None, "tune ended before a candidate copy was loaded: " + proc.communicate()[0]
        os.kill(server.pid, signal.SIGSTOP)
        stopped, since = True, time.monotonic()
        out, _ = proc.communicate(timeout=EXIT_WITHIN_S + 60)
        took = time.monotonic() - since
        assert proc.returncode == 2, out
        assert f"error: server at {server.grpc_url} unreachable since " in out, out
        assert re.search(r"tune stopped; helper process \d+ will ask it to unload the copy '\w+' if it answers "
                         r"again within 10 minutes\. Look into the server's log", out), out
        assert "restart it (triton-builder serve), then tune again" in out, out
        assert took < EXIT_WITHIN_S, f"tune took {took:.0f} s to give up:\n{out}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if stopped:
            os.kill(server.pid, signal.SIGCONT)
    with TritonClient(server.http_url, "http", network_timeout=30) as client:
        deadline = time.monotonic() + 60  # the cleanup it was asked while stopped; an unload is asynchronous
        while time.monotonic() < deadline:
            left = [name for name in copies if client.model_ready(name)]
            if not left and client.model_ready(MODEL):
                break
            time.sleep(0.2)
        assert not left, f"copies still loaded after the server came back: {left}"
        assert client.model_ready(MODEL)
