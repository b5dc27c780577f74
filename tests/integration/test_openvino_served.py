"""OpenVINO variants on the real embedded tritonserver: digits built with onnx, openvino and
openvino_int8 (every eligible variant published), served by the python backend running the IR, and
the served accuracy gate (check) passing over HTTP for both OpenVINO models."""

from __future__ import annotations

import pytest

from builder.pipeline import build
from builder.repository.config import parse_config
from builder.serving.check import check_served
from builder.serving.embedded import EmbeddedServer
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def openvino_repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("openvino_repo") / "model_repository"
    # no measuring: the preference order publishes onnx as digits_cnn, the others as digits_cnn__<variant>
    build(EXAMPLES / "digits" / "spec.yaml", repo, variants=["onnx", "openvino", "openvino_int8"], target="python",
          benchmark_seconds=0, publish_variants=True, progress=lambda message: None)
    return repo


def test_openvino_variants_pass_the_served_gate_on_the_embedded_server(openvino_repository):
    repo = openvino_repository
    for model in ("digits_cnn__openvino", "digits_cnn__openvino_int8"):
        version = repo / model / "1"
        assert sorted(p.name for p in version.glob("model.*")) == ["model.bin", "model.py", "model.xml"], model
        config = parse_config((repo / model / "config.pbtxt").read_text())
        assert config.backend == "python"
        assert config.parameters["runtime"].string_value == "openvino"
        assert config.parameters["model_file"].string_value == "model.xml"
    server = EmbeddedServer(repo, ready_timeout=90)
    server.start()
    try:
        for model in ("digits_cnn__openvino", "digits_cnn__openvino_int8"):
            report = check_served(model, repository=repo, url=server.http_url, protocol="http")
            assert report.ok, report.lines()
            assert set(report.metrics) == {"http"}
            limit = 1e-5 if model.endswith("__openvino") else 0.1  # FP32 vs INT8 tolerance of the build
            assert all(m["rel_l2"] <= limit for m in report.metrics["http"].values()), report.lines()
    finally:
        server.stop()
    assert not server.is_running()
