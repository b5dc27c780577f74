"""`triton-builder serve` follows its repository (issue 47): with the CLI's server running and clients sending
requests, a second `build` is answered by the new version and a `rollback` by the earlier one, each within a few
seconds, with no request failed; the version that answered is read from the responses' model_version. `rollback`
finds the running server and says which version it answers with."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from builder import api
from builder.pipeline import build
from builder.core.processes import free_ports
from builder.serving.running import servers_of
from builder.tuning.steady import SteadyLoad, Switch, summarise
from tests.conftest import ROOT
from tests.tiny_models import write_model

pytestmark = [pytest.mark.integration, pytest.mark.slow(reason="builds a model twice and serves it under load")]


class _Serve:
    """`python -m builder serve` as a user starts it; its output lines kept as they come."""

    def __init__(self, repo, *extra):
        self.http, self.grpc, metrics = free_ports("127.0.0.1", 3)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "builder", "serve", "--repository", str(repo), "--http-port", str(self.http),
             "--grpc-port", str(self.grpc), "--metrics-port", str(metrics), *extra],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            assert self.proc.poll() is None, self.output
            assert time.monotonic() < deadline, f"serve never printed {text!r}:\n{self.output}"
            time.sleep(0.1)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


def test_a_new_build_and_a_rollback_reach_a_running_serve_under_load(tmp_path, quiet):
    spec = write_model(tmp_path, "embed", variants=["onnx"])
    repo = tmp_path / "repo"
    build(spec, repo, benchmark_seconds=0, progress=quiet)
    serve = _Serve(repo)
    try:
        serve.wait_for("Stop with")
        assert "watch    a new version, a rollback or a tuned config" in serve.output
        assert [s.http_url for s in servers_of(repo)] == [f"127.0.0.1:{serve.http}"]  # what rollback finds
        ids = np.arange(5, dtype=np.int64).reshape(1, 5)
        switches = []
        with SteadyLoad(f"127.0.0.1:{serve.grpc}", "grpc", "embed", [{"ids": ids}], concurrency=4,
                        pause_s=0.005) as load:
            assert load.wait_for_version("1", timeout=10) is not None
            began = time.time()
            build(spec, repo, benchmark_seconds=0, progress=quiet)  # version 2, published while served
            ended = load.wait_for_version("2", timeout=20, since=time.time())
            assert ended is not None, f"the new build's version 2 never answered:\n{serve.output}"
            switches.append(Switch("build", began, ended, "2"))

            began = time.time()
            report = api.rollback("embed", repo)
            assert report.to_version == 1 and report.from_version == 2
            assert len(report.served) == 1 and report.served[0].startswith(
                f"the running server at http://127.0.0.1:{serve.http} (triton-builder serve, pid {serve.proc.pid}) "
                "answers embed with version 1 (switched in "), report.served
            ended = load.wait_for_version("1", timeout=10, since=time.time())
            assert ended is not None, f"the rollback to version 1 never answered:\n{serve.output}"
            assert ended - began < 10  # within a few seconds of the rollback
            switches.append(Switch("rollback", began, ended, "1"))
            time.sleep(1)
        summary = summarise(load.records, switches)
        assert summary.failed == 0 and summary.requests > 50, summary.lines()
        assert load.records[-1].version == "1"
        assert "embed changed on disk: reloaded, now answering with version 2 (was 1)" in serve.output, serve.output
        assert "embed changed on disk: reloaded, now answering with version 1 (was 2)" in serve.output, serve.output
    finally:
        code = serve.stop()
    assert code == 0, serve.output
    assert servers_of(repo) == []  # its record went with it


def test_rollback_without_a_server_says_none_was_found(tmp_path, quiet):
    spec = write_model(tmp_path, "embed", variants=["onnx"])
    repo = tmp_path / "repo"
    build(spec, repo, benchmark_seconds=0, progress=quiet)
    build(spec, repo, benchmark_seconds=0, progress=quiet)
    report = api.rollback("embed", repo)
    assert report.served == [
        f"no running `triton-builder serve` of {repo.resolve()} was found on this machine: a server started from it "
        "serves version 1. A server started otherwise (the NGC image, Kubernetes) switches by itself in poll mode; "
        "in explicit mode load 'embed' again over the model-control API with its key (Triton loads the new version "
        "before it unloads the old)"]
    assert any(line.startswith("served: no running `triton-builder serve`") for line in report.lines())


def test_serve_no_watch_leaves_the_served_version_alone(tmp_path, quiet):
    spec = write_model(tmp_path, "embed", variants=["onnx"])
    repo = tmp_path / "repo"
    build(spec, repo, benchmark_seconds=0, progress=quiet)
    serve = _Serve(repo, "--no-watch")
    try:
        serve.wait_for("Stop with")
        assert "  watch " not in serve.output
        build(spec, repo, benchmark_seconds=0, progress=quiet)
        time.sleep(3)  # three times the watch's interval
        from builder.serving.client import TritonClient
        with TritonClient(f"127.0.0.1:{serve.http}") as client:
            assert [str(v) for v in client.model_metadata("embed")["versions"]] == ["1"]
    finally:
        assert serve.stop() == 0, serve.output
    assert os.path.isdir(repo / "embed" / "2")
