"""deploy.monitor served for real: a standard onnxruntime_onnx folder behind an ensemble with the python
monitor step, on the embedded tritonserver (the model folder through its onnxruntime stand-in, the ensemble
and the python step as the stock image runs them). Clients call the model's name; the served accuracy gate
passes over HTTP and gRPC; NaN inputs and drift show up on Triton's metrics endpoint under the model's name."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest

from builder.core.errors import UserInputError
from builder.repository.config import parse_config
from builder.serving.check import check_served
from builder.serving.client import TritonClient
from builder.serving.embedded import EmbeddedServer
from builder.spec.model import load_spec
from tests.conftest import ROOT

pytestmark = [pytest.mark.slow]


def _digits(monitor: bool | None):
    spec = load_spec(ROOT / "examples" / "digits" / "spec.yaml")
    spec.deploy.monitor = monitor
    return spec


@pytest.fixture(scope="module")
def monitored_repository(tmp_path_factory):
    from builder.pipeline import build

    repo = tmp_path_factory.mktemp("monitored") / "model_repository"
    result = build(_digits(True), repo, variants=["onnx"], target="cpu", benchmark_seconds=0, progress=lambda m: None)
    assert result.published[0]["served_as"] == "digits_cnn"
    return repo


def test_a_monitored_build_publishes_a_standard_folder_behind_an_ensemble(monitored_repository):
    repo = monitored_repository
    assert sorted(p.name for p in repo.iterdir() if not p.name.startswith(".")) == ["digits_cnn", "digits_cnn__model", "digits_cnn__monitor"]
    assert parse_config((repo / "digits_cnn" / "config.pbtxt").read_text()).platform == "ensemble"
    assert parse_config((repo / "digits_cnn__model" / "config.pbtxt").read_text()).platform == "onnxruntime_onnx"
    model_files = {p.name for p in (repo / "digits_cnn__model" / "1").iterdir()}
    assert "model.onnx" in model_files and "model.py" not in model_files
    assert {"model.py", "served_model.py", "drift.py", "drift_profile.json"} <= {
        p.name for p in (repo / "digits_cnn__monitor" / "1").iterdir()}


def _series(text: str, metric: str) -> dict[str, float]:
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line.startswith(metric + "{")}


def test_the_ensemble_is_served_checked_and_monitored_under_the_models_name(monitored_repository):
    with EmbeddedServer(monitored_repository, ready_timeout=120) as server:
        assert sorted(server.models) == ["digits_cnn", "digits_cnn__model", "digits_cnn__monitor"], server.failed
        report = check_served("digits_cnn", repository=monitored_repository, url=server.http_url,
                              grpc_url=server.grpc_url, protocol="both")
        assert report.ok and set(report.metrics) == {"http", "grpc"}, report.lines()
        image = np.zeros((2, 1, 8, 8), np.float32)
        image[0, 0, 0, 0] = np.nan
        rng = np.random.default_rng(0)
        with TritonClient(server.http_url) as client:
            assert client.infer("digits_cnn", {"image": image}, ["logits"])["logits"].shape == (2, 10)
            for _ in range(70):  # past drift_publish_every (64 sampled calls)
                client.infer("digits_cnn", {"image": rng.random((4, 1, 8, 8), dtype=np.float32)}, ["logits"])
        text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    nonfinite = _series(text, "triton_builder_nonfinite_inputs_total")
    assert list(nonfinite.values()) == [1.0] and 'model="digits_cnn"' in next(iter(nonfinite)), nonfinite
    assert any('model="digits_cnn"' in key for key in _series(text, "triton_builder_drift_psi")), text[-2000:]
    assert _series(text, "triton_builder_drift_window_samples")  # the window filled from served traffic


def test_a_build_without_monitoring_is_refused_into_a_monitored_model(monitored_repository):
    from builder.pipeline import build

    with pytest.raises(UserInputError, match=r"deploy.monitor is off, but 'digits_cnn' .* is served monitored"):
        build(_digits(None), monitored_repository, variants=["onnx"], target="cpu", benchmark_seconds=0,
              progress=lambda m: None)
    assert sorted(p.name for p in (monitored_repository / "digits_cnn__model").iterdir()) == ["1", "config.pbtxt",
                                                                                             "warmup"]


def test_validate_given_the_ensemble_validates_its_model_step(monitored_repository):
    from builder.repository.validate import validate_model

    said = []
    report = validate_model(monitored_repository / "digits_cnn", progress=said.append)
    assert report.model == "digits_cnn__model" and report.ok, report.lines()
    assert said[0] == "digits_cnn is a monitored ensemble: validating its model step digits_cnn__model"
