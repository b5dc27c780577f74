"""The spec contract: every mistake names the field and the fix."""

from __future__ import annotations

import re

import pytest
import yaml

from builder.core.errors import UserInputError
from builder.spec.model import load_spec, parse_spec

BASE = {
    "name": "m",
    "source": {"module": "model:build"},
    "inputs": [{"name": "x", "dtype": "float32", "shape": [3]}],
    "outputs": [{"name": "y"}],
    "max_batch_size": 8,
}


def spec_with(**changes):
    data = {**BASE, **changes}
    return {k: v for k, v in data.items() if v is not None}


def test_valid_spec_parses_with_defaults(tmp_path):
    spec = parse_spec(spec_with(), tmp_path / "spec.yaml")
    assert spec.name == "m" and spec.max_batch_size == 8
    assert spec.deploy.target == "cpu" and spec.deploy.dynamic_batching is True
    assert spec.verify.tolerance("fp32") == {"rel_l2": 1e-5, "max_mismatch": 0.0}
    assert spec.inputs[0].triton_dtype == "TYPE_FP32"


def test_example_specs_load():
    from tests.conftest import EXAMPLES
    for path in EXAMPLES.glob("*/spec.yaml"):
        spec = load_spec(path)
        assert spec.source.weights is None or spec.source.weights.is_file()


@pytest.mark.parametrize("name", ["../x", 'a"b', "a b", "", "x/y", "a" * 129, 5, "digits_nl\n"])
def test_bad_model_names_are_refused(name):
    with pytest.raises(UserInputError, match=r"field 'name'.*letters, digits, '_' and '-'"):
        parse_spec(spec_with(name=name))


def test_unknown_top_level_key_lists_known_ones():
    with pytest.raises(UserInputError, match=r"unknown key\(s\) 'colour'; known keys: name, version, source"):
        parse_spec(spec_with(colour="red"))


def test_unknown_nested_key_names_its_path():
    with pytest.raises(UserInputError, match=r"field 'inputs\[0\]': unknown key\(s\) 'shpe'"):
        parse_spec(spec_with(inputs=[{"name": "x", "shpe": [3]}]))


def test_missing_required_key():
    with pytest.raises(UserInputError, match=r"field 'inputs': missing"):
        parse_spec(spec_with(inputs=None))


def test_bad_dtype_lists_supported():
    with pytest.raises(UserInputError, match=r"field 'inputs\[0\].dtype': 'complex64' is not supported; use one of: float32"):
        parse_spec(spec_with(inputs=[{"name": "x", "dtype": "complex64", "shape": [3]}]))


def test_source_needs_exactly_one_kind():
    with pytest.raises(UserInputError, match=r"field 'source': give exactly one of module / torchscript / onnx / huggingface \(got module, onnx\)"):
        parse_spec(spec_with(source={"module": "m:b", "onnx": "x.onnx"}))


def test_missing_weights_file_names_the_path(tmp_path):
    with pytest.raises(UserInputError, match=r"field 'source.weights': file not found: .*nope.safetensors"):
        parse_spec(spec_with(source={"module": "model:build", "weights": "nope.safetensors"}), tmp_path / "s.yaml")


def test_shape_rejects_zero_and_batch_like_values():
    with pytest.raises(UserInputError, match=r"field 'inputs\[0\].shape': every entry must be >= 1 or -1"):
        parse_spec(spec_with(inputs=[{"name": "x", "shape": [0, 3]}]))


def test_preferred_batch_sizes_within_max():
    with pytest.raises(UserInputError, match=r"field 'deploy.preferred_batch_sizes'.*<= max_batch_size \(8\)"):
        parse_spec(spec_with(deploy={"preferred_batch_sizes": [4, 16]}))


def test_dynamic_batching_needs_batch_dimension():
    with pytest.raises(UserInputError, match=r"deploy.dynamic_batching': needs max_batch_size > 0"):
        parse_spec(spec_with(max_batch_size=0, deploy={"dynamic_batching": True}))


def test_unknown_tolerance_precision():
    with pytest.raises(UserInputError, match=r"unknown precision 'fp8'; known: fp32, fp16, int8"):
        parse_spec(spec_with(verify={"tolerances": {"fp8": {"rel_l2": 1}}}))


@pytest.mark.parametrize("changes, field", [
    ({"verify": {"tolerances": {"int8": {"rel_l2": float("nan")}}}}, "verify.tolerances.int8.rel_l2"),
    ({"verify": {"max_accuracy_drop": float("nan")}}, "verify.max_accuracy_drop"),
    ({"quantization": {"search_seconds": float("inf")}}, "quantization.search_seconds"),
    ({"objective": {"beta": float("nan")}}, "objective.beta"),
    ({"compression": {"prune_ratio": float("nan")}}, "compression.prune_ratio"),
    ({"inputs": [{"name": "x", "dtype": "float32", "shape": [3], "value_range": [0, float("inf")]}]},
     "inputs[0].value_range"),
])
def test_nan_and_inf_are_refused_where_a_number_is_compared(changes, field):
    # YAML's .nan passes `value < 0` and every later comparison: a NaN tolerance would verify anything
    with pytest.raises(UserInputError, match=rf"field '{re.escape(field)}': must be .*finite"):
        parse_spec(spec_with(**changes))


def test_duplicate_tensor_names():
    with pytest.raises(UserInputError, match=r"used more than once.*: x"):
        parse_spec(spec_with(outputs=[{"name": "x"}]))


def test_bad_yaml_names_line(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("name: m\ninputs: [\n")
    with pytest.raises(UserInputError, match=r"spec.yaml: not valid YAML at line \d+"):
        load_spec(path)


def test_spec_file_must_be_a_mapping(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(["a", "b"]))
    with pytest.raises(UserInputError, match=r"must be a mapping"):
        load_spec(path)


def test_profile_shapes_replace_dynamic_dims():
    spec = parse_spec(spec_with(inputs=[{"name": "ids", "dtype": "int64", "shape": [-1], "max_shape": [32]}]))
    shapes = spec.inputs[0].profile_shapes()
    assert shapes == {"min": [1], "opt": [16], "max": [32]}


def test_profile_shape_must_fit_fixed_dims():
    with pytest.raises(UserInputError, match=r"max_shape': \[4, 32\] does not fit shape \[3, -1\]"):
        parse_spec(spec_with(inputs=[{"name": "x", "shape": [3, -1], "max_shape": [4, 32]}]))


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    path = tmp_path / "spec.yaml"
    text = yaml.safe_dump(spec_with(), sort_keys=False)
    path.write_text(text + "max_batch_size: 4\n")
    first = 1 + text.splitlines().index("max_batch_size: 8")
    last = 1 + len(text.splitlines())
    with pytest.raises(UserInputError, match=rf"spec.yaml: key 'max_batch_size' is given twice in one mapping "
                                             rf"\(lines {first} and {last}\); YAML keeps only the last, so remove one"):
        load_spec(path)
    path.write_text(text + "deploy:\n  target: cpu\n  instances: 1\n  target: gpu\n")  # at any depth
    with pytest.raises(UserInputError, match=rf"key 'target' is given twice in one mapping \(lines {last + 1} "
                                             rf"and {last + 3}\)"):
        load_spec(path)


@pytest.mark.parametrize("text", ["", "# nothing yet\n"])
def test_an_empty_spec_file_is_said_to_be_empty(tmp_path, text):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(UserInputError, match=r"^spec.yaml is empty: write the model spec in it"):
        load_spec(path)


def test_unknown_keys_of_every_section_are_reported_together():
    raw = spec_with(deploy={"target": "embedded", "instance": 2}, verify={"tolerances": {"fp32": {"rel_l3": 1e-5}}},
                    colour="red")
    with pytest.raises(UserInputError, match=r"spec: unknown keys in 3 places:\n"
                                             r"- field '\(top level\)': unknown key\(s\) 'colour'; known keys: name.*\n"
                                             r"- field 'verify.tolerances.fp32': unknown key\(s\) 'rel_l3'; known .*\n"
                                             r"- field 'deploy': unknown key\(s\) 'instance'; known keys: target"):
        parse_spec(raw)
