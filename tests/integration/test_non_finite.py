"""NaN/Inf inputs on the real embedded Triton, for standard folders served with deploy.monitor (the monitor step
of builder/repository/monitored.py): counted per input on Triton's metrics endpoint with the default policy
(count), refused with a 400 naming the input with policy reject - and that refusal counted as an error answer
(triton_builder_request_errors_total) under the model's name. Two models in one repository: digits_cnn (count)
and digits_reject (reject)."""

from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from builder.serving.embedded import EmbeddedServer
from builder.spec.model import load_spec
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.integration

COUNTER = "triton_builder_nonfinite_inputs_total"


def _metrics(served) -> str:
    with urllib.request.urlopen(served.metrics_url if served.metrics_url.startswith("http")
                                else f"http://{served.metrics_url}/metrics", timeout=10) as response:
        return response.read().decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from builder.pipeline import build

    repo = tmp_path_factory.mktemp("non_finite") / "model_repository"
    for name, policy in (("digits_cnn", "count"), ("digits_reject", "reject")):
        spec = load_spec(EXAMPLES / "digits" / "spec.yaml")
        spec.name, spec.deploy.monitor, spec.deploy.non_finite_inputs = name, True, policy
        build(spec, repo, variants=["onnx"], benchmark_seconds=0, progress=lambda m: None)
    with EmbeddedServer(repo, ready_timeout=120) as server:
        yield server


def _errors(served, reason: str, model: str = "digits_reject") -> float:
    pattern = rf'^triton_builder_request_errors_total{{(?=[^}}]*model="{model}")(?=[^}}]*reason="{reason}")[^}}]*}} (\S+)$'
    values = [float(v) for v in re.findall(pattern, _metrics(served), flags=re.M)]
    assert values, f"triton_builder_request_errors_total for {model}/{reason} not on the metrics endpoint"
    return sum(values)


def _counter(served, policy: str, model: str = "digits_cnn") -> float:
    text = _metrics(served)
    pattern = rf'^{COUNTER}{{(?=[^}}]*model="{model}")(?=[^}}]*input="image")(?=[^}}]*policy="{policy}")[^}}]*}} (\S+)$'
    values = [float(v) for v in re.findall(pattern, text, flags=re.M)]
    assert values, f"{COUNTER} for {model}/image/{policy} not on the metrics endpoint"
    return sum(values)


def _infer(served, image, model: str = "digits_cnn"):
    client = httpclient.InferenceServerClient(served.http_url)
    try:
        item = httpclient.InferInput("image", list(image.shape), "FP32")
        item.set_data_from_numpy(image)
        return client.infer(model, [item]).as_numpy("logits")
    finally:
        client.close()


def test_non_finite_inputs_are_counted_and_served_by_default(served):
    before = _counter(served, "count")  # the counter exists from the model's start, at 0 or more
    image = np.zeros((2, 1, 8, 8), np.float32)
    image[0, 0, 0, 0] = np.nan
    image[1, 0, 1, 1] = np.inf
    logits = _infer(served, image)
    assert logits.shape == (2, 10)
    assert _counter(served, "count") == before + 1  # one request held non-finite values
    _infer(served, np.ones((1, 1, 8, 8), np.float32))
    assert _counter(served, "count") == before + 1  # finite requests are not counted


def test_reject_policy_refuses_with_an_error_naming_the_input(served):
    image = np.ones((1, 1, 8, 8), np.float32)
    image[0, 0, 2, 3] = -np.inf
    with pytest.raises(InferenceServerException, match=r"model 'digits_reject' refuses NaN/Inf inputs: image "
                                                       r"\(1 of 64 values\)") as info:
        _infer(served, image, "digits_reject")
    assert info.value.status() == "400", info.value.status()
    assert _counter(served, "reject", "digits_reject") == 1
    assert _errors(served, "refused") == 1  # what the failure-ratio rule adds to Triton's failures
    assert _errors(served, "model_error") == 0
    assert _infer(served, np.ones((1, 1, 8, 8), np.float32), "digits_reject").shape == (1, 10)  # finite: served
