"""Inputs and outputs reach the model the way the spec names them, or the build refuses: inputs are
passed to forward() by position, so a spec naming forward()'s parameters in another order, more inputs
than forward() takes or fewer than it requires is refused; a dict's keys named in another order, or a
spec listing fewer outputs than the model returns (nested tuples count each tensor), too. ONNX sources:
a fixed batch dimension under max_batch_size > 0 names max_batch_size; tensor names with '.' and ':'
(the legacy exporter's 'input.1', tf2onnx's 'x:0') build, serve and answer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from builder.core.errors import UserInputError
from builder.pipeline import build
from builder.repository.config import config_as_dict
from builder.repository.metadata import read_reference
from tests.unit.test_build_errors import assert_nothing_written

TWO_INPUTS = '''
import torch
class M(torch.nn.Module):
    def forward(self, query, key):
        return query - 2 * key
'''

DICT_OUT = '''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.fc = torch.nn.Linear(16, 8)
    def forward(self, x):
        h = self.fc(x)
        return {"a": h, "b": torch.tanh(h).sum(-1, keepdim=True)}
'''

NESTED_OUT = '''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.fc = torch.nn.Linear(16, 8)
    def forward(self, x):
        h = self.fc(x)
        return (h, torch.sigmoid(h[:, :3])), h.sum(-1, keepdim=True)
'''


def write_spec(root, source: str, inputs, outputs, name: str = "bound", **extra):
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(source.lstrip() + "\n\ndef build():\n    return M().eval()\n")
    spec = {"name": name, "source": {"module": "model:build"}, "inputs": inputs, "outputs": outputs,
            "max_batch_size": 8, "variants": ["onnx", "torchscript"], **extra}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder / "spec.yaml"


def vector(name: str, size: int = 8) -> dict:
    return {"name": name, "dtype": "float32", "shape": [size]}


def test_inputs_named_in_another_order_than_forward_are_refused(tmp_path, quiet):
    spec = write_spec(tmp_path, TWO_INPUTS, [vector("key"), vector("query")], [{"name": "out"}])
    with pytest.raises(UserInputError, match=r"field 'inputs': 'key' is argument 2 of M\.forward\(query, key\) but "
                                             r"input 1 of the spec.*list them in its order \(query, key\)"):
        build(spec, tmp_path / "repo", progress=quiet)
    assert_nothing_written(tmp_path, tmp_path / "repo")


def test_inputs_in_forward_order_reach_their_parameters(tmp_path, quiet):
    spec = write_spec(tmp_path, TWO_INPUTS, [vector("query"), vector("key")], [{"name": "out"}])
    result = build(spec, tmp_path / "repo", benchmark_seconds=0, progress=quiet)
    assert result.published
    cases, outputs = read_reference(tmp_path / "repo" / "bound" / "1" / "reference.npz")
    assert cases
    for case, produced in zip(cases, outputs):
        np.testing.assert_allclose(produced["out"], case["inputs"]["query"] - 2 * case["inputs"]["key"])


def test_more_inputs_than_forward_takes_and_fewer_than_it_requires(tmp_path, quiet):
    spec = write_spec(tmp_path, TWO_INPUTS, [vector("query"), vector("key"), vector("mask")], [{"name": "out"}])
    with pytest.raises(UserInputError, match=r"lists 3 inputs \(query, key, mask\) but M\.forward\(query, key\) "
                                             r"takes 2; list one input per forward\(\) argument"):
        build(spec, tmp_path / "repo", progress=quiet)
    spec = write_spec(tmp_path, TWO_INPUTS, [vector("query")], [{"name": "out"}])
    with pytest.raises(UserInputError, match=r"lists 1 input\(s\) \(query\) but M\.forward\(query, key\) requires 2"):
        build(spec, tmp_path / "repo", progress=quiet)
    assert_nothing_written(tmp_path, tmp_path / "repo")


def test_torchscript_source_is_checked_by_its_schema(tmp_path, quiet):
    scripted = torch.jit.trace(_TwoInputs().eval(), (torch.ones(2, 8), torch.ones(2, 8)))
    folder = tmp_path / "ts"
    folder.mkdir()
    torch.jit.save(scripted, str(folder / "model.pt"))
    spec = {"name": "ts", "source": {"torchscript": "model.pt"}, "inputs": [vector("key"), vector("query")],
            "outputs": [{"name": "out"}], "max_batch_size": 8}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(UserInputError, match=r"'key' is argument 2 of .*forward\(query, key\)"):
        build(folder / "spec.yaml", tmp_path / "repo", progress=quiet)


class _TwoInputs(torch.nn.Module):
    def forward(self, query, key):
        return query - 2 * key


def test_dict_outputs_named_in_another_order_are_refused(tmp_path, quiet):
    spec = write_spec(tmp_path, DICT_OUT, [vector("x", 16)], [{"name": "b"}, {"name": "a"}])
    with pytest.raises(UserInputError, match=r"field 'outputs': the model returns a dict with keys a, b \(in this "
                                             r"order\), the spec lists b, a.*outputs: \[\{name: a\}, \{name: b\}\]"):
        build(spec, tmp_path / "repo", progress=quiet)
    assert_nothing_written(tmp_path, tmp_path / "repo")


@pytest.mark.slow(reason="builds a model")
def test_dict_outputs_in_key_order_keep_their_shapes(tmp_path, quiet):
    spec = write_spec(tmp_path, DICT_OUT, [vector("x", 16)], [{"name": "a"}, {"name": "b"}])
    build(spec, tmp_path / "repo", benchmark_seconds=0, progress=quiet)
    config = config_as_dict((tmp_path / "repo" / "bound" / "config.pbtxt").read_text())
    dims = {o["name"]: [int(d) for d in o["dims"]] for o in config["output"]}
    assert dims == {"a": [8], "b": [1]}


def test_fewer_outputs_than_the_model_returns_is_a_spec_error(tmp_path, quiet):
    spec = write_spec(tmp_path, NESTED_OUT, [vector("x", 16)], [{"name": "feat"}, {"name": "sig"}])
    with pytest.raises(UserInputError, match=r"field 'outputs': the spec lists 2 output\(s\) \(feat, sig\) but the "
                                             r"model returns 3 tensor\(s\) \(nested tuples and dicts count each"):
        build(spec, tmp_path / "repo", progress=quiet)
    assert_nothing_written(tmp_path, tmp_path / "repo")


def _onnx_source(tmp_path, dynamic: bool, input_name: str = "x", output_name: str = "y"):
    folder = tmp_path / "onnx_source"
    folder.mkdir(exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    torch.onnx.export(model, (torch.randn(1, 16),), str(folder / "model.onnx"), input_names=[input_name],
                      output_names=[output_name], dynamo=False,
                      dynamic_axes={input_name: {0: "batch"}, output_name: {0: "batch"}} if dynamic else None)
    spec = {"name": "from_onnx", "source": {"onnx": "model.onnx"},
            "inputs": [{"name": input_name, "dtype": "float32", "shape": [16]}],
            "outputs": [{"name": output_name}], "max_batch_size": 8}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    return folder / "spec.yaml"


def test_onnx_source_with_a_fixed_batch_dimension_names_max_batch_size(tmp_path, quiet):
    spec = _onnx_source(tmp_path, dynamic=False)
    with pytest.raises(UserInputError, match=r"field 'max_batch_size': input 'x' of model\.onnx has a fixed first "
                                             r"dimension 1 .*dynamic batch axis.*or set max_batch_size: 0"):
        build(spec, tmp_path / "repo", progress=quiet)
    assert_nothing_written(tmp_path, tmp_path / "repo")


def test_tensor_names_with_dots_and_colons_build(tmp_path, quiet):
    spec = _onnx_source(tmp_path, dynamic=True, input_name="input.1", output_name="logits:0")
    build(spec, tmp_path / "repo", benchmark_seconds=0, progress=quiet)
    config = config_as_dict((tmp_path / "repo" / "from_onnx" / "config.pbtxt").read_text())
    assert [i["name"] for i in config["input"]] == ["input.1"]
    assert [o["name"] for o in config["output"]] == ["logits:0"]


@pytest.mark.parametrize("bad", ["a/b", "x y", 'q"', ".hidden", "logits\n"])
def test_tensor_names_with_paths_quotes_or_spaces_are_refused(tmp_path, quiet, bad):
    spec = write_spec(tmp_path, TWO_INPUTS, [vector("query"), vector("key")], [{"name": bad}])
    with pytest.raises(UserInputError, match=r"field 'outputs\[0\]\.name'.*not a valid tensor name"):
        build(spec, tmp_path / "repo", progress=quiet)
