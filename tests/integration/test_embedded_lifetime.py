"""What an embedded tritonserver leaves behind and what it answers: a SIGKILLed parent (serve, run,
replicas started from pool threads), two servers racing for one port, a model that fails to load, and
the environment the server and its python stubs run in. Real tritonserver processes, no mocks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

ADD_ONE_PY = textwrap.dedent(
    """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                out = pb_utils.Tensor("OUTPUT0", (x + 1).astype(np.float32))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            return responses
    """
)


def python_model(repo: Path, name: str, code: str = ADD_ONE_PY) -> Path:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        instance_group [ {{ kind: KIND_CPU count: 1 }} ]
        """))
    (version / "model.py").write_text(code)
    return version


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
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
