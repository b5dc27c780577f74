"""What an embedded tritonserver leaves behind and what it answers: a SIGKILLed parent (serve, run,
replicas started from pool threads), two servers racing for one port, a model that fails to load, and
the environment the server and its python stubs run in. Real tritonserver processes, no mocks.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from tritonclient.http import InferInput

from builder.core.errors import ServerError
from builder.core.processes import free_ports, http_get
from builder.serving.embedded import EmbeddedServer
from builder.serving.startup import answers_as
from tests.integration.python_models import python_model

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("lifetime_repo")
    python_model(repo, "add_one")
    return repo


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


# the child starts a server (from the main thread, or from a pool thread that has ended by the time
# the server is up, as replicas do), prints its pid and waits to be killed
_CHILD = textwrap.dedent(
    """
    import sys, time
    from concurrent.futures import ThreadPoolExecutor
    from builder.serving.embedded import EmbeddedServer

    server = EmbeddedServer(sys.argv[1])
    if sys.argv[2] == "pool":
        with ThreadPoolExecutor(1) as pool:
            pool.submit(server.start).result()
    else:
        server.start()
    print(server.pid, server.log_path.parent, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("thread", ["main", "pool"])
def test_sigkilled_parent_leaves_no_server(repo, thread):
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(repo), thread], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        line = child.stdout.readline()
        assert line, "the child printed nothing: its server did not start"
        pid = int(line.split()[0])
        pids = [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
        assert len(pids) >= 2  # tritonserver and the add_one stub
        time.sleep(1.0)
        assert _alive(pid), "the server died while its parent lived (killed with the pool thread?)"
        child.kill()
        child.wait(10)
        assert _wait_gone(pids, 15) == [], "tritonserver or a stub outlived the SIGKILLed parent"
        workdir = Path(line.split()[1])  # nobody could clean it up: the next server's start removes it
        with EmbeddedServer(repo):       # (or another one's, started meanwhile)
            assert not workdir.exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# Another server on our port: never taken for ours


class _LostTheRace(EmbeddedServer):
    """Real server whose up-front port check saw its ports free: another server took them between
    that check and the bind (two `serve` started together on the default ports)."""

    def _fixed_ports(self):
        if not getattr(self, "_checked", False):
            self._checked = True
            return []
        return super()._fixed_ports()


def test_a_server_that_loses_its_port_is_not_ready_on_the_winners(repo):
    with EmbeddedServer(repo) as winner:
        loser = _LostTheRace(repo, http_port=winner.http_port, grpc_port=winner.grpc_port,
                             metrics_port=winner.metrics_port, ready_timeout=60)
        with pytest.raises(ServerError, match=r"tritonserver could not bind 127\.0\.0\.1:(\d+): another process "
                                              r"listens there \(another server started at the same time\?\); pass "
                                              r"a free port with --(http|grpc|metrics)-port, or stop the other "
                                              r"process") as info:
            loser.start()
        assert info.value.exit_code == 2
        port, option = re.search(r":(\d+): .* with --(\w+)-port", str(info.value)).groups()
        assert int(port) == {"http": winner.http_port, "grpc": winner.grpc_port, "metrics": winner.metrics_port}[option]
        assert not loser.is_running()
        assert winner.is_ready()  # the winner is untouched
    assert answers_as(winner.http_url, winner.server_id) is False  # stopped: nothing answers as it
    shutil.rmtree(loser.log_path.parent, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# A model that fails to load: the others are served


BOOM = "boom-in-initialize-5309"
BAD_PY = f"class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('{BOOM}')\n"


@pytest.fixture(scope="module")
def mixed_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("mixed_repo")
    python_model(repo, "good")
    python_model(repo, "good__variant", BAD_PY)
    return repo


def test_keep_going_serves_the_models_that_load(mixed_repo):
    with EmbeddedServer(mixed_repo, keep_going=True, ready_timeout=60) as server:
        assert server.models == ["good"]
        assert list(server.failed) == ["good__variant"] and BOOM in server.failed["good__variant"]
        assert server.is_ready()
        with server.triton() as client:
            assert client.model_ready("good")


def test_keep_going_still_fails_when_nothing_loads(tmp_path):
    python_model(tmp_path, "bad_a", BAD_PY)
    python_model(tmp_path, "bad_b", BAD_PY)
    server = EmbeddedServer(tmp_path, keep_going=True, ready_timeout=60)
    with pytest.raises(ServerError, match=rf"could not load any model of the repository: 'bad_a', 'bad_b':\n"
                                          rf"- bad_a: UNAVAILABLE: .*{BOOM}"):
        server.start()
    assert not server.is_running()
    shutil.rmtree(server.log_path.parent, ignore_errors=True)


def test_when_nothing_loads_the_models_left_out_are_named_too(tmp_path):
    python_model(tmp_path, "bad_a", BAD_PY)
    (tmp_path / "no_config" / "1").mkdir(parents=True)  # left out before the start: every cause is listed
    server = EmbeddedServer(tmp_path, keep_going=True, ready_timeout=60)
    with pytest.raises(ServerError, match=rf"(?s)could not load model 'bad_a':\n- bad_a: UNAVAILABLE: .*{BOOM}.*\n"
                                          r"- no_config: left out, not started: no config.pbtxt in "):
        server.start()
    shutil.rmtree(server.log_path.parent, ignore_errors=True)


def test_load_tools_on_a_model_that_failed_quote_tritons_reason(mixed_repo):
    from builder.tuning.payload import fetch_model

    with EmbeddedServer(mixed_repo, keep_going=True, ready_timeout=60) as server:
        with pytest.raises(ServerError, match=rf"model 'good__variant' is not ready on Triton at .* \(state "
                                              rf"UNAVAILABLE: .*{BOOM}.*\); fix it and restart the server"):
            fetch_model(server.http_url, "http", "good__variant")
        with pytest.raises(ServerError, match=r"model 'nosuch' is not ready .*; load it first"):
            fetch_model(server.http_url, "http", "nosuch")


def test_asked_for_model_that_fails_is_still_fatal(mixed_repo):
    server = EmbeddedServer(mixed_repo, load_models=["good", "good__variant"], ready_timeout=60)
    with pytest.raises(ServerError, match=rf"could not load model 'good__variant':\n- good__variant: .*{BOOM}"):
        server.start()
    assert not server.is_running()
    shutil.rmtree(server.log_path.parent, ignore_errors=True)


def test_serve_names_the_failed_model_and_serves_the_rest(mixed_repo):
    http, grpc, metrics = free_ports("127.0.0.1", 3)
    proc = subprocess.Popen([sys.executable, "-m", "builder", "serve", "--repository", str(mixed_repo),
                             "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "Stop with" in line:
                break
        out = "".join(seen)
        assert re.search(r"serving\s+good\n", out), out
        assert re.search(rf"FAILED\s+good__variant \(not served; fix it and restart to serve it\): "
                         rf"UNAVAILABLE: .*{BOOM}", out, re.S), out
        status, _ = http_get(f"http://127.0.0.1:{http}/v2/models/good/ready")
        assert status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# ---------------------------------------------------------------------------------------------
# The environment of the server and its stubs


def test_serving_writes_nothing_into_the_version_and_sends_no_telemetry(tmp_path):
    version = python_model(tmp_path, "add_one")
    with EmbeddedServer(tmp_path) as server:
        stub = psutil.Process(server.pid).children(recursive=True)[0]
        for proc in (psutil.Process(server.pid), stub):
            env = proc.environ()
            assert env.get("PYTHONDONTWRITEBYTECODE") == "1" and env.get("ORT_DISABLE_TELEMETRY") == "1", proc
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        with server.triton() as client:
            inp = InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(x)
            np.testing.assert_allclose(client.raw.infer("add_one", [inp]).as_numpy("OUTPUT0"), x + 1)
        assert sorted(p.name for p in version.iterdir()) == ["model.py"]  # the stub's __pycache__/ is gone
        server.unload_model("add_one")
        server.load_model("add_one")  # a reload imports model.py again
        assert sorted(p.name for p in version.iterdir()) == ["model.py"]
    assert sorted(p.name for p in version.iterdir()) == ["model.py"]
