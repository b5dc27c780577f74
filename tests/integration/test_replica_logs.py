"""Where local replicas leave their logs: removed after a clean stop, kept and named when something
failed; a repository path with a space works for them too. Real tritonserver and nginx processes on
a hand-written one-model repository (as test_embedded_server.py writes them)."""

from __future__ import annotations

import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from builder.scaleout.balancer import find_nginx, render_config
from tests.conftest import ROOT
from tests.integration.python_models import ADD_ONE_PY
from tests.integration.python_models import python_model as _python_model
from tests.integration.test_embedded_server import _read_until

pytestmark = pytest.mark.integration


@pytest.fixture
def nginx():
    try:
        return find_nginx()
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"nginx not installed: {err}")


@pytest.fixture
def spaced_repo(tmp_path) -> Path:
    repo = tmp_path / "sp ace" / "repo x"
    _python_model(repo, "add_one", ADD_ONE_PY)
    return repo


def test_clean_stop_removes_the_replica_logs_a_crash_keeps_them(nginx, spaced_repo):
    from builder.scaleout.replicas import ReplicaSet

    with ReplicaSet(spaced_repo, replicas=1, prometheus=False) as group:
        assert group.models == ["add_one"]
        logs = group.log_dir
        assert (logs / "replica-0.log").is_file()
    assert group.kept_logs is None and not logs.exists()

    group = ReplicaSet(spaced_repo, replicas=1, prometheus=False).start()
    try:
        group.kill(0)
    finally:
        kept = group.stop()
    assert kept == group.log_dir and (kept / "replica-0.log").is_file()
    shutil.rmtree(kept)


def test_replicas_cli_says_where_its_logs_went(nginx, spaced_repo):
    proc = subprocess.Popen([sys.executable, "-m", "builder", "replicas", "--repository", str(spaced_repo),
                             "--replicas", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        out = _read_until(lines, "Stop with Ctrl-C", timeout=120)
        log = Path(re.search(r"log (/\S+replica-0\.log)", out).group(1))
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert f"nothing failed, so the logs ({log.parent}) were removed" in _read_until(lines, "were removed", 10)
        assert not log.parent.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_nginx_config_quotes_a_temp_dir_with_a_space(nginx, tmp_path):
    workdir = tmp_path / "ng inx"
    (workdir / "temp").mkdir(parents=True)
    config = workdir / "nginx.conf"
    config.write_text(render_config(workdir, ["127.0.0.1:1"], ["127.0.0.1:2"], "127.0.0.1", 1, 2))
    test = subprocess.run([nginx, "-t", "-q", "-e", str(workdir / "error.log"), "-p", str(workdir), "-c", str(config)],
                          capture_output=True, text=True, timeout=30)
    assert test.returncode == 0, test.stderr
