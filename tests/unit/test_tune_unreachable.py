"""tune against a server that stops answering (builder/serving/client.py ``Liveness``, builder/tuning/search.py):
real clients against a socket that accepts connections and never answers (what a hung or SIGSTOPped
tritonserver looks like), a closed port (a dead one) and a tiny HTTP server that answers only its
liveness endpoint. The search with a real tritonserver stopped mid-way: tests/integration/test_tune_dead_server.py."""

from __future__ import annotations

import http.server
import os
import re
import socket
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from builder.core.errors import ServerError
from builder.serving import client as client_module
from builder.serving.client import Liveness, ServerGone
from builder.tuning.search import Candidate, ModelControl, Search

BASE = {"name": "m", "backend": "python", "max_batch_size": 8, "dynamic_batching": {},
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
FILES = {"file:1/model.py": b"# a model"}
SLOW_CALL_S = 120.0  # a load's own timeout: without the watch, every call below would take this long


@pytest.fixture
def quick_liveness(monkeypatch):
    """Liveness that gives up after 1 s of silence (15 s in use), so these tests stay short."""
    monkeypatch.setattr(client_module, "LIVENESS_TIMEOUT_S", 0.3)
    monkeypatch.setattr(client_module, "SILENT_LIMIT_S", 1.0)
    monkeypatch.setattr(client_module, "WATCH_PERIOD_S", 0.1)


@pytest.fixture
def silent():
    """A socket that accepts connections and never answers a byte: ``.url``, ``.close()``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield SimpleNamespace(url=f"127.0.0.1:{listener.getsockname()[1]}", close=listener.close)
    listener.close()


def _helper(message: str) -> int:
    pid = re.search(r"helper process (\d+) will ask it", message)
    assert pid, message
    return int(pid.group(1))


def _ended(pid: int, within: float = 60.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return True
        except ChildProcessError:  # reaped already
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def dead_url():
    """An address nothing listens on: connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.fixture
def live_url():
    """An HTTP server that answers Triton's liveness endpoint (and nothing else)."""
    class Live(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/v2/health/live" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Live)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow(reason="waits out liveness/watch timeouts against a fake server (1.5-3.5 s)")
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_load_on_a_server_that_never_answers_stops_at_the_watch_not_its_timeout(quick_liveness, silent, protocol):
    control = ModelControl(silent.url, protocol, "m", timeout=SLOW_CALL_S, files=FILES)
    started = time.monotonic()
    try:
        with pytest.raises(ServerGone, match=rf"server at {silent.url} unreachable since \d\d:\d\d:\d\d "
                                             r"\(\d+ s without an answer; last error: "):
            control.serve(Candidate("3 instances", True, 0, 3, 8).config(BASE))
        assert time.monotonic() - started < SLOW_CALL_S / 2
        # the copy whose load was in flight: its unload is left to a process that waits for the server
        said = control.abandon()
        assert f"will ask it to unload the copy 'm__tune{os.getpid()}_1' if it answers again within 10 minutes" in said
        assert control.copy_name is None and control.abandon() == ""
        silent.close()  # the server is gone for good: the helper ends at once
        assert _ended(_helper(said))
    finally:
        control.close()


def _search(url, protocol, files=None):
    return Search(url, protocol, "m", BASE, [{"x": np.zeros((1, 4), np.float32)}], ["y"],
                  levels=[1], budget=50.0, window_s=0.1, per_level_s=0.4, max_candidates=12, say=lambda m: None,
                  files=files)


@pytest.mark.slow(reason="waits out liveness/watch timeouts against a fake server (1.5-3.5 s)")
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_search_stops_on_a_server_gone_and_the_restore_only_asks(quick_liveness, silent, protocol, tmp_path):
    search = _search(silent.url, protocol, files=None)  # in place: the model itself is unloaded for a candidate
    kept, written = tmp_path / "m" / "1" / "old" / "__pycache__", tmp_path / "m" / "1" / "__pycache__"
    kept.mkdir(parents=True)
    search.server.bytecode_before = (tmp_path, {kept})
    try:
        with pytest.raises(ServerGone, match=f"server at {silent.url} unreachable"):
            search.measure(Candidate("3 instances", True, 0, 3, 8))
        assert search.order[0].error == ""  # not recorded as the candidate's failure
        started = time.monotonic()
        error = search.restore()
        assert isinstance(error, ServerGone) and time.monotonic() - started < SLOW_CALL_S / 2
        assert "will ask it to load 'm' from its file if it answers again within 10 minutes" in search.cleanup
        written.mkdir()  # as the python stub does when the reload from the file runs
        silent.close()
        assert _ended(_helper(search.cleanup))
        assert not written.exists() and kept.is_dir()  # the published version as it was before tune
    finally:
        search.server.close()


@pytest.mark.slow(reason="waits out liveness/watch timeouts against a fake server (1.5-3.5 s)")
def test_requests_that_all_fail_on_a_dead_server_stop_the_search(quick_liveness, dead_url):
    search = _search(dead_url, "grpc")
    search.serving_file(Candidate("default", True, 0, 1, 8))  # measured as served: no load first
    try:
        with pytest.raises(ServerGone, match=f"server at {dead_url} unreachable since .*last error: .*"):
            search.measure_once(1)
    finally:
        search.server.close()


@pytest.mark.slow(reason="waits out liveness/watch timeouts against a fake server (1.5-3.5 s)")
def test_a_slow_call_on_a_server_that_answers_its_liveness_is_waited_for(quick_liveness, live_url):
    liveness = Liveness(live_url, "http")
    try:
        assert liveness.watch(lambda: time.sleep(3 * client_module.SILENT_LIMIT_S) or "loaded") == "loaded"
        liveness.require()  # answers: a failure after it was the candidate's own
        assert not liveness.gone()
        with pytest.raises(ValueError, match="the call's own error"):
            liveness.watch(_raise, ValueError("the call's own error"))
    finally:
        liveness.close()


def _raise(exc):
    raise exc


def test_a_server_gone_is_a_server_error_exit_2(quick_liveness, dead_url):
    liveness = Liveness(dead_url, "http")
    with pytest.raises(ServerError, match=f"server at {dead_url} unreachable since") as caught:
        liveness.require()
    assert caught.value.exit_code == 2 and caught.value.unreachable
    liveness.close()
