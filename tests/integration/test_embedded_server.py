"""The embedded Triton server (builder.serving.embedded) against the real tritonserver binary.

No mocks: every test starts real processes. Model repositories are written by hand in tmp dirs.
Every wait is bounded; the whole file takes about 40 s on 2 CPU cores.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest

from builder.core.errors import ServerDiedError, ServerError, UserInputError
from builder.serving.backends import unsupported_models
from builder.serving.embedded import EmbeddedServer
from builder.serving.install import find_tritonserver
from tests.integration.python_models import ADD_ONE_PY, python_model

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BOOM = "boom-in-initialize-4711"

BAD_PY = textwrap.dedent(
    f"""
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            raise RuntimeError("{BOOM}")

        def execute(self, requests):
            return []
    """
)


def _config(name: str, kind: str) -> str:
    return textwrap.dedent(
        f"""
        name: "{name}"
        {kind}
        max_batch_size: 8
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        """
    )


def _plan_model(repo: Path, name: str) -> None:
    """A TensorRT plan folder: the one standard backend the embedded server has no stand-in for."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(_config(name, 'platform: "tensorrt_plan"'))


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """add_one, add_one_b (same code), broken (raises in initialize), plan_model (no backend here)."""
    repo = tmp_path_factory.mktemp("repo")
    python_model(repo, "add_one", ADD_ONE_PY)
    python_model(repo, "add_one_b", ADD_ONE_PY)
    python_model(repo, "broken", BAD_PY)
    _plan_model(repo, "plan_model")
    return repo


@pytest.fixture(scope="module")
def small_repo(tmp_path_factory) -> Path:
    """Every supported model in it loads: add_one and plan_model (left out)."""
    repo = tmp_path_factory.mktemp("small_repo")
    python_model(repo, "add_one", ADD_ONE_PY)
    _plan_model(repo, "plan_model")
    return repo


@pytest.fixture(scope="module")
def server(repo):
    with EmbeddedServer(repo, load_models=["add_one"], ready_timeout=60) as s:
        yield s


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _tree(pid: int) -> list[int]:
    proc = psutil.Process(pid)
    return [pid] + [c.pid for c in proc.children(recursive=True)]


def _infer_http(url: str, model: str, x: np.ndarray) -> np.ndarray:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url, connection_timeout=5, network_timeout=30)
    try:
        inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp]).as_numpy("OUTPUT0")
    finally:
        client.close()


def _infer_grpc(url: str, model: str, x: np.ndarray) -> np.ndarray:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp], client_timeout=30).as_numpy("OUTPUT0")
    finally:
        client.close()


X = np.arange(8, dtype=np.float32).reshape(2, 4)


# ---------------------------------------------------------------------------------------------
# No server


def test_find_tritonserver():
    install = find_tritonserver()
    assert install.binary.is_file() and os.access(install.binary, os.X_OK)
    assert install.stub.parent.name == f"{sys.version_info.major}.{sys.version_info.minor}"


def test_unsupported_models_reasons(tmp_path):
    python_model(tmp_path, "py", ADD_ONE_PY)
    _plan_model(tmp_path, "plan")
    (tmp_path / "tf").mkdir()
    (tmp_path / "tf" / "config.pbtxt").write_text('name: "tf"\nplatform: "tensorflow_savedmodel"\n')
    (tmp_path / "dali").mkdir()
    (tmp_path / "dali" / "config.pbtxt").write_text('backend: "dali"\n')
    for name, engine in (("onnx", 'platform: "onnxruntime_onnx"'), ("torch", 'backend: "pytorch"'),
                         ("ov", 'backend: "openvino"')):  # standard folders: served through the stand-ins
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\n{engine}\n')
    (tmp_path / "noconfig" / "1").mkdir(parents=True)
    (tmp_path / "garbled").mkdir()
    (tmp_path / "garbled" / "config.pbtxt").write_text('name: "garbled"\nbackend: "python"\nnot_a_field: 3\n')
    (tmp_path / "renamed").mkdir()
    (tmp_path / "renamed" / "config.pbtxt").write_text('name: "other"\nbackend: "python"\n')
    for ens, step in (("ens_ok", "py"), ("ens_bad", "plan")):
        (tmp_path / ens).mkdir()
        (tmp_path / ens / "config.pbtxt").write_text(
            f'name: "{ens}"\nplatform: "ensemble"\nensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1 }} ] }}\n'
        )
    (tmp_path / "README.md").write_text("not a model")

    reasons = unsupported_models(tmp_path)
    assert set(reasons) == {"plan", "tf", "dali", "noconfig", "garbled", "renamed", "ens_bad"}
    assert "tensorrt_plan" in reasons["plan"] and "'tensorrt' backend" in reasons["plan"]
    assert "'tensorflow'" in reasons["tf"]
    assert "dali" in reasons["dali"]
    assert "no config.pbtxt" in reasons["noconfig"]
    assert "not_a_field" in reasons["garbled"]  # quotes the parse error
    assert "other" in reasons["renamed"]
    assert "'plan'" in reasons["ens_bad"]


def test_bad_arguments(repo, tmp_path):
    with pytest.raises(UserInputError, match="not_there"):
        EmbeddedServer(repo, load_models=["not_there"]).start()
    with pytest.raises(UserInputError, match="tensorrt"):
        EmbeddedServer(repo, load_models=["plan_model"]).start()
    with pytest.raises(UserInputError, match="not a directory"):
        EmbeddedServer(tmp_path / "missing").start()
    with pytest.raises(UserInputError, match="model_control"):
        EmbeddedServer(repo, model_control="sometimes")


# ---------------------------------------------------------------------------------------------
# Shared server (explicit mode, add_one loaded at start)


def test_serves_http_and_grpc(server):
    assert server.is_running() and server.is_ready()
    assert re.fullmatch(r"127\.0\.0\.1:\d+", server.http_url)
    assert re.fullmatch(r"127\.0\.0\.1:\d+", server.grpc_url)
    np.testing.assert_allclose(_infer_http(server.http_url, "add_one", X), X + 1)
    np.testing.assert_allclose(_infer_grpc(server.grpc_url, "add_one", X), X + 1)
    with urllib.request.urlopen(server.metrics_url, timeout=5) as response:
        assert b"nv_inference_request_success" in response.read()
    assert server.log_path.is_file()


def test_unsupported_model_left_out(server):
    assert set(server.left_out) == {"plan_model"}
    assert "tensorrt" in server.left_out["plan_model"]
    assert server.models == ["add_one"]
    assert server.model_ready("add_one")
    with pytest.raises(ServerError, match="tensorrt"):
        server.load_model("plan_model")


def test_load_and_unload(server):
    assert not server.model_ready("add_one_b")
    server.load_model("add_one_b")
    assert server.model_ready("add_one_b")
    np.testing.assert_allclose(_infer_http(server.http_url, "add_one_b", X), X + 1)
    states = {e["name"]: e.get("state") for e in server.repository_index()}
    assert states["add_one_b"] == "READY" and states["add_one"] == "READY"
    server.unload_model("add_one_b")
    assert not server.model_ready("add_one_b")
    assert server.model_ready("add_one")


def test_load_failing_model_quotes_reason(server):
    with pytest.raises(ServerError, match=BOOM) as info:
        server.load_model("broken")
    assert "broken" in str(info.value)
    server.check_alive()  # a failed load does not kill the server
    np.testing.assert_allclose(_infer_http(server.http_url, "add_one", X), X + 1)


# ---------------------------------------------------------------------------------------------
# Own servers


def test_start_with_failing_model_raises_and_cleans_up(repo):
    s = EmbeddedServer(repo, ready_timeout=60)  # default: every supported model, 'broken' included
    with pytest.raises(ServerError, match=BOOM):
        s.start()
    assert s.pid is not None and not s.is_running()
    assert not _alive(s.pid)
    s.stop()  # still fine
    assert BOOM in s.log_path.read_text()  # the log the error names is kept
    shutil.rmtree(s.log_path.parent)


def test_none_mode_serves_what_it_can(small_repo):
    with EmbeddedServer(small_repo, model_control="none") as s:
        assert "plan_model" in s.left_out
        assert s.is_ready()
        np.testing.assert_allclose(_infer_http(s.http_url, "add_one", X), X + 1)


def test_stop_leaves_no_process_and_is_idempotent(small_repo):
    s = EmbeddedServer(small_repo).start()
    pids = _tree(s.pid)
    assert len(pids) >= 2  # the server and the add_one stub
    workdir = s.log_path.parent
    assert workdir.name.startswith("triton-embedded-") and (workdir / "backends").is_dir()
    t0 = time.monotonic()
    code = s.stop()
    assert time.monotonic() - t0 < 16
    assert code == 0
    assert _wait_gone(pids, 5) == []
    assert not workdir.exists()  # a clean stop leaves no temp folder behind
    assert s.stop() == code
    assert not s.is_running()
    with pytest.raises(ServerDiedError):
        s.check_alive()


def test_killed_server_is_reported(small_repo):
    s = EmbeddedServer(small_repo).start()
    try:
        pids = _tree(s.pid)
        s.check_alive()
        os.kill(s.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while s.is_running() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(ServerDiedError, match=r"exited with code -9") as info:
            s.check_alive()
        assert "last log lines" in str(info.value)
        with pytest.raises(ServerDiedError):
            s.model_ready("add_one")
    finally:
        s.stop()
    assert _wait_gone(pids, 5) == []
    assert "# triton-builder:" in s.log_path.read_text()  # it died on its own: its log is kept for the error's reader
    shutil.rmtree(s.log_path.parent)


def test_a_log_path_given_is_kept_and_appended(small_repo, tmp_path):
    log = tmp_path / "logs" / "server.log"
    for _ in range(2):
        with EmbeddedServer(small_repo, log_path=log) as s:
            workdir = s._cwd()
            assert s.log_path == log and workdir.is_dir()
        assert not workdir.exists()
    assert log.read_text().count("# triton-builder:") == 2


def test_fixed_port_in_use(small_repo):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        s = EmbeddedServer(small_repo, http_port=port)
        # refused before tritonserver starts (it used to load every model, then fail on the bind)
        with pytest.raises(UserInputError, match=rf"--http-port {port}: 127\.0\.0\.1:{port} is in use by another "
                                                 r"process; choose another port, or leave --http-port out"):
            s.start()
    assert s.pid is None and not s.is_running()


class _FirstHttpPortTaken(EmbeddedServer):
    """Real server; only the first port choice is forced onto a port another socket holds."""

    busy_port: int = 0

    def _choose_ports(self):
        ports = super()._choose_ports()
        if not getattr(self, "_tried", False):
            self._tried = True
            return (self.busy_port,) + ports[1:]
        return ports


def test_chosen_port_taken_is_retried(small_repo):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        s = _FirstHttpPortTaken(small_repo)
        s.busy_port = busy.getsockname()[1]
        with s:
            assert s.http_port != s.busy_port
            np.testing.assert_allclose(_infer_http(s.http_url, "add_one", X), X + 1)
            assert s.log_path.read_text().count("# triton-builder:") == 2


# ---------------------------------------------------------------------------------------------
# serve_forever, as `triton-builder serve` runs it


def _serve_in_subprocess(repo: Path) -> tuple[subprocess.Popen, "queue.Queue[str]"]:
    code = f"import sys; from builder.serving.serve import serve_forever; sys.exit(serve_forever({str(repo)!r}))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put("")  # EOF

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def _read_until(lines: "queue.Queue[str]", marker: str, timeout: float) -> str:
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line == "":
            break
        seen.append(line)
        if marker in line:
            return "".join(seen)
    raise AssertionError(f"no {marker!r} within {timeout} s; output so far:\n{''.join(seen)}")


def _drain(lines: "queue.Queue[str]") -> str:
    out = []
    while True:
        try:
            line = lines.get_nowait()
        except queue.Empty:
            return "".join(out)
        out.append(line)


def test_serve_forever_stops_on_sigterm(small_repo):
    proc, lines = _serve_in_subprocess(small_repo)
    try:
        out = _read_until(lines, "Stop with", timeout=60)
        assert "plan_model" in out and "tensorrt" in out
        pid = int(re.search(r"pid (\d+)", out).group(1))
        http = re.search(r"HTTP\s+(\S+)", out).group(1)
        assert re.search(r"gRPC\s+127\.0\.0\.1:\d+", out)
        assert re.search(r"metrics\s+http://127\.0\.0\.1:\d+/metrics", out)
        log = Path(re.search(r"log\s+(/\S+tritonserver\.log)\s+\(removed at a clean stop", out).group(1))
        with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=5) as response:
            assert response.status == 200
        pids = _tree(pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert _wait_gone(pids, 5) == []
        assert "stopped (exit code 0); nothing failed, so its log was removed" in _read_until(lines, "stopped", 10)
        assert not log.parent.exists()  # a clean stop leaves no temp folder behind
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_serve_forever_reports_server_death(small_repo):
    proc, lines = _serve_in_subprocess(small_repo)
    try:
        out = _read_until(lines, "Stop with", timeout=60)
        pid = int(re.search(r"pid (\d+)", out).group(1))
        pids = _tree(pid)
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == ServerDiedError.exit_code
        time.sleep(0.2)
        rest = _drain(lines)
        assert "exited with code -9" in rest and "on its own" in rest
        assert _wait_gone(pids, 5) == []
        log = Path(re.search(r"full log: (\S+)", rest).group(1))
        assert log.is_file()  # the log the message names is kept
        shutil.rmtree(log.parent)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
