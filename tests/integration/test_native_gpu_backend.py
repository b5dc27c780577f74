"""The GPU build of Triton's onnxruntime backend (issue 48, part 3: `install-backends --backend onnxruntime-gpu`,
r24.10 with TRITON_ENABLE_GPU=ON against onnxruntime-gpu 1.19.2 and CUDA 12's runtime from PyPI wheels), made
here without a GPU (cached after the first run): what its library NEEDS against the CPU build's, what its folder
holds, and that the embedded server loads it under TRITON_BUILDER_BACKENDS=gpu and serves a KIND_CPU folder over
HTTP and gRPC. Serving KIND_GPU with the CUDA execution provider needs a GPU host: benchmarks/gpu_host.sh."""

from __future__ import annotations

import os

import pytest

from builder.serving.check import check_served
from builder.serving.embedded import EmbeddedServer
from builder.serving.native_backends import RECIPES, backend_home, built_backend, install_backends
from builder.serving.native_recipes import needed_libraries
from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow(reason="builds the GPU backend (~40 s, a 226 MB wheel)")]


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """{recipe: its report row}: both builds, made here if not cached (the GPU one only when named)."""
    report = install_backends(["onnxruntime", "onnxruntime-gpu"])
    assert report.ok, report.lines()
    return {row.backend: row for row in report.rows}


def test_the_gpu_build_needs_the_cuda_runtime_and_onnxruntime_and_the_cpu_build_does_not(builds):
    gpu, cpu = built_backend("onnxruntime-gpu"), backend_home(RECIPES["onnxruntime"])
    assert gpu is not None and gpu != cpu and gpu.name.startswith("onnxruntime-r24.10-onnxruntime-gpu1.19.2-cuda12.")
    gpu_needs = needed_libraries(gpu / "libtriton_onnxruntime.so")
    cpu_needs = needed_libraries(cpu / "libtriton_onnxruntime.so")
    assert "libcudart.so.12" in gpu_needs and "libonnxruntime.so.1" in gpu_needs, gpu_needs
    assert not any(name.startswith("libcudart") for name in cpu_needs) and "libonnxruntime.so.1" in cpu_needs
    for needs in (gpu_needs, cpu_needs):  # the wheel's server library, not the stub's name
        assert "libtritonserver.so" not in needs and any(n.startswith("libtritonserver-") for n in needs), needs
    assert builds["onnxruntime-gpu"].needed == gpu_needs and builds["onnxruntime"].needed == cpu_needs


def test_the_gpu_folder_holds_what_its_library_and_the_cuda_provider_load(builds):
    gpu = built_backend("onnxruntime-gpu")
    for name in needed_libraries(gpu / "libtriton_onnxruntime.so"):
        if name.startswith(("libonnxruntime", "libcudart")):
            assert (gpu / name).exists(), name  # beside it: RUNPATH $ORIGIN
    assert (gpu / "libonnxruntime.so.1").resolve().name == "libonnxruntime.so.1.19.2"
    assert (gpu / "libonnxruntime_providers_shared.so").is_file()
    provider = needed_libraries(gpu / "libonnxruntime_providers_cuda.so")  # onnxruntime-gpu 1.19.2 on PyPI: CUDA 12
    assert {"libcudart.so.12", "libcublas.so.12", "libcudnn.so.9"} <= set(provider), provider


def test_the_embedded_server_loads_the_gpu_build_only_under_gpu_mode_and_serves_kind_cpu(builds, tmp_path,
                                                                                       monkeypatch):
    from builder.pipeline import build

    repo = tmp_path / "model_repository"
    build(ROOT / "examples" / "digits" / "spec.yaml", repo, variants=["onnx"], target="cpu", benchmark_seconds=0,
          progress=lambda m: None)
    monkeypatch.delenv("TRITON_BUILDER_BACKENDS", raising=False)
    assert built_backend("onnxruntime") == backend_home(RECIPES["onnxruntime"])  # by default: the CPU build
    monkeypatch.setenv("TRITON_BUILDER_BACKENDS", "gpu")
    with EmbeddedServer(repo, ready_timeout=120) as server:
        assert "onnxruntime" in server.native_backends
        served = server._backend_dir / "onnxruntime"
        assert (served / "libtriton_onnxruntime.so").resolve().parent == built_backend("onnxruntime-gpu")
        assert os.path.exists(served / "libcudart.so.12")
        log = server.read_log()
        assert "TRITONBACKEND_ModelInstanceInitialize: digits_cnn_0_0 (CPU device 0)" in log, log[-3000:]
        report = check_served("digits_cnn", repository=repo, url=server.http_url, grpc_url=server.grpc_url,
                              protocol="both")
    assert report.ok and set(report.metrics) == {"http", "grpc"}, report.lines()
