"""A repository built with the previous release's layout (every version a python-backend model.py wrapper, the
old default) keeps serving on the embedded server; `serve` names the one command that republishes it as a
standard folder, and that build does: the new version is what stock Triton loads, and it is served and checked."""

from __future__ import annotations

import pytest

from builder.repository.config import parse_config
from builder.serving.check import check_served
from builder.serving.embedded import EmbeddedServer
from builder.serving.serve import python_backend_notes
from tests.conftest import ROOT

pytestmark = [pytest.mark.slow]
SPEC = ROOT / "examples" / "digits" / "spec.yaml"


def test_a_python_backend_repository_serves_and_one_build_republishes_it_standard(tmp_path):
    from builder.pipeline import build

    repo = tmp_path / "model_repository"
    build(SPEC, repo, variants=["onnx"], target="python", benchmark_seconds=0, progress=lambda m: None)
    assert "model.py" in {p.name for p in (repo / "digits_cnn" / "1").iterdir()}
    with EmbeddedServer(repo, ready_timeout=120) as server:
        assert check_served("digits_cnn", repository=repo, url=server.http_url, grpc_url=server.grpc_url).ok
    note, = python_backend_notes(repo, ["digits_cnn"])
    assert note == (f"digits_cnn: a python-backend model (model.py wrapping the model file; the layout of earlier "
                    f"releases, or --target python): it serves here, but the stock NGC image cannot load it "
                    f"(docker/triton/python-backend.compose.yml builds one that can); `triton-builder build {SPEC} "
                    f"--repository {repo}` republishes it as a standard folder that both serve")

    said = []
    build(SPEC, repo, variants=["onnx"], benchmark_seconds=0, progress=said.append)  # the command the note names
    assert {p.name for p in (repo / "digits_cnn" / "2").iterdir()} >= {"model.onnx", "metadata.yaml"}
    assert "model.py" not in {p.name for p in (repo / "digits_cnn" / "2").iterdir()}
    assert parse_config((repo / "digits_cnn" / "config.pbtxt").read_text()).platform == "onnxruntime_onnx"
    assert python_backend_notes(repo, ["digits_cnn"]) == []
    with EmbeddedServer(repo, ready_timeout=120) as server:
        report = check_served("digits_cnn", repository=repo, url=server.http_url, grpc_url=server.grpc_url)
        assert report.ok and report.version == 2 and set(report.metrics) == {"http", "grpc"}, report.lines()
