"""Your own preprocess/postprocess steps served for real: tests/integration/user_steps/ (a tiny classifier,
clients send "1,2,3,4" texts, get a class name back) is built, published as an ensemble (your parse step ->
the standard onnxruntime_onnx folder -> your naming step) and served by the embedded tritonserver; `check`
replays the raw inputs over HTTP and gRPC against the steps run in-process at build time; an input your step
refuses gets a 400 naming its error, and the server keeps serving."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from builder.pipeline import build
from builder.serving.check import check_served
from builder.serving.client import TritonClient
from builder.serving.embedded import EmbeddedServer
from tests.conftest import ROOT

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def steps_served(tmp_path_factory):
    repository = tmp_path_factory.mktemp("steps") / "model_repository"
    build(ROOT / "tests" / "integration" / "user_steps" / "spec.yaml", repository, variants=["onnx"],
          benchmark_seconds=0, progress=lambda m: None)
    with EmbeddedServer(repository, ready_timeout=120) as server:
        yield repository, server


def test_the_served_ensemble_answers_the_raw_inputs_as_the_steps_did_at_build_time(steps_served):
    repository, server = steps_served
    assert sorted(p.name for p in repository.iterdir() if not p.name.startswith(".")) == [
        "csv_classifier", "csv_classifier__model", "csv_classifier__postprocess", "csv_classifier__preprocess"]
    report = check_served("csv_classifier", repository=repository, url=f"127.0.0.1:{server.http_port}",
                          grpc_url=f"127.0.0.1:{server.grpc_port}")
    assert report.ok, report.lines()
    for protocol in ("http", "grpc"):
        assert report.metrics[protocol]["pipeline"]["label_agreement"] == 1.0
        assert report.metrics[protocol]["pipeline"]["score_rel_l2"] < 1e-5


def test_an_input_your_step_refuses_gets_a_400_with_its_words_and_the_server_keeps_serving(steps_served):
    _, server = steps_served
    body = {"inputs": [{"name": "csv", "shape": [1, 1], "datatype": "BYTES", "data": ["1,2"]}]}
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v2/models/csv_classifier/infer",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 400
    assert "preprocess step: ValueError: expected 4 comma-separated numbers, got 2" in refused.value.read().decode()
    with TritonClient(f"127.0.0.1:{server.grpc_port}", "grpc") as client:
        got = client.infer("csv_classifier", {"csv": np.array([[b"1,2,3,4"], [b"-1,0,0,9"]], dtype=np.object_)})
        assert got["label"].shape == (2, 1) and got["label"][0, 0] in (b"low", b"middle", b"high")
        assert client.infer("csv_classifier__model", {"x": np.ones((1, 4), dtype=np.float32)})["logits"].shape == (1, 3)
