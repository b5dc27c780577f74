"""Your own preprocess/postprocess steps (builder/spec/steps.py, builder/model/user_steps.py,
builder/repository/user_pipeline.py) without a server: the spec's rules, the functions run on the raw data
as the published step runs them, and the ensemble wiring parsed with Triton's schema. Served for real in
tests/integration/test_user_steps_served.py."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest

from builder.core.errors import UserInputError
from builder.repository.config import DynamicBatching, ModelConfig, TensorConfig, parse_config, render_config
from builder.repository.monitored import render_ensemble
from builder.repository.user_pipeline import user_ensemble_config, user_step_configs
from builder.spec.model import load_spec
from builder.model.user_steps import UserSteps, read_raw, reference_record

FOLDER = Path(__file__).resolve().parents[1] / "integration" / "user_steps"
GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.fixture
def spec_folder(tmp_path) -> Path:
    target = tmp_path / "steps"
    shutil.copytree(FOLDER, target)
    return target


def _edit(folder: Path, old: str, new: str):
    path = folder / "spec.yaml"
    path.write_text(path.read_text().replace(old, new))
    return path


def test_the_steps_load_and_turn_raw_strings_into_the_models_inputs_and_its_outputs_into_labels(spec_folder):
    spec = load_spec(spec_folder / "spec.yaml")
    steps = UserSteps.load(spec)
    raw = read_raw(spec.data.validation, spec.preprocess)
    assert raw["csv"].dtype == np.object_ and isinstance(raw["csv"][0, 0], bytes)
    inputs = steps.preprocess(raw, spec.inputs)
    assert inputs["x"].shape == (24, 4) and inputs["x"].dtype == np.float32
    served = steps.postprocess({"logits": np.array([[0.0, 1.0, 0.5]] * 24, dtype=np.float32)})
    assert served["label"].reshape(-1)[0] == b"middle" and served["score"].shape == (24, 1)
    steps.record(raw, {"logits": np.zeros((24, 3), dtype=np.float32)})
    record = np.load(io.BytesIO(steps.reference), allow_pickle=False)
    assert sorted(record.files) == ["input/csv", "output/label", "output/score"] and record["output/label"].dtype.kind == "U"


@pytest.mark.parametrize("old, new, match", [
    ("function: steps:parse", "function: steps.parse", r"field 'preprocess.function': 'steps.parse' is not 'module:function'"),
    ("function: steps:parse", "function: nowhere:parse", r"field 'preprocess.function': .*nowhere.py not found"),
    ("inputs: [{name: csv, dtype: string}]", "inputs: [{name: csv, dtype: text}]",
     r"field 'preprocess.inputs\[0\].dtype': 'text' is not one of string, float32"),
    ("  validation: raw.npz", "  calibration: raw.npz", r"field 'data': a preprocess step is verified on raw inputs"),
    ("outputs: [{name: label", "inputs: [{name: label", r"field 'postprocess.inputs': a postprocess step's inputs are the model's"),
])
def test_a_wrong_step_names_the_field_and_the_fix(spec_folder, old, new, match):
    with pytest.raises(UserInputError, match=match):
        load_spec(_edit(spec_folder, old, new))


def test_a_function_that_breaks_the_contract_is_named_with_what_it_returned(spec_folder):
    (spec_folder / "steps.py").write_text((spec_folder / "steps.py").read_text()
                                          + "\n\ndef nothing(inputs):\n    return [1]\n")
    spec = load_spec(_edit(spec_folder, "function: steps:parse", "function: steps:nothing"))
    raw = read_raw(spec.data.validation, spec.preprocess)
    with pytest.raises(UserInputError, match=r"preprocess.function must return a dict with x \(got list\)"):
        UserSteps.load(spec).preprocess(raw, spec.inputs)
    (spec_folder / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(UserInputError, match=r"data.validation: .*bad.npz is not an .npz"):
        read_raw(spec_folder / "bad.npz", spec.preprocess)


def test_the_ensemble_runs_your_preprocess_the_model_then_your_postprocess(spec_folder):
    spec = load_spec(spec_folder / "spec.yaml")
    steps = UserSteps.load(spec)
    model = ModelConfig(name="csv_classifier__model", backend="onnxruntime_onnx", max_batch_size=8,
                        inputs=[TensorConfig("x", "TYPE_FP32", [4])], outputs=[TensorConfig("logits", "TYPE_FP32", [3])],
                        dynamic_batching=DynamicBatching(0))
    text = render_ensemble(user_ensemble_config("csv_classifier", model, steps))
    assert text == (GOLDEN / "user_steps_ensemble.pbtxt").read_text()
    parsed = parse_config(text)
    assert [s.model_name for s in parsed.ensemble_scheduling.step] == [
        "csv_classifier__preprocess", "csv_classifier__model", "csv_classifier__postprocess"]
    assert [(i.name, i.data_type) for i in parsed.input] == [("csv", 13)]
    pre, post = (parse_config(render_config(c)) for c in user_step_configs("csv_classifier", model, steps))
    assert pre.parameters["function"].string_value == "parse" and pre.parameters["module"].string_value == "steps.py"
    assert [o.name for o in post.output] == ["label", "score"]
    assert reference_record({"a": np.array([b"x"], dtype=object)}, {}) != b""
