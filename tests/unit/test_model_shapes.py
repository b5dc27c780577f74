"""Shapes every model a user brings can have, without a server: a scalar per sample (Triton's
dims [1] + reshape []), the wire shape helpers, and the error class of a config the builder got wrong."""

from __future__ import annotations

import re

import numpy as np
import pytest

from builder.core.errors import InternalError, VerificationError
from builder.repository.config import ModelConfig, TensorConfig, config_as_dict, render_config
from builder.accuracy.tensors import from_wire, to_wire


def scalar_config(max_batch_size: int = 8) -> ModelConfig:
    return ModelConfig(name="argmax_cls", backend="onnxruntime_onnx", max_batch_size=max_batch_size,
                       inputs=[TensorConfig.per_sample("x", "TYPE_FP32", [6]),
                               TensorConfig.per_sample("temperature", "TYPE_FP32", [])],
                       outputs=[TensorConfig.per_sample("label", "TYPE_INT64", [])])


def test_scalar_per_sample_is_dims_1_with_empty_reshape_in_triton_schema():
    parsed = config_as_dict(render_config(scalar_config()))  # parsed with Triton's own protobuf schema
    label = parsed["output"][0]
    assert label["dims"] == ["1"] and "reshape" in label and not label["reshape"].get("shape")
    temperature = parsed["input"][1]
    assert temperature["dims"] == ["1"] and "reshape" in temperature
    assert "reshape" not in parsed["input"][0]


def test_an_invalid_generated_config_is_an_internal_error_not_a_verification_failure():
    with pytest.raises(InternalError, match=r"internal error \(a triton-builder bug.*tensor label: dims \[\] "
                                            r"must be non-empty") as caught:
        ModelConfig(name="m", backend="python", max_batch_size=4, inputs=[TensorConfig("x", "TYPE_FP32", [3])],
                    outputs=[TensorConfig("label", "TYPE_INT64", [])])
    assert not isinstance(caught.value, VerificationError) and caught.value.exit_code == 3


@pytest.mark.parametrize("batching", [True, False])
def test_wire_shapes_round_trip_scalars_and_leave_others_alone(batching):
    scalar = np.arange(3.0) if batching else np.float32(2.0)
    wired = to_wire(scalar, [1], batching)
    assert wired.shape == ((3, 1) if batching else (1,))
    assert from_wire(wired, scalar).shape == np.shape(scalar)
    matrix = np.zeros((3, 4))
    assert to_wire(matrix, [4], batching).shape == (3, 4)
    assert from_wire(np.zeros((2, 4)), np.zeros((3, 4))).shape == (2, 4)  # a real mismatch stays visible


# --- builds (no server): integer ids without data, data-dependent output dims, empty outputs ---

from builder.core.errors import UserInputError  # noqa: E402
from builder.pipeline import build  # noqa: E402
from builder.repository.config import config_as_dict as _parse  # noqa: E402
from tests.tiny_models import write_model  # noqa: E402


def _config(repo, name):
    return _parse((repo / name / "config.pbtxt").read_text())


@pytest.mark.slow(reason="builds a model")
def test_ids_beyond_the_vocabulary_are_probed_down_and_the_range_is_said(tmp_path, quiet):
    lines = []
    result = build(write_model(tmp_path, "embed"), tmp_path / "repo", variants=["onnx"], benchmark_seconds=0,
                   progress=lines.append)
    load = next(r for r in result.results if r.stage == "load")
    assert load.outputs["id_ranges"] == {"ids": [0, 50]}
    assert "generated ids in [0, 50)" in load.reason
    assert any("accepts [0, 50)" in line for line in lines)
    import yaml
    meta = yaml.safe_load((tmp_path / "repo" / "embed" / "1" / "metadata.yaml").read_text())
    assert meta["spec"]["inputs"][0]["value_range"] == [0, 50]


def test_ids_no_range_satisfies_name_value_range_and_validation_data(tmp_path, quiet):
    with pytest.raises(UserInputError, match=r"rejected every generated value of the integer input\(s\) ids.*index out of range in self.*"
                                             r"inputs\[\]\.value_range.*data\.validation"):
        build(write_model(tmp_path, "ids_never"), tmp_path / "repo", variants=["onnx"], benchmark_seconds=0,
              progress=quiet)


@pytest.mark.slow(reason="builds a model")
def test_data_dependent_output_length_is_dynamic_in_the_config(tmp_path, quiet):
    build(write_model(tmp_path, "detect"), tmp_path / "repo", benchmark_seconds=0, progress=quiet)
    assert _config(tmp_path / "repo", "detect")["output"][0]["dims"] == ["-1", "4"]


@pytest.mark.slow(reason="builds a model")
def test_a_length_every_sample_agrees_on_is_still_dynamic_when_the_graph_says_so(tmp_path, quiet):
    result = build(write_model(tmp_path, "detect_full"), tmp_path / "repo", variants=["onnx"],
                   benchmark_seconds=0, progress=quiet)
    export = next(r for r in result.results if r.stage == "export_onnx")
    assert export.outputs["symbolic_output_dims"] == {"boxes": [-1, 4]}
    assert _config(tmp_path / "repo", "detect_full")["output"][0]["dims"] == ["-1", "4"]


@pytest.mark.slow(reason="builds a model")
def test_verification_refuses_to_pass_on_empty_outputs(tmp_path, quiet):
    with pytest.raises(VerificationError, match=r"boxes: every case gave an EMPTY output \(0 values compared\).*"
                                                r"exercise nothing.*data\.validation"):
        build(write_model(tmp_path, "detect_empty"), tmp_path / "repo", variants=["onnx"], benchmark_seconds=0,
              progress=quiet)
    assert not (tmp_path / "repo" / "detect_empty").exists()


def test_nan_everywhere_in_the_reference_is_not_a_pass():
    from builder.accuracy.tensors import compare_outputs, merge_case_metrics, tolerance_failures
    ref = {"y": np.full((2, 3), np.nan)}
    for got in (np.zeros((2, 3)), np.full((2, 3), np.nan)):
        failures = tolerance_failures(merge_case_metrics([compare_outputs(ref, {"y": got})]), {"rel_l2": 1e-5})
        assert failures and "NaN/Inf everywhere (6 values), so nothing was verified" in failures[0]
    partial = {"y": np.array([np.nan, 1.0, 2.0])}
    same = merge_case_metrics([compare_outputs(partial, {"y": np.array([np.nan, 1.0, 2.0])})])
    assert not tolerance_failures(same, {"rel_l2": 1e-5}) and same["y"]["finite"] == 2
    wrong = merge_case_metrics([compare_outputs(partial, {"y": np.array([0.0, 1.0, 2.0])})])
    assert "NaN/Inf where the reference has them differ" in tolerance_failures(wrong, {"rel_l2": 1e-5})[0]


def test_a_sign_flipped_output_fails_by_rel_l2_without_a_min_cosine_set():
    # its cosine rounds to just below -1: a missing min_cosine must not be looked up (it was a KeyError)
    from builder.accuracy.tensors import compare_outputs, merge_case_metrics, tolerance_failures
    flipped = []
    for seed in range(200):
        ref = {"y": np.random.RandomState(seed).rand(8, 3).astype(np.float32) - 0.3}
        metrics = merge_case_metrics([compare_outputs(ref, {"y": -ref["y"]})])
        if metrics["y"]["cosine"] < -1.0:
            flipped.append(tolerance_failures(metrics, {"rel_l2": 1e-5}))
    assert flipped, "no seed rounded the cosine below -1"
    assert all(len(f) == 1 and re.match(r"y: rel L2 2\.0e\+00 > 1e-05", f[0]) for f in flipped)


def test_a_model_factory_that_raises_is_a_user_error_naming_the_module(tmp_path, quiet):
    spec = write_model(tmp_path, "embed")
    (spec.parent / "model.py").write_text("def build():\n    raise IndexError('list index out of range')\n")
    with pytest.raises(UserInputError, match=r"field 'source.module': model:build\(\) raised IndexError: list index "
                                             r"out of range; fix the model factory in model.py"):
        build(spec, tmp_path / "repo", variants=["onnx"], benchmark_seconds=0, progress=quiet)


def test_outputs_that_ignore_the_inputs_are_not_a_pass():
    from builder.accuracy.tensors import compare_outputs, merge_case_metrics, tolerance_failures
    cases = [compare_outputs({"logits": np.zeros((b, 10))}, {"logits": np.zeros((b, 10))}) for b in (1, 3)]
    failures = tolerance_failures(merge_case_metrics(cases), {"rel_l2": 1e-5})
    assert len(failures) == 1 and re.search(r"logits: the reference is 0 for every input of every case \(40 values\)"
                                            r": the output does not depend on the inputs.*data\.validation",
                                            failures[0])
    # one constant output beside a live one is compared like any other
    live = [compare_outputs({"a": np.ones(3), "b": np.arange(3.0)}, {"a": np.ones(3), "b": np.arange(3.0)})]
    assert not tolerance_failures(merge_case_metrics(live), {"rel_l2": 1e-5})


def test_a_batched_model_whose_output_length_depends_on_the_data_is_refused_naming_max_batch_size(tmp_path, quiet):
    """Detections of the whole batch concatenated ([rows, 4], rows != batch) used to publish with dims [ 4 ]
    and dynamic batching: Triton would split the answer at the wrong places."""
    with pytest.raises(UserInputError, match=r"field 'max_batch_size': output 'boxes' has \d+ rows for a batch of \d+.*"
                                             r"first dimension of every output must be the batch.*"
                                             r"set max_batch_size: 0"):
        build(write_model(tmp_path, "detect", max_batch_size=8), tmp_path / "repo", variants=["onnx"],
              benchmark_seconds=0, progress=quiet)
    assert not (tmp_path / "repo" / "detect").exists()


@pytest.mark.slow(reason="builds a model")
def test_a_fixed_output_dim_the_exported_graph_declares_is_made_symbolic_when_the_runs_vary_it(tmp_path, quiet):
    """Dynamo declares an nn.LSTM tagger's output at the example's sequence length ([batch, 6, 5]) although
    the graph computes any length: the file, its metadata and the config must agree on [-1, 5]."""
    import onnx
    build(write_model(tmp_path, "tagger"), tmp_path / "repo", variants=["onnx"], benchmark_seconds=0, progress=quiet)
    assert _config(tmp_path / "repo", "tagger")["output"][0]["dims"] == ["-1", "5"]
    model = onnx.load(str(tmp_path / "repo" / "tagger" / "1" / "model.onnx"), load_external_data=False)
    dims = model.graph.output[0].type.tensor_type.shape.dim
    assert [d.HasField("dim_param") for d in dims] == [True, True, False] and dims[2].dim_value == 5
