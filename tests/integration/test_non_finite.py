"""NaN/Inf inputs on the real embedded Triton: counted per input on Triton's metrics endpoint with
the default policy (count), refused with a 400 naming the input with policy reject - and that refusal
counted as an error answer (triton_builder_request_errors_total), which Triton's own failure counter
misses."""

from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import reloaded

pytestmark = pytest.mark.integration

COUNTER = "triton_builder_nonfinite_inputs_total"


def _metrics(served) -> str:
    with urllib.request.urlopen(served.metrics_url if served.metrics_url.startswith("http")
                                else f"http://{served.metrics_url}/metrics", timeout=10) as response:
        return response.read().decode()


def _errors(served, reason: str) -> float:
    pattern = rf'^triton_builder_request_errors_total{{(?=[^}}]*model="digits_cnn")(?=[^}}]*reason="{reason}")[^}}]*}} (\S+)$'
    values = [float(v) for v in re.findall(pattern, _metrics(served), flags=re.M)]
    assert values, f"triton_builder_request_errors_total for digits_cnn/{reason} not on the metrics endpoint"
    return sum(values)


def _triton_failures(served) -> float:
    pattern = r'^nv_inference_request_failure{(?=[^}]*model="digits_cnn")[^}]*} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, _metrics(served), flags=re.M))


def _counter(served, policy: str) -> float:
    text = _metrics(served)
    pattern = rf'^{COUNTER}{{(?=[^}}]*model="digits_cnn")(?=[^}}]*input="image")(?=[^}}]*policy="{policy}")[^}}]*}} (\S+)$'
    values = [float(v) for v in re.findall(pattern, text, flags=re.M)]
    assert values, f"{COUNTER} for digits_cnn/image/{policy} not on the metrics endpoint"
    return sum(values)


def _infer(served, image):
    client = httpclient.InferenceServerClient(served.http_url)
    try:
        item = httpclient.InferInput("image", list(image.shape), "FP32")
        item.set_data_from_numpy(image)
        return client.infer("digits_cnn", [item]).as_numpy("logits")
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


@pytest.fixture
def digits_rejecting(served):
    """digits_cnn reloaded with non_finite_inputs: reject (restored after)."""
    def reject(config):
        config["parameters"]["non_finite_inputs"] = {"string_value": "reject"}

    with reloaded(served, "digits_cnn", reject) as server:
        yield server


def test_reject_policy_refuses_with_an_error_naming_the_input(digits_rejecting):
    served = digits_rejecting
    image = np.ones((1, 1, 8, 8), np.float32)
    image[0, 0, 2, 3] = -np.inf
    with pytest.raises(InferenceServerException, match=r"model 'digits_cnn' refuses NaN/Inf inputs: image "
                                                       r"\(1 of 64 values\)") as info:
        _infer(served, image)
    assert info.value.status() == "400", info.value.status()
    assert _counter(served, "reject") == 1
    assert _errors(served, "refused") == 1  # what the failure-ratio rule adds to Triton's failures
    assert _triton_failures(served) == 0  # Triton counted the refused request as a success
    assert _errors(served, "model_error") == 0
    assert _infer(served, np.ones((1, 1, 8, 8), np.float32)).shape == (1, 10)  # finite requests still served
