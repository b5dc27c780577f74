"""Triton's STANDARD model folders (onnxruntime_onnx + model.onnx, pytorch_libtorch + model.pt, openvino +
model.xml/.bin: what the NGC image's C++ backends load) served by the embedded tritonserver - through Triton's
own C++ backend where `install-backends` built it (onnxruntime), else its Python-based stand-in - and checked
against the reference over HTTP and gRPC."""

from __future__ import annotations

import shutil

import pytest

from builder.core.errors import ServerError
from builder.repository.config import parse_config
from builder.repository.metadata import read_metadata
from builder.serving.check import check_served
from builder.serving.client import TritonClient
from builder.serving.embedded import EmbeddedServer
from tests.conftest import ROOT

pytestmark = [pytest.mark.slow]

STANDARD = {"onnx": ("onnxruntime_onnx", "onnxruntime", "model.onnx"),
            "torchscript": ("pytorch_libtorch", "pytorch", "model.pt"),
            "openvino": ("openvino", "openvino", "model.xml")}


@pytest.fixture(scope="module")
def standard_repository(tmp_path_factory):
    """digits published for Triton's own backends (target cpu): one model per format."""
    from builder.pipeline import build

    repo = tmp_path_factory.mktemp("standard") / "model_repository"
    build(ROOT / "examples" / "digits" / "spec.yaml", repo, variants=["onnx", "openvino", "torchscript"], target="cpu",
          publish_variants=True, benchmark_seconds=0, progress=lambda m: None)
    return repo


def _formats(repo) -> dict[str, str]:
    return {p.name: read_metadata(p / "1" / "metadata.yaml")["artifact"]["format"]
            for p in repo.iterdir() if (p / "config.pbtxt").is_file()}


def test_standard_version_folders_hold_no_model_py(standard_repository):
    formats = _formats(standard_repository)
    assert sorted(formats.values()) == ["onnx", "openvino", "torchscript"], formats
    for model, fmt in formats.items():
        platform_or_backend, _, model_file = STANDARD[fmt]
        config = parse_config((standard_repository / model / "config.pbtxt").read_text())
        assert platform_or_backend in (config.platform, config.backend)
        files = {p.name for p in (standard_repository / model / "1").iterdir()}
        assert model_file in files and "model.py" not in files and "drift.py" not in files, (model, files)


def test_the_embedded_server_serves_each_standard_folder_and_check_passes(standard_repository):
    formats = _formats(standard_repository)
    with EmbeddedServer(standard_repository, ready_timeout=120) as server:
        assert sorted(server.models) == sorted(formats) and not server.left_out and not server.failed
        with TritonClient(f"http://{server.http_url}") as client:
            for model, fmt in formats.items():
                loaded = client.model_config(model)
                backend = STANDARD[fmt][1]
                runtime = "" if backend in server.native_backends else "model.py"  # "": Triton's own library
                assert (loaded["backend"], loaded["runtime"]) == (backend, runtime), loaded
        for model in formats:
            report = check_served(model, repository=standard_repository, url=server.http_url,
                                  grpc_url=server.grpc_url, protocol="both")
            assert report.ok, report.lines()
            assert set(report.metrics) == {"http", "grpc"}, report.metrics


def test_a_tensorrt_accelerator_is_refused_with_the_stand_ins_reason(standard_repository, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_BUILDER_BACKENDS", "standin")  # the stand-in's own refusal
    repo = tmp_path / "repo"
    onnx_model = next(m for m, f in _formats(standard_repository).items() if f == "onnx")
    shutil.copytree(standard_repository / onnx_model, repo / "trt_accelerated")
    config = (repo / "trt_accelerated" / "config.pbtxt").read_text().replace(f'name: "{onnx_model}"',
                                                                              'name: "trt_accelerated"')
    config += ('optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" } ] } }\n')
    (repo / "trt_accelerated" / "config.pbtxt").write_text(config)
    shutil.copytree(standard_repository / onnx_model, repo / onnx_model)
    with EmbeddedServer(repo, load_models=[onnx_model], ready_timeout=120) as server:
        with pytest.raises(ServerError, match=r"stand-in onnxruntime backend \(triton-builder's embedded server\) "
                                              r"refuses 'trt_accelerated': execution accelerator tensorrt"):
            server.load_model("trt_accelerated")
        assert server.model_ready(onnx_model)  # the server and the other model are unaffected


def test_triton_warms_each_model_up_with_its_reference_sample(standard_repository, tmp_path):
    """Every published config warms up from <model>/warmup/ (a reference sample, not zeros), and the real
    server reads that file: one cut short makes Triton refuse the model at load, naming the warm-up."""
    from builder.repository.warmup_data import referenced_files

    for model in _formats(standard_repository):
        text = (standard_repository / model / "config.pbtxt").read_text()
        assert "zero_data" not in text and referenced_files(text), model
        assert all((standard_repository / model / f).is_file() for f in referenced_files(text))
    repo = tmp_path / "repo"
    onnx_model = next(m for m, f in _formats(standard_repository).items() if f == "onnx")
    shutil.copytree(standard_repository / onnx_model, repo / onnx_model)
    warm = repo / onnx_model / referenced_files((repo / onnx_model / "config.pbtxt").read_text())[0]
    warm.write_bytes(warm.read_bytes()[:-4])
    with EmbeddedServer(repo, load_models=[], ready_timeout=120) as server:
        with pytest.raises(ServerError, match=r"warmup setting expects 256 bytes, but the data provided from "
                                              rf"{warm.name}\s*only has 252 bytes"):
            server.load_model(onnx_model)
