"""The Triton client facade (builder/serving/client.py) against the real embedded server: the same
answers over HTTP and gRPC, normalised config/statistics, model control, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from builder.core.errors import ServerError, UserInputError
from builder.serving.client import TritonClient, split_url

MODEL = "digits_cnn"


def _shape(value):
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value).__name__


@pytest.fixture
def both(served):
    with TritonClient(f"http://{served.http_url}") as http, TritonClient(f"grpc://{served.grpc_url}") as grpc:
        yield http, grpc


def test_url_forms():
    assert split_url("grpc://127.0.0.1:8001") == ("127.0.0.1:8001", "grpc")
    assert split_url("http://127.0.0.1:8000/") == ("127.0.0.1:8000", "http")
    assert split_url("127.0.0.1:8001", "grpc") == ("127.0.0.1:8001", "grpc")
    assert split_url("127.0.0.1:8000") == ("127.0.0.1:8000", "http")
    with pytest.raises(UserInputError, match="is grpc but --protocol is http"):
        split_url("grpc://127.0.0.1:8001", "http")
    with pytest.raises(UserInputError, match="--protocol 'udp'"):
        split_url("127.0.0.1:8001", "udp")


def test_same_answers_over_http_and_grpc(both):
    http, grpc = both
    image = np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32)
    for client in both:
        assert client.server_live() and client.server_ready() and client.model_ready(MODEL)
    a = http.infer(MODEL, {"image": image}, ["logits"])
    b = grpc.infer(MODEL, {"image": image}, ["logits"], version=1)
    assert set(a) == set(b) == {"logits"} and a["logits"].shape == (3, 10)
    np.testing.assert_array_equal(a["logits"], b["logits"])
    every = grpc.infer(MODEL, {"image": image})  # no outputs named: all of them
    np.testing.assert_array_equal(every["logits"], a["logits"])


def test_config_metadata_statistics_normalised_identically(both):
    http, grpc = both
    assert http.model_config(MODEL) == grpc.model_config(MODEL)
    assert http.model_config(MODEL)["name"] == MODEL
    assert http.model_metadata(MODEL) == grpc.model_metadata(MODEL)
    image = np.zeros((2, 1, 8, 8), np.float32)
    http.infer(MODEL, {"image": image}, ["logits"])
    a, b = http.statistics(MODEL), grpc.statistics(MODEL)
    assert _shape(a) == _shape(b)  # the counters move between the two reads: same fields and types
    entry = a["model_stats"][0]
    assert entry["name"] == MODEL and isinstance(entry["version"], str)
    assert isinstance(entry["inference_stats"]["success"]["count"], int) and entry["inference_stats"]["success"]["count"] > 0
    assert entry["batch_stats"] and all(isinstance(s["batch_size"], int) for s in entry["batch_stats"])
    assert http.repository_index() == grpc.repository_index()


def test_load_unload_wait(served, both):
    http, grpc = both
    try:
        grpc.unload_model(MODEL, wait=True)
        assert http.model_state(MODEL)[0] not in ("READY", "UNLOADING")
        assert not http.model_ready(MODEL)
        grpc.load_model(MODEL)
        http.wait_for_model(MODEL, timeout=60)
        assert http.model_state(MODEL) == ("READY", "")
    finally:
        if not http.model_ready(MODEL):
            served.load_model(MODEL)


def test_unreachable_url_is_a_clear_error():
    for protocol in ("http", "grpc"):
        with TritonClient("127.0.0.1:9", protocol, network_timeout=5) as client:
            with pytest.raises(ServerError, match=r"cannot reach Triton at 127\.0\.0\.1:9 over (HTTP|gRPC)"):
                client.require_live()
            with pytest.raises(ServerError, match=r"Triton at 127\.0\.0\.1:9 did not answer \(config of model"):
                client.model_config(MODEL)


def test_unknown_model_is_a_clear_error(both):
    for client in both:
        assert not client.model_ready("nope")
        with pytest.raises(ServerError, match=rf"Triton at {client.address}: config of model 'nope' failed: .*nope"):
            client.model_config("nope")
        with pytest.raises(ServerError, match=r"inference of 'nope' failed"):
            client.infer("nope", {"image": np.zeros((1, 1, 8, 8), np.float32)})
        with pytest.raises(ServerError, match=r"load of model 'nope' failed"):
            client.load_model("nope")
