"""model.py's intra_op_spinning parameter on the real embedded Triton: with several intra-op threads
onnxruntime's threads do not busy-wait unless asked (spinning collapses on a shared host), both settings
answer like the reference, and a bad value is refused at load with the parameter named. A python-backend
model (--target python) of its own: standard folders run Triton's own onnxruntime backend, which has no
such parameter."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient

from builder.serving.client import TritonError
from builder.serving.embedded import EmbeddedServer
from tests.conftest import EXAMPLES
from tests.integration.conftest import reloaded

pytestmark = [pytest.mark.integration, pytest.mark.slow(reason="builds a model and serves it")]


@pytest.fixture(scope="module")
def python_repository(tmp_path_factory):
    from builder.pipeline import build

    repo = tmp_path_factory.mktemp("spinning") / "model_repository"
    build(EXAMPLES / "digits" / "spec.yaml", repo, variants=["onnx"], target="python", benchmark_seconds=0,
          progress=lambda m: None)
    return repo


@pytest.fixture(scope="module")
def served(python_repository):
    with EmbeddedServer(python_repository, ready_timeout=90) as server:
        yield server


def _threads(spinning):
    def change(config):
        config["parameters"]["intra_op_threads"] = {"string_value": "2"}
        if spinning is not None:
            config["parameters"]["intra_op_spinning"] = {"string_value": spinning}
    return change


def _logits(server):
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        item = httpclient.InferInput("image", [3, 1, 8, 8], "FP32")
        item.set_data_from_numpy(np.linspace(0, 1, 3 * 64, dtype=np.float32).reshape(3, 1, 8, 8))
        return client.infer("digits_cnn", [item]).as_numpy("logits")
    finally:
        client.close()


def test_two_threads_answer_the_same_with_spinning_off_by_default_and_on(served):
    expected = _logits(served)
    for spinning in (None, "on", "off"):
        with reloaded(served, "digits_cnn", _threads(spinning)) as server:
            np.testing.assert_allclose(_logits(server), expected, rtol=1e-5, atol=1e-6)


def test_a_bad_spinning_value_is_refused_at_load_naming_the_parameter(python_repository, tmp_path):
    # a server of its own: a model that failed to load leaves a server not ready (strict readiness)
    repo = tmp_path / "repo"
    shutil.copytree(python_repository / "digits_cnn", repo / "digits_cnn")
    with EmbeddedServer(repo, load_models=["digits_cnn"], ready_timeout=90) as server:
        with server.triton() as client:
            config = client.model_config("digits_cnn")
        _threads("sideways")(config)
        config["name"] = "digits_cnn_badspin"
        files = {f"file:1/{p.name}": p.read_bytes() for p in (repo / "digits_cnn" / "1").iterdir() if p.is_file()}
        with server.triton() as client:
            with pytest.raises(TritonError, match="intra_op_spinning 'sideways': use on or off"):
                client.load_model("digits_cnn_badspin", json.dumps(config), files=files)
        assert _logits(server).shape == (3, 10)  # the model itself still serves
