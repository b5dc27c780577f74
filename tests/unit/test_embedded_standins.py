"""The embedded server's Python-based stand-ins for Triton's C++ backends (templates/embedded_standins/model.py):
how a standard config is read, and what is refused. Served for real in tests/integration/test_standard_folders_served.py."""

from __future__ import annotations

import json
import shutil

import pytest

from builder.core import assets
from builder.repository import pb_utils_stand_in
from builder.repository.served_replay import import_model_py


@pytest.fixture
def standin(tmp_path):
    folder = tmp_path / "backends" / "onnxruntime"
    folder.mkdir(parents=True)
    shutil.copyfile(assets.standin_backend_model(), folder / "model.py")
    shutil.copyfile(assets.python_backend_model(), folder / "served_model.py")
    return import_model_py(folder / "model.py")


def _initialize(module, monkeypatch, config: dict, kind: str = "CPU") -> dict:
    """The config the python-backend model underneath is initialised with (its initialize captured)."""
    seen = {}
    monkeypatch.setattr(module._ServedModel, "initialize", lambda self, args: seen.update(json.loads(args["model_config"])))
    module.TritonPythonModel().initialize({"model_config": json.dumps(config), "model_name": "m", "model_version": "1",
                                          "model_repository": "/nowhere", "model_instance_kind": kind})
    return seen


@pytest.mark.parametrize("config, runtime, file, threads", [
    ({"platform": "onnxruntime_onnx", "backend": "onnxruntime",
      "parameters": {"intra_op_thread_count": {"string_value": "3"}}}, "onnxruntime", "model.onnx", "3"),
    ({"backend": "pytorch", "default_model_filename": "traced.pt",
      "parameters": {"INTRA_OP_THREAD_COUNT": {"string_value": "2"}, "INFERENCE_MODE": {"string_value": "true"}}},
     "torchscript", "traced.pt", "2"),
    ({"backend": "openvino", "parameters": {"INFERENCE_NUM_THREADS": {"string_value": "4"}}}, "openvino", "model.xml", "4"),
    ({"platform": "onnxruntime_onnx"}, "onnxruntime", "model.onnx", "1"),  # unset: one thread
])
def test_a_standard_config_is_read_as_the_cpp_backend_reads_it(standin, monkeypatch, config, runtime, file, threads):
    params = {k: v["string_value"] for k, v in _initialize(standin, monkeypatch, config)["parameters"].items()}
    assert params["runtime"] == runtime and params["model_file"] == file and params["intra_op_threads"] == threads


def test_the_python_models_own_parameters_cannot_be_smuggled_in(standin, monkeypatch):
    config = {"backend": "onnxruntime", "parameters": {"runtime": {"string_value": "torchscript"},
                                                       "model_file": {"string_value": "../../etc/x"}}}
    params = _initialize(standin, monkeypatch, config)["parameters"]
    assert params["runtime"]["string_value"] == "onnxruntime" and params["model_file"]["string_value"] == "model.onnx"


def test_accelerators_and_gpu_instances_are_refused_with_one_line(standin, monkeypatch):
    trt = {"platform": "onnxruntime_onnx", "backend": "onnxruntime", "optimization": {"execution_accelerators": {
        "gpu_execution_accelerator": [{"name": "tensorrt", "parameters": {"precision_mode": "FP16"}}]}}}
    pb_utils_stand_in.LOGGED.clear()
    with pytest.raises(pb_utils_stand_in.TritonModelException,
                       match=r"stand-in onnxruntime backend \(triton-builder's embedded server\) refuses 'm': execution "
                             r"accelerator tensorrt in config.pbtxt: the stand-in runs onnxruntime on the CPU only"):
        _initialize(standin, monkeypatch, trt)
    assert any("execution accelerator tensorrt" in line for line in pb_utils_stand_in.LOGGED)  # and the server log
    with pytest.raises(pb_utils_stand_in.TritonModelException, match="a KIND_GPU instance: the stand-in runs openvino"):
        _initialize(standin, monkeypatch, {"backend": "openvino"}, kind="GPU")
    assert _initialize(standin, monkeypatch, {"backend": "pytorch"}, kind="GPU")  # TorchScript runs on a GPU
    assert "\n" not in standin.refusal(trt, "onnxruntime", "CPU")
