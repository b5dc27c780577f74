"""deploy.monitor (builder/repository/monitored.py): the ensemble and the python monitor step's configs as
golden files parsed with Triton's schema, the step's own logic without a server (templates/monitor/model.py),
and where a monitored model's versions are found. Served for real in tests/integration/test_monitored_served.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from builder.core.errors import UserInputError
from builder.repository import pb_utils_stand_in
from builder.repository.config import DynamicBatching, InstanceGroup, ModelConfig, TensorConfig, parse_config, render_config
from builder.repository.layout import is_monitored, model_dir
from builder.repository.monitored import (ensemble_config, monitor_config, monitor_files, refuse_mixed,
                                          render_ensemble)
from builder.repository.served_replay import import_model_py
from builder.spec.model import DeploySpec

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def _model(instances: int = 2, kind: str = "KIND_CPU") -> ModelConfig:
    return ModelConfig(name="digits_cnn__model", backend="onnxruntime_onnx", max_batch_size=64,
                       inputs=[TensorConfig("image", "TYPE_FP32", [1, 8, 8])],
                       outputs=[TensorConfig("logits", "TYPE_FP32", [10])], dynamic_batching=DynamicBatching(100),
                       instance_groups=[InstanceGroup(kind, instances)])


def test_the_ensemble_matches_its_golden_file_and_runs_the_model_then_the_monitor():
    text = render_ensemble(ensemble_config("digits_cnn", _model()))
    assert text == (GOLDEN / "monitored_ensemble.pbtxt").read_text()
    parsed = parse_config(text)
    assert parsed.platform == "ensemble" and parsed.name == "digits_cnn" and not parsed.instance_group
    model, monitor = parsed.ensemble_scheduling.step
    assert (model.model_name, dict(model.output_map)) == ("digits_cnn__model", {"logits": "logits__model"})
    assert monitor.model_name == "digits_cnn__monitor"
    assert dict(monitor.input_map) == {"image": "image", "logits__model": "logits__model"}
    assert dict(monitor.output_map) == {"logits": "logits"}  # the ensemble's output is the monitor's pass-through


def test_the_monitor_step_matches_its_golden_file_one_cpu_instance_per_model_instance():
    text = render_config(monitor_config("digits_cnn", _model(), DeploySpec(monitor=True)))
    assert text == (GOLDEN / "monitor_step.pbtxt").read_text()
    parsed = parse_config(text)
    assert parsed.backend == "python" and parsed.instance_group[0].count == 2
    assert {k: v.string_value for k, v in parsed.parameters.items()} == {"monitored_model": "digits_cnn",
                                                                         "non_finite_inputs": "count"}
    gpu = monitor_config("m", _model(4, "KIND_GPU"), DeploySpec(monitor=True, non_finite_inputs="reject"))
    assert gpu.instance_groups[0].kind == "KIND_CPU" and gpu.instance_groups[0].count == 1
    assert gpu.parameters["non_finite_inputs"] == "reject"


@pytest.fixture
def monitor_step(tmp_path, monkeypatch):
    """templates/monitor/model.py initialised in a version folder of its own, outside Triton."""
    def make(policy: str = "count"):
        folder = tmp_path / "digits_cnn__monitor" / "1"
        folder.mkdir(parents=True, exist_ok=True)
        for name, source in monitor_files().items():
            shutil.copyfile(source, folder / name)
        config = json.loads(json.dumps({
            "max_batch_size": 64, "input": [{"name": "image", "data_type": "TYPE_FP32"},
                                            {"name": "logits__model", "data_type": "TYPE_FP32"}],
            "output": [{"name": "logits", "data_type": "TYPE_FP32"}],
            "parameters": {"monitored_model": {"string_value": "digits_cnn"},
                           "non_finite_inputs": {"string_value": policy}}}))
        monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb_utils_stand_in)
        step = import_model_py(folder / "model.py").TritonPythonModel()
        step.initialize({"model_config": json.dumps(config), "model_name": "digits_cnn__monitor",
                         "model_version": "1", "model_repository": str(folder.parent)})
        return step
    return make


def _request(image: np.ndarray, logits: np.ndarray):
    return pb_utils_stand_in.StandInRequest({"image": image, "logits__model": logits})


def test_the_monitor_step_hands_the_models_outputs_on_unchanged(monitor_step):
    step = monitor_step()
    logits = np.random.default_rng(0).normal(size=(3, 10)).astype(np.float32)
    response, = step.execute([_request(np.zeros((3, 1, 8, 8), np.float32), logits)])
    assert not response.has_error()
    out, = response.output_tensors()
    assert out.name() == "logits" and np.array_equal(out.as_numpy(), logits)
    assert step.drift is None  # no drift_profile.json in the folder: counters only


def test_nan_inputs_are_counted_under_the_models_name_or_refused(monitor_step):
    image = np.zeros((2, 1, 8, 8), np.float32)
    image[1, 0, 3, 3] = np.nan
    counting = monitor_step("count")
    response, = counting.execute([_request(image, np.zeros((2, 10), np.float32))])
    counter = counting.non_finite.counters["image"]
    assert not response.has_error() and counter.value == 1 and counter.labels["model"] == "digits_cnn"
    refusing = monitor_step("reject")
    response, = refusing.execute([_request(image, np.zeros((2, 10), np.float32))])
    assert response.has_error()
    assert "model 'digits_cnn' refuses NaN/Inf inputs: image (1 of 128 values)" in response.error().message()
    assert refusing.errors.counters["refused"].value == 1


def _folder(root: Path, name: str, text: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(text)


def test_a_monitored_models_versions_are_found_in_its_model_folder(tmp_path):
    _folder(tmp_path, "plain", 'name: "plain"\nplatform: "onnxruntime_onnx"\n')
    _folder(tmp_path, "m", 'name: "m"\nplatform: "ensemble"\n')
    _folder(tmp_path, "m__model", 'name: "m__model"\nplatform: "onnxruntime_onnx"\n')
    assert is_monitored(tmp_path, "m") and not is_monitored(tmp_path, "plain")
    assert model_dir(tmp_path, "m") == tmp_path.resolve() / "m__model"
    assert model_dir(tmp_path, "m", resolve=False) == tmp_path.resolve() / "m"
    assert model_dir(tmp_path, "plain") == tmp_path.resolve() / "plain"


def test_a_build_does_not_flip_a_served_model_between_monitored_and_not(tmp_path):
    _folder(tmp_path, "plain", 'name: "plain"\nplatform: "onnxruntime_onnx"\n')
    _folder(tmp_path, "m", 'name: "m"\nplatform: "ensemble"\n')
    _folder(tmp_path, "m__model", 'name: "m__model"\nplatform: "onnxruntime_onnx"\n')
    with pytest.raises(UserInputError, match=r"deploy.monitor: true, but 'plain' .* is served unmonitored"):
        refuse_mixed(tmp_path, "plain", True)
    with pytest.raises(UserInputError, match=r"deploy.monitor is off, but 'm' .* is served monitored .*set "
                                             r"deploy.monitor: true"):
        refuse_mixed(tmp_path, "m", False)
    refuse_mixed(tmp_path, "m", True)
    refuse_mixed(tmp_path, "plain", False)
    refuse_mixed(tmp_path, "new", True)


def test_the_monitor_needs_nothing_the_stock_image_lacks():
    """The step runs on the NGC image's python backend: numpy and the standard library only, at import time
    (served_model.py imports onnxruntime/torch/openvino only inside initialize, which the step never calls)."""
    import ast

    for name, path in monitor_files().items():
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        imported = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module}
        foreign = imported - set(sys.stdlib_module_names) - {"numpy", "triton_python_backend_utils", "__future__"}
        assert not foreign, (name, foreign)


def test_select_and_tune_publish_leave_a_monitored_model_to_build(tmp_path):
    from builder.repository.reselect import select_for_host
    from builder.repository.republish import refuse_monitored

    _folder(tmp_path, "m", 'name: "m"\nplatform: "ensemble"\n')
    _folder(tmp_path, "m__model", 'name: "m__model"\nplatform: "onnxruntime_onnx"\n')
    with pytest.raises(UserInputError, match=r"'m' is a monitored ensemble \(deploy.monitor\): a new version of it is "
                                             r"published by `triton-builder build`"):
        refuse_monitored(tmp_path, "m")
    with pytest.raises(UserInputError, match=r"'m' is a monitored ensemble"):
        select_for_host(tmp_path, "m", signing_key=None)
    refuse_monitored(tmp_path, "m__model")


def test_tune_given_the_ensemble_tunes_its_model_step(tmp_path):
    from builder.repository.tuned import monitored_step

    _folder(tmp_path, "m", 'name: "m"\nplatform: "ensemble"\n')
    _folder(tmp_path, "m__model", 'name: "m__model"\nplatform: "onnxruntime_onnx"\n')
    said = []
    assert monitored_step(tmp_path, "m", said.append) == "m__model"
    assert said == ["note: 'm' is a monitored ensemble: tuning its model step 'm__model' (measured without the monitor "
                    "step, whose cost is in docs/benchmarks.md)"]
    assert monitored_step(tmp_path, "m__model", said.append) == "m__model" and len(said) == 1


def test_publishing_to_object_storage_refuses_a_monitored_model_before_contacting_the_store(tmp_path):
    from builder.storage.s3 import publish_repository

    _folder(tmp_path, "m", 'name: "m"\nplatform: "ensemble"\n')
    _folder(tmp_path, "m__model", 'name: "m__model"\nplatform: "onnxruntime_onnx"\n')
    _folder(tmp_path, "m__monitor", 'name: "m__monitor"\nbackend: "python"\n')
    with pytest.raises(UserInputError, match=r"^m, m__model, m__monitor: part of a monitored model \(deploy.monitor"):
        publish_repository(tmp_path, "s3://bucket/models", client=object())
