"""Generated cases hold inputs the model could really get (builder/accuracy/input_rules.py): the rule per input
comes from the spec (values, kind, value_range), else the data, else transformers' names, else the
old default; stage load records which, and `init` writes a name's rule into the draft."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import yaml

from builder.core.errors import UserInputError
from builder.accuracy.input_rules import from_data, rule_for
from builder.scaffold.init import init_spec
from builder.spec.model import TensorSpec, load_spec, parse_spec
from builder.stages import load
from builder.stages.base import BuildContext, BuildOptions
from builder.accuracy.tensors import build_cases

SEQ = {"shape": [-1], "min_shape": [1], "opt_shape": [6], "max_shape": [12]}


def spec_of(*inputs: dict, **extra):
    return parse_spec({"name": "m", "source": {"module": "model:build"}, "inputs": list(inputs),
                       "outputs": [{"name": "y"}], "max_batch_size": 8, **extra})


def assert_padding_mask(mask: np.ndarray) -> None:
    rows = mask.reshape(-1, mask.shape[-1]).astype(np.int64)
    assert set(np.unique(rows)) <= {0, 1}
    assert (rows[:, 0] == 1).all(), "a row of padding only"
    assert (np.diff(rows, axis=1) <= 0).all(), "ones, then zeros"


# ---------------------------------------------------------------------------------------------------------
# the spec


def test_values_from_the_spec_are_the_only_values_generated():
    spec = spec_of({"name": "flag", "dtype": "int64", "values": [0, 1], **SEQ})
    cases = build_cases(spec, None)
    assert set(np.unique(np.concatenate([c["inputs"]["flag"].ravel() for c in cases]))) == {0, 1}
    assert rule_for(spec.inputs[0]).describe() == "one of 2 values (0, 1) (spec)"


def test_a_padding_mask_from_the_spec_has_a_real_token_in_every_row_at_every_size():
    spec = spec_of({"name": "ids", "dtype": "int64", **SEQ}, {"name": "m", "dtype": "int64", "kind": "padding_mask", **SEQ})
    cases = build_cases(spec, None)
    for case in cases:
        assert_padding_mask(case["inputs"]["m"])
    at_min = [c for c in cases if c["id"].endswith("_dmin")]
    assert at_min and all((c["inputs"]["m"] == 1).all() for c in at_min)  # one token: never padding only
    assert any((c["inputs"]["m"] == 0).any() for c in cases)  # padding is exercised elsewhere


@pytest.mark.parametrize("change, message", [
    ({"value_range": [0, 2], "values": [0, 1]},
     r"field 'inputs\[0\]\.values': value_range and values both say which values the input holds; give one of them"),
    ({"values": [0, 1], "kind": "padding_mask"}, r"field 'inputs\[0\]\.kind': values and kind both say"),
    ({"kind": "mask"}, r"field 'inputs\[0\]\.kind': 'mask' is not supported; use one of: padding_mask, segments, "
                       r"positions"),
    ({"values": []}, r"field 'inputs\[0\]\.values': must be a non-empty list of numbers"),
    ({"values": [0, 300], "dtype": "int8"}, r"field 'inputs\[0\]\.values': \[300\] do not fit int8"),
    ({"values": [0.5], "dtype": "int64"}, r"field 'inputs\[0\]\.values': \[0\.5\] do not fit int64"),
    ({"kind": "segments", "dtype": "float32"}, r"field 'inputs\[0\]\.kind': segments holds integer ids, and the "
                                               r"input is float32; give an integer dtype"),
    ({"kind": "padding_mask", "shape": []}, r"field 'inputs\[0\]\.kind': padding_mask runs along the last axis, "
                                            r"and the input has shape \[\]"),
])
def test_a_rule_the_spec_cannot_hold_names_the_field_and_the_fix(change, message):
    with pytest.raises(UserInputError, match=message):
        spec_of({"name": "x", "dtype": "int64", "shape": [4], **change})


# ---------------------------------------------------------------------------------------------------------
# transformers' names


@pytest.mark.parametrize("name, dtype, kind", [
    ("attention_mask", "int64", "padding_mask"), ("decoder_attention_mask", "int64", "padding_mask"),
    ("encoder_attention_mask", "int32", "padding_mask"), ("pixel_mask", "bool", "padding_mask"),
    ("attention_mask", "float32", "padding_mask"), ("token_type_ids", "int64", "segments"),
    ("position_ids", "int64", "positions"), ("decoder_position_ids", "int64", "positions"),
    ("input_ids", "int64", "range"), ("decoder_input_ids", "int64", "range"),
    ("token_type_ids", "float32", "normal"),  # a float is not token types: the name does not fit
])
def test_transformers_names_give_their_rule_when_nothing_else_does(name, dtype, kind):
    rule = rule_for(TensorSpec(name=name, dtype=dtype, shape=[-1]))
    assert rule.kind == kind
    assert rule.source == ("transformers name" if kind not in ("range", "normal") else "default")


def test_named_inputs_are_generated_as_a_tokenizer_makes_them():
    spec = spec_of({"name": "input_ids", "dtype": "int64", **SEQ}, {"name": "attention_mask", "dtype": "int64", **SEQ},
                   {"name": "token_type_ids", "dtype": "int64", **SEQ}, {"name": "position_ids", "dtype": "int64", **SEQ})
    for case in build_cases(spec, None):
        feeds = case["inputs"]
        assert_padding_mask(feeds["attention_mask"])
        types = feeds["token_type_ids"].reshape(-1, feeds["token_type_ids"].shape[-1])
        assert set(np.unique(types)) <= {0, 1} and (np.diff(types, axis=1) >= 0).all()
        width = feeds["position_ids"].shape[-1]
        assert (feeds["position_ids"] == np.arange(width)).all()
        assert feeds["input_ids"].min() >= 0 and feeds["input_ids"].max() < 100
    assert rule_for(spec.inputs[1]).describe() == ("padding mask: ones, then zero padding, never a row of padding only "
                                                   "(transformers name)")


# ---------------------------------------------------------------------------------------------------------
# the data, and precedence


def test_the_data_gives_integer_inputs_the_values_and_patterns_seen_there():
    spec = spec_of({"name": "ids", "dtype": "int64", **SEQ}, {"name": "flag", "dtype": "int64", "shape": [3]},
                   {"name": "mask", "dtype": "int64", **SEQ}, {"name": "pos", "dtype": "int64", **SEQ},
                   {"name": "x", "dtype": "float32", "shape": [2]})
    data = {"ids": np.array([[101, 7, 102, 0], [101, 9, 9, 102]]), "flag": np.array([[0, 1, 1], [1, 0, 0]]),
            "mask": np.array([[1, 1, 1, 0], [1, 1, 1, 1]]), "pos": np.array([[0, 1, 2, 3], [0, 1, 2, 3]]),
            "x": np.zeros((2, 2), np.float32)}
    from_data(spec.inputs, [("data.validation", data)])
    ids, flag, mask, pos, x = (rule_for(t) for t in spec.inputs)
    assert (ids.kind, ids.values, ids.source) == ("values", (0, 7, 9, 101, 102), "data.validation")
    assert (flag.kind, flag.values) == ("values", (0, 1))  # a 0/1 input stays 0/1
    assert (mask.kind, mask.source) == ("padding_mask", "data.validation")
    assert pos.kind == "positions"
    assert (x.kind, x.source) == ("normal", "default")  # floats: the data says nothing the generator keeps
    generated = build_cases(spec, None)
    assert set(np.unique(np.concatenate([c["inputs"]["ids"].ravel() for c in generated]))) <= {0, 7, 9, 101, 102}


def test_the_spec_wins_over_the_data_and_the_data_over_the_name():
    spec = spec_of({"name": "attention_mask", "dtype": "int64", "value_range": [1, 2], **SEQ},
                   {"name": "token_type_ids", "dtype": "int64", **SEQ})
    from_data(spec.inputs, [("data.validation", {"attention_mask": np.array([[1, 0]]),
                                                  "token_type_ids": np.array([[0, 0]])})])
    mask, types = (rule_for(t) for t in spec.inputs)
    assert (mask.kind, mask.low, mask.high, mask.source) == ("range", 1, 2, "spec")
    assert (types.kind, types.values, types.source) == ("values", (0,), "data.validation")


def test_a_mask_of_ones_only_in_the_data_stays_ones_and_calibration_data_counts_too():
    spec = spec_of({"name": "attention_mask", "dtype": "int64", **SEQ})
    from_data(spec.inputs, [("data.validation", {"attention_mask": np.ones((2, 3), np.int64)}),
                            ("data.calibration", {"attention_mask": np.ones((4, 5), np.int64)})])
    rule = rule_for(spec.inputs[0])
    assert (rule.kind, rule.values, rule.source) == ("values", (1,), "data.validation and data.calibration")


# ---------------------------------------------------------------------------------------------------------
# stage load records the rules; init writes them


ENCODER = """
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.emb = torch.nn.Embedding(16, 4)
    def forward(self, input_ids, attention_mask):
        m = attention_mask.unsqueeze(-1).float()
        return (self.emb(input_ids) * m).sum(1) / m.sum(1)   # a row of padding only: 0/0
def build():
    return M()
"""


def encoder_folder(tmp_path, **extra):
    folder = tmp_path / "enc"
    folder.mkdir()
    (folder / "model.py").write_text(textwrap.dedent(ENCODER))
    data = {"name": "enc", "source": {"module": "model:build"}, "max_batch_size": 4, "variants": ["onnx"],
            "inputs": [{"name": "input_ids", "dtype": "int64", **SEQ}, {"name": "attention_mask", "dtype": "int64", **SEQ}],
            "outputs": [{"name": "pooled"}], **extra}
    (folder / "spec.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder


def test_stage_load_records_which_rule_made_each_input_and_the_mask_never_divides_by_zero(tmp_path):
    spec = load_spec(encoder_folder(tmp_path) / "spec.yaml")
    said = []
    ctx = BuildContext(spec=spec, options=BuildOptions(repository=tmp_path / "repo"), workdir=tmp_path, progress=said.append)
    result = load.run(ctx)
    rules = result.outputs["generated_inputs"]
    # the model rejects ids >= 16: probed down from [0, 100) by halves, and said so; the mask follows its name
    assert rules == {"input_ids": "uniform in [0, 12) (probed: the model rejects larger ids)",
                     "attention_mask": "padding mask: ones, then zero padding, never a row of padding only "
                                       "(transformers name)"}
    assert any(line.startswith("  generated inputs: input_ids: uniform in [0, 12)") for line in said)
    assert all(np.isfinite(out["pooled"]).all() for out in ctx.reference.outputs)


def test_stage_load_takes_the_ids_and_the_mask_from_data_validation(tmp_path):
    folder = encoder_folder(tmp_path, data={"validation": "val.npz"})
    np.savez(folder / "val.npz", input_ids=np.array([[2, 5, 3, 0], [2, 7, 7, 3]]),
             attention_mask=np.array([[1, 1, 1, 0], [1, 1, 1, 1]]))
    spec = load_spec(folder / "spec.yaml")
    ctx = BuildContext(spec=spec, options=BuildOptions(repository=tmp_path / "repo"), workdir=tmp_path,
                       progress=lambda m: None)
    rules = load.run(ctx).outputs["generated_inputs"]
    assert rules == {"input_ids": "one of 5 values (0, 2, 3, 5, 7) (data.validation)",
                     "attention_mask": "padding mask: ones, then zero padding, never a row of padding only "
                                       "(data.validation)"}


def test_init_writes_a_named_inputs_rule_into_the_draft(tmp_path):
    folder = encoder_folder(tmp_path)
    np.savez(folder / "sample.npz", input_ids=np.array([[2, 5, 3]]), attention_mask=np.array([[1, 1, 0]]))
    out = folder / "drafted.yaml"
    init_spec(folder / "model.py:build", out, sample=folder / "sample.npz")
    assert "kind: padding_mask" in out.read_text()
    spec = load_spec(out)
    mask = next(t for t in spec.inputs if t.name == "attention_mask")
    assert mask.kind == "padding_mask" and rule_for(mask).source == "spec"
