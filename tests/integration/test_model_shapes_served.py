"""The model shapes the examples do not cover, built, served on the real embedded tritonserver and
checked over HTTP and gRPC: a per-sample scalar output (argmax class id) and scalar input, integer ids
without data beyond the model's vocabulary, a data-dependent output length without batching, a
model taking and returning every dtype the spec lists, and tensor names with '.' and ':'."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from builder.pipeline import build
from builder.repository.config import config_as_dict
from builder.serving.check import check_served
from builder.serving.client import TritonClient
from builder.serving.embedded import EmbeddedServer
from builder.tuning.payload import fetch_model, load_samples
from tests.conftest import edit_spec, run_cli
from tests.tiny_models import write_model

pytestmark = pytest.mark.integration

MODELS = ("argmax", "embed", "detect", "mixed", "dotted")


@pytest.fixture(scope="module")
def shapes_served(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    repo = root / "model_repository"
    for kind in MODELS:
        spec = write_model(root, kind)
        if kind == "argmax":  # the drift profile describes data.validation: give this one some
            rng = np.random.default_rng(0)
            np.savez(spec.parent / "val.npz", x=rng.standard_normal((160, 6)).astype(np.float32),
                     temperature=rng.uniform(0.5, 2.0, 160).astype(np.float32))
            edit_spec(spec.parent, data={"validation": "val.npz"})
        build(spec, repo, benchmark_seconds=0, progress=lambda _: None)
    server = EmbeddedServer(repo, ready_timeout=90)
    server.start()
    yield server, repo
    server.stop()


@pytest.mark.parametrize("model", MODELS)
def test_served_answers_match_the_reference_over_http_and_grpc(shapes_served, model):
    server, repo = shapes_served
    report = check_served(model, repository=repo, url=server.http_url, grpc_url=server.grpc_url, protocol="both")
    assert report.ok, report.lines()
    assert not report.config_differences
    for metrics in report.metrics.values():
        assert all(m["rel_l2"] < 1e-5 and m["compared"] > 0 for m in metrics.values()), metrics


def test_check_cli_passes_on_each(shapes_served):
    server, repo = shapes_served
    for model in MODELS:
        proc = run_cli("check", model, "--repository", str(repo), "--url", server.http_url,
                       "--grpc-url", server.grpc_url)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{model} version 1: OK" in proc.stdout


def test_scalar_per_sample_is_dims_1_reshape_empty_and_served_as_batch_by_1(shapes_served):
    server, repo = shapes_served
    config = config_as_dict((repo / "argmax" / "config.pbtxt").read_text())
    label = next(o for o in config["output"] if o["name"] == "label")
    assert label["dims"] == ["1"] and "reshape" in label and label["data_type"] == "TYPE_INT64"
    with TritonClient(server.http_url, "http") as client:
        metadata = client.model_metadata("argmax")
        out = client.infer("argmax", {"x": np.ones((3, 6), np.float32), "temperature": np.ones((3, 1), np.float32)})
    shapes = {o["name"]: [int(d) for d in o["shape"]] for o in metadata["outputs"]}
    assert shapes["label"] == [-1, 1]
    assert out["label"].shape == (3, 1) and out["probs"].shape == (3, 4)
    # load-test payloads from reference.npz come out in the wire shape
    model = fetch_model(server.grpc_url, "grpc", "argmax")
    samples, source = load_samples(model, repository=repo)
    assert source.endswith("reference.npz") and all(s["temperature"].shape == (1, 1) for s in samples)


def test_ids_are_served_from_the_probed_range(shapes_served):
    server, repo = shapes_served
    meta = yaml.safe_load((repo / "embed" / "1" / "metadata.yaml").read_text())
    assert meta["spec"]["inputs"][0]["value_range"] == [0, 50]


def test_data_dependent_length_is_minus_1_in_config_and_metadata(shapes_served):
    server, repo = shapes_served
    config = config_as_dict((repo / "detect" / "config.pbtxt").read_text())
    assert config["output"][0]["dims"] == ["-1", "4"]
    with TritonClient(server.http_url, "http") as client:
        metadata = client.model_metadata("detect")
        rng = np.random.default_rng(5)
        lengths = {client.infer("detect", {"x": rng.standard_normal((64, 4)).astype(np.float32)})["boxes"].shape[0]
                   for _ in range(5)}
    assert [int(d) for d in metadata["outputs"][0]["shape"]] == [-1, 4]
    assert len(lengths) > 1  # the length really varies per input


def test_every_dtype_in_and_out_is_served_as_declared(shapes_served):
    server, repo = shapes_served
    with TritonClient(server.http_url, "http") as client:
        metadata = client.model_metadata("mixed")
    types = {t["name"]: t["datatype"] for t in metadata["inputs"] + metadata["outputs"]}
    assert types == {"pixels": "UINT8", "mask": "BOOL", "scale": "FP64", "offset": "INT8", "ids": "INT16",
                     "count": "INT32", "half": "FP16", "label": "INT64", "probs": "FP32", "confidence": "FP64",
                     "flags": "BOOL", "offset2": "INT8", "total": "INT32", "half2": "FP16", "ids3": "INT16",
                     "corner": "UINT8"}


def test_drift_profile_covers_scalar_inputs_and_outputs(shapes_served):
    import json
    _, repo = shapes_served
    profile = json.loads((repo / "argmax" / "1" / "drift_profile.json").read_text())
    assert {"input:temperature", "output:label"} <= set(profile["features"]), sorted(profile["features"])
    assert profile["reference_rows"] == 160


def test_without_validation_data_there_is_no_drift_profile_and_the_metadata_says_why(shapes_served):
    _, repo = shapes_served
    assert not (repo / "embed" / "1" / "drift_profile.json").exists()
    notes = yaml.safe_load((repo / "embed" / "1" / "metadata.yaml").read_text())["notes"]
    assert any(n.startswith("drift monitoring off: no data.validation") for n in notes), notes


def test_load_test_sends_scalar_inputs_in_the_wire_shape(shapes_served, tmp_path):
    from builder.tuning.loadtest import run_loadtest
    server, repo = shapes_served
    result = run_loadtest("mixed", server.http_url, protocol="http", users=2, run_time_s=3, out_dir=tmp_path,
                          repository=repo, timeout_s=120)
    assert result["requests"] > 0 and result["failures"] == 0, result
    assert str(result["payload"]).endswith("reference.npz")


def test_an_error_the_model_answers_is_counted_where_the_failure_alert_reads_it(shapes_served):
    import re
    import urllib.request

    from builder.serving.client import TritonError

    server, _ = shapes_served
    with TritonClient(server.http_url, "http") as client:
        with pytest.raises(TritonError, match="out of data bounds"):  # onnxruntime: ids beyond the vocabulary (50)
            client.infer("embed", {"ids": np.full((1, 5), 99, np.int64)})
    with urllib.request.urlopen(server.metrics_url, timeout=10) as answer:
        text = answer.read().decode()

    def value(pattern):
        return sum(float(v) for v in re.findall(pattern, text, flags=re.M))

    ours = value(r'^triton_builder_request_errors_total{(?=[^}]*model="embed")(?=[^}]*reason="model_error")[^}]*} (\S+)$')
    tritons = value(r'^nv_inference_request_failure{(?=[^}]*model="embed")(?=[^}]*reason="BACKEND")[^}]*} (\S+)$')
    # the recording rule the failure alert reads takes either (monitoring/prometheus/rules/recording.yml)
    if "onnxruntime" in server.native_backends:  # Triton's own backend: Triton counts the failed request
        assert (tritons, ours) == (1, 0)
    else:  # the python stand-in answers the error in its response (a success to Triton) and counts it itself
        assert (ours, value(r'^nv_inference_request_failure{(?=[^}]*model="embed")[^}]*} (\S+)$')) == (1, 0)
