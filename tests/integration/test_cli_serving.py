"""The serving verbs' CLI against the real embedded server: `check --json` (one JSON object for CI
pipelines); `sweep` refusing up front what would fail every request and printing why a level failed;
`serve` on a port in use."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import ROOT, edit_spec, run_cli

pytestmark = pytest.mark.integration


def test_check_json(served, built_repository):
    proc = run_cli("check", "digits_cnn", "--repository", str(built_repository), "--url", served.http_url,
                   "--grpc-url", served.grpc_url, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["model"] == "digits_cnn" and report["version"] == 1
    assert set(report["metrics"]) == {"http", "grpc"} and report["failures"] == []
    assert report["lines"][0] == f"digits_cnn version 1: OK ({report['cases']} cases per protocol)"


def test_sweep_refuses_what_would_fail_every_request_and_names_why(served, built_repository, tmp_path):
    import numpy as np

    common = ["--repository", str(built_repository), "--url", served.grpc_url, "--protocol", "grpc",
              "--out", str(tmp_path / "sweep")]
    proc = run_cli("sweep", "digits_cnn", *common, "--batch-size", "999")
    assert proc.returncode == 2 and "--batch-size 999: model 'digits_cnn' takes at most 64 row(s) per request" \
        in proc.stderr, proc.stderr
    np.savez(tmp_path / "floats.npz", input_ids=np.zeros((4, 16), np.float32), attention_mask=np.ones((4, 16), np.float32))
    proc = run_cli("sweep", "bert_tiny", *common, "--payload", str(tmp_path / "floats.npz"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "floats.npz['input_ids'] is float32, the model takes INT64 (int64): save the payload's 'input_ids' as int64" \
        in proc.stderr
    np.savez(tmp_path / "wide.npz", image=np.zeros((4, 1, 8, 16), np.float32))
    proc = run_cli("sweep", "digits_cnn", *common, "--payload", str(tmp_path / "wide.npz"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "wide.npz['image'] has shape [1, 8, 16] per row, the model takes [1, 8, 8]" in proc.stderr
    # a level whose requests all fail prints why (perf_analyzer's own text), not only a count in sweep.json:
    # ids beyond bert_tiny's vocabulary (1000) pass every check a payload can get and fail in the model
    np.savez(tmp_path / "oov.npz", input_ids=np.full((4, 16), 5000, np.int64), attention_mask=np.ones((4, 16), np.int64))
    proc = run_cli("sweep", "bert_tiny", *common, "--payload", str(tmp_path / "oov.npz"), "--levels", "1",
                   "--window", "0.2", "--seconds-per-level", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"concurrency 1: \d+ failed request\(s\): perf_analyzer exit \d+: .*out of data bounds",
                     proc.stdout), proc.stdout


def test_serve_on_a_port_in_use_refuses_before_loading_anything(served, built_repository):
    port = served.http_url.rsplit(":", 1)[1]
    proc = run_cli("serve", "--repository", str(built_repository), "--http-port", port, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--http-port {port}: 127.0.0.1:{port} is in use by another process; choose another port, or leave " \
           "--http-port out" in proc.stderr


def test_run_stopped_by_sigterm_stops_its_server(digits_copy, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from builder.core.processes import port_open

    edit_spec(digits_copy, variants=["onnx"])
    proc = subprocess.Popen([sys.executable, "-m", "builder", "run", str(digits_copy / "spec.yaml"), "--keep-serving",
                             "--load-seconds", "1", "--repository", str(tmp_path / "runs" / "model_repository")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = []
    try:
        for line in proc.stdout:  # until it serves
            lines.append(line)
            if "serving until Ctrl-C" in line:
                break
        address = next(re.search(r"HTTP 127\.0\.0\.1:(\d+)", l) for l in lines if "HTTP 127.0.0.1:" in l)
        port = int(address.group(1))
        assert port_open("127.0.0.1", port)
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    # as Ctrl-C, the stop `run --keep-serving` waits for: the job ends normally, its server with it
    assert proc.returncode == 0 and "server stopped" in rest, "".join(lines) + rest
    deadline = time.monotonic() + 10
    while port_open("127.0.0.1", port):  # the server went with the job, not left serving alone
        assert time.monotonic() < deadline, f"tritonserver still answers on {port} after run was stopped"
        time.sleep(0.2)
