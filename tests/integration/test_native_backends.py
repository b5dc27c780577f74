"""Triton's own onnxruntime and pytorch backends (r24.10, built by `install-backends` against onnxruntime 1.19.2
and this environment's torch) inside the embedded tritonserver (issue 48): the server's config endpoint and its
log show the C++ library, not a `runtime: model.py` stand-in, and `check` passes over HTTP and gRPC; a string
output (a folded label head's LabelEncoder) comes back as BYTES."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from builder.serving.check import check_served
from builder.serving.client import TritonClient
from builder.serving.embedded import EmbeddedServer
from builder.serving.native_backends import built_backend, install_backends
from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow(reason="builds and serves a model")]


@pytest.fixture(scope="module")
def native_onnxruntime():
    """The real backends, built here if `make setup` has not (cached: a second build costs nothing)."""
    report = install_backends(["onnxruntime", "pytorch"])
    assert report.ok, report.lines()
    return built_backend("onnxruntime")


@pytest.fixture(scope="module")
def digits_repository(tmp_path_factory):
    from builder.pipeline import build

    repo = tmp_path_factory.mktemp("native") / "model_repository"
    build(ROOT / "examples" / "digits" / "spec.yaml", repo, variants=["onnx"], target="cpu", benchmark_seconds=0,
          progress=lambda m: None)
    return repo


def test_the_cpp_pytorch_backend_runs_this_environments_libtorch_and_check_passes(native_onnxruntime, tmp_path):
    from builder.pipeline import build

    repo = tmp_path / "model_repository"
    build(ROOT / "examples" / "digits" / "spec.yaml", repo, variants=["torchscript"], target="cpu",
          benchmark_seconds=0, progress=lambda m: None)
    with EmbeddedServer(repo, ready_timeout=120) as server:
        assert "pytorch" in server.native_backends
        with TritonClient(f"http://{server.http_url}") as client:
            config = client.model_config("digits_cnn")
        assert (config["platform"], config["backend"], config["runtime"]) == ("pytorch_libtorch", "pytorch", "")
        assert re.search(r"\| pytorch \| \S+/backends/pytorch/libtriton_pytorch\.so \|", server.read_log())
        report = check_served("digits_cnn", repository=repo, url=server.http_url, grpc_url=server.grpc_url,
                              protocol="both")
    assert report.ok and set(report.metrics) == {"http", "grpc"}, report.lines()


def test_the_embedded_server_runs_the_cpp_onnxruntime_backend_and_check_passes(native_onnxruntime,
                                                                                digits_repository):
    assert (native_onnxruntime / "libtriton_onnxruntime.so").is_file()
    assert (native_onnxruntime / "libonnxruntime.so.1.19.2").is_file()
    with EmbeddedServer(digits_repository, ready_timeout=120) as server:
        assert "onnxruntime" in server.native_backends and server.models == ["digits_cnn"]
        with TritonClient(f"http://{server.http_url}") as client:
            config = client.model_config("digits_cnn")
        assert (config["platform"], config["backend"], config["runtime"]) == ("onnxruntime_onnx", "onnxruntime", "")
        log = server.read_log()
        assert re.search(r"\| onnxruntime \| \S+/backends/onnxruntime/libtriton_onnxruntime\.so \|", log), log[-3000:]
        assert "TRITONBACKEND_ModelInstanceInitialize: digits_cnn_0_0 (CPU device 0)" in log
        assert "model.py" not in log.split("TRITONBACKEND_Initialize: onnxruntime")[1].split("\n")[0]
        report = check_served("digits_cnn", repository=digits_repository, url=server.http_url,
                              grpc_url=server.grpc_url, protocol="both")
    assert report.ok and set(report.metrics) == {"http", "grpc"}, report.lines()


def test_forced_stand_ins_serve_the_same_folder_through_model_py(native_onnxruntime, digits_repository, monkeypatch):
    monkeypatch.setenv("TRITON_BUILDER_BACKENDS", "standin")
    with EmbeddedServer(digits_repository, ready_timeout=120) as server:
        assert server.native_backends == []
        with TritonClient(f"http://{server.http_url}") as client:
            assert client.model_config("digits_cnn")["runtime"] == "model.py"


def test_a_string_output_comes_back_as_bytes_from_the_cpp_backend(native_onnxruntime, tmp_path):
    """ai.onnx.ml LabelEncoder int64 -> string, as the folded label head ends: Triton's onnxruntime backend
    answers TYPE_STRING as BYTES over both protocols."""
    graph = helper.make_graph(
        [helper.make_node("LabelEncoder", ["ids"], ["label"], domain="ai.onnx.ml", keys_int64s=[0, 1, 2],
                          values_strings=["neg", "neutral", "pos"], default_string="?")],
        "labels", [helper.make_tensor_value_info("ids", TensorProto.INT64, [None, 1])],
        [helper.make_tensor_value_info("label", TensorProto.STRING, [None, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 9  # onnxruntime 1.19 reads IR <= 10
    folder = tmp_path / "repo" / "labels"
    (folder / "1").mkdir(parents=True)
    onnx.save(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(
        'name: "labels"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [{ name: "ids" data_type: TYPE_INT64 dims: [1] }]\n'
        'output [{ name: "label" data_type: TYPE_STRING dims: [1] }]\n')
    with EmbeddedServer(tmp_path / "repo", ready_timeout=120) as server:
        assert "onnxruntime" in server.native_backends
        for url, protocol in ((server.http_url, "http"), (server.grpc_url, "grpc")):
            with TritonClient(url, protocol) as client:
                out = client.infer("labels", {"ids": np.array([[2], [0], [7]], np.int64)})
            assert [v.decode() for v in out["label"].reshape(-1)] == ["pos", "neg", "?"], protocol
