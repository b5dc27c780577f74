"""What verification covers: every validation sample (not only the few reference.npz holds), every
batch size even with a small validation set, and integer/bool outputs compared exactly."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from builder.spec.model import load_spec
from builder.stages import load
from builder.stages.base import BuildContext, BuildOptions, Variant
from builder.accuracy.verification import verify_variant
from builder.accuracy.tensors import build_cases, compare_outputs, merge_case_metrics, tolerance_failures

DOUBLE = '''
import torch
class M(torch.nn.Module):
    def forward(self, x):
        return x * 2.0

def build():
    return M()
'''


def _spec(tmp_path: Path, validation: np.ndarray) -> Path:
    (tmp_path / "model.py").write_text(DOUBLE)
    np.savez(tmp_path / "val.npz", x=validation)
    spec = {"name": "double", "source": {"module": "model:build"}, "max_batch_size": 8,
            "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}], "outputs": [{"name": "y"}],
            "data": {"validation": "val.npz"}, "variants": ["onnx"]}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    return tmp_path / "spec.yaml"


def _clipped_double(path: Path) -> Path:
    """y = clip(2x, -6, 6): equal to the reference while |x| <= 3, wrong beyond."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["d"]), helper.make_node("Clip", ["d", "lo", "hi"], ["y"])]
    consts = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
              helper.make_tensor("lo", TensorProto.FLOAT, [], [-6.0]),
              helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])]
    graph = helper.make_graph(nodes, "clipped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what the Triton release gate accepts
    onnx.save(model, path)
    return path


def _loaded(spec_path: Path, tmp_path: Path) -> BuildContext:
    ctx = BuildContext(spec=load_spec(spec_path), options=BuildOptions(repository=tmp_path / "repo"),
                       workdir=tmp_path, progress=lambda m: None)
    assert load.run(ctx).status.name == "OK"
    return ctx


def _variant(tmp_path: Path) -> Variant:
    return Variant(name="onnx", format="onnx", precision="fp32", path=_clipped_double(tmp_path / "clipped.onnx"))


def test_a_variant_wrong_only_beyond_the_cases_fails_on_the_whole_validation_set(tmp_path):
    rng = np.random.default_rng(0)
    small = rng.uniform(-1, 1, (12, 4)).astype(np.float32)
    large = rng.uniform(10, 50, (52, 4)).astype(np.float32)  # never in the cases: they take 1 + 3 + 8 samples
    ctx = _loaded(_spec(tmp_path, np.concatenate([small, large])), tmp_path)
    cases = sum(len(c["inputs"]["x"]) for c in ctx.reference.cases)
    assert cases == 12  # the cases alone would pass this variant

    failures = verify_variant(ctx, _variant(tmp_path))

    assert len(failures) == 1
    assert failures[0].startswith("y: rel L2") and failures[0].endswith("on all 64 samples of data.validation")
    assert _variant_verification(ctx, tmp_path)["validation"]["samples"] == 64


def _variant_verification(ctx, tmp_path):
    variant = _variant(tmp_path)
    verify_variant(ctx, variant)
    return variant.verification


def test_the_same_variant_passes_where_every_validation_sample_is_in_its_range(tmp_path):
    values = np.random.default_rng(1).uniform(-2, 2, (64, 4)).astype(np.float32)
    ctx = _loaded(_spec(tmp_path, values), tmp_path)
    assert verify_variant(ctx, _variant(tmp_path)) == []


def test_a_small_validation_set_still_runs_every_batch_size(tmp_path):
    spec = load_spec(_spec(tmp_path, np.ones((1, 4), np.float32)))
    cases = build_cases(spec, {"x": np.arange(4, dtype=np.float32).reshape(1, 4)})
    assert [c["id"] for c in cases] == ["val_b1", "val_b3", "val_b8"]
    assert [len(c["inputs"]["x"]) for c in cases] == [1, 3, 8]


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_integer_and_bool_outputs_are_compared_exactly(dtype):
    ref = {"cls": np.array([3, 1, 0, 2, 1, 0, 1, 1], dtype=dtype)}
    got = {"cls": ref["cls"].copy()}
    got["cls"][0] = 4 if dtype is not np.bool_ else False  # one value of eight differs
    metrics = compare_outputs(ref, got)

    failures = tolerance_failures(metrics, {"rel_l2": 0.1, "max_mismatch": 0.0})
    assert len(failures) == 1
    assert failures[0].startswith("cls: 1 of 8 values differ (12.5% > max_mismatch 0.0%; integer/bool outputs")

    assert tolerance_failures(metrics, {"rel_l2": 0.1, "max_mismatch": 0.2}) == []
    # a version recorded before max_mismatch existed: exact
    assert tolerance_failures(metrics, {"rel_l2": 10.0}) != []


def test_mismatches_add_up_over_cases():
    ref = np.arange(10, dtype=np.int64)
    one_off = ref.copy()
    one_off[0] += 1
    merged = merge_case_metrics([compare_outputs({"ids": ref}, {"ids": one_off}),
                                 compare_outputs({"ids": ref}, {"ids": one_off})])
    assert merged["ids"]["mismatched"] == 2 and merged["ids"]["compared"] == 20
    assert tolerance_failures(merged, {"max_mismatch": 0.1}) == []
    assert tolerance_failures(merged, {"max_mismatch": 0.05})[0].startswith("ids: 2 of 20 values differ (10.0%")


def test_float_outputs_keep_their_rel_l2_rule():
    ref = {"y": np.array([1.0, 2.0, 3.0], np.float32)}
    metrics = compare_outputs(ref, {"y": np.array([1.0, 2.0, 3.3], np.float32)})
    assert "integer" not in metrics["y"]
    assert tolerance_failures(metrics, {"rel_l2": 1e-5, "max_mismatch": 1.0})[0].startswith("y: rel L2")


def test_max_mismatch_is_a_share(tmp_path):
    from builder.core.errors import UserInputError

    spec_path = _spec(tmp_path, np.ones((4, 4), np.float32))
    data = yaml.safe_load(spec_path.read_text())
    data["verify"] = {"tolerances": {"int8": {"max_mismatch": 5}}}
    spec_path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserInputError, match=r"verify.tolerances.int8.*max_mismatch.*share of the values \(0 to 1"):
        load_spec(spec_path)


def _clipped_double_dynamic(path: Path) -> Path:
    """y = clip(2x, -6, 6) over a dynamic length: right while |x| <= 3."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["d"]), helper.make_node("Clip", ["d", "lo", "hi"], ["y"])]
    consts = [helper.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in (("two", 2.0), ("lo", -6.0), ("hi", 6.0))]
    graph = helper.make_graph(nodes, "clipped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "L"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "L"])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("validation_values, generated, expected", [
    # right on the user's data, wrong only on generated cases (values the data never had)
    ((-1, 1), [10, 20], r"cases: fails only on generated cases gen_b1_dmin \(x \[1, 1\]\), .*; it passes on the "
                        r"data\.validation cases \(val_b1, val_b3, val_b8\): it differs at sizes or values the data "
                        r"never had"),
    # wrong on the user's data: said as such, the validation cases first
    ((10, 20), [-1, 1], r"cases: fails on val_b1 \(x \[1, 4\]\), val_b3 \(x \[3, 4\]\), val_b8 \(x \[8, 4\]\)$"),
])
def test_a_failure_names_its_cases_and_sizes_and_whether_the_data_passes(tmp_path, validation_values, generated,
                                                                         expected):
    (tmp_path / "model.py").write_text(DOUBLE)
    np.savez(tmp_path / "val.npz", x=np.random.default_rng(0).uniform(*validation_values, (16, 4)).astype(np.float32))
    spec = {"name": "double", "source": {"module": "model:build"}, "max_batch_size": 8, "variants": ["onnx"],
            "inputs": [{"name": "x", "dtype": "float32", "shape": [-1], "min_shape": [1], "opt_shape": [4],
                        "max_shape": [8], "value_range": generated}],
            "outputs": [{"name": "y"}], "data": {"validation": "val.npz"}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    ctx = _loaded(tmp_path / "spec.yaml", tmp_path)
    variant = Variant(name="onnx", format="onnx", precision="fp32", path=_clipped_double_dynamic(tmp_path / "c.onnx"))
    failures = verify_variant(ctx, variant)
    assert failures[0].startswith("y: rel L2") and re.search(expected, failures[1]), failures
    assert variant.verification["failing_cases"][0]["shapes"]["x"] in ([1, 1], [1, 4])
