"""What stage load refuses before anything is exported, each naming the field and the fix: a model
whose samples mix within a batch, outputs Triton has no type for, an input named like the labels
key, and the narrower fix when the builder's own batch or dynamic size is what the model rejects."""

from __future__ import annotations

import re
import textwrap

import pytest
import yaml

from builder.core.errors import UserInputError
from builder.pipeline import build


def spec_folder(tmp_path, forward: str, inputs: list[dict], outputs: list[str], **spec) -> str:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.py").write_text(textwrap.dedent(f"""
        import torch
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__(); torch.manual_seed(0); self.fc = torch.nn.Linear(6, 4)
            def forward(self, x):
                {forward}
        def build():
            return M()
    """))
    data = {"name": "m", "source": {"module": "model:build"}, "inputs": inputs,
            "outputs": [{"name": n} for n in outputs], "max_batch_size": 8, "variants": ["onnx"], **spec}
    (folder / "spec.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "spec.yaml"


X6 = [{"name": "x", "dtype": "float32", "shape": [6]}]


def run_build(spec, tmp_path, quiet):
    return build(spec, tmp_path / "repo", benchmark_seconds=0, progress=quiet)


def test_a_model_that_mixes_the_samples_of_a_batch_is_refused(tmp_path, quiet):
    # softmax over dim 0, the batch: served, a sample's answer would depend on other clients' requests
    spec = spec_folder(tmp_path, "return torch.softmax(self.fc(x), dim=0)", X6, ["p"])
    with pytest.raises(UserInputError, match=r"field 'max_batch_size': the model's answer for a sample depends on "
                                             r"the other samples of its batch \(alone vs in a batch of 8: output 'p' "
                                             r"of sample 0: rel L2 .*softmax/normalise over dim=-1.*max_batch_size: 0"):
        run_build(spec, tmp_path, quiet)
    assert not (tmp_path / "repo" / "m").exists()


def test_a_model_whose_samples_are_independent_passes_the_batch_check(tmp_path, quiet):
    spec = spec_folder(tmp_path, "return torch.softmax(self.fc(x), dim=-1), self.fc(x).argmax(-1)", X6, ["p", "c"])
    result = run_build(spec, tmp_path, quiet)
    assert result.published and (tmp_path / "repo" / "m" / "1").is_dir()


def test_one_class_id_flipping_on_one_sample_is_a_near_tie_not_a_mixing_model():
    import numpy as np

    from builder.model.source import check_batch_independent

    inputs = {"x": np.zeros((4, 2), np.float32)}
    batched = {"c": np.array([1, 2, 3, 4])}

    calls = iter([np.array([9]), np.array([3]), np.array([4])])  # samples 0, 2, 3: only sample 0 differs
    check_batch_independent(lambda feed: {"c": next(calls)}, inputs, batched, "spec.yaml")
    calls = iter([np.array([9]), np.array([9]), np.array([4])])  # two samples differ: mixing
    with pytest.raises(UserInputError, match=r"output 'c' of sample 0: 1 value\(s\) differ; output 'c' of sample 2"):
        check_batch_independent(lambda feed: {"c": next(calls)}, inputs, batched, "spec.yaml")


def test_a_complex_output_is_refused_at_load_naming_the_fix(tmp_path, quiet):
    spec = spec_folder(tmp_path, "return torch.fft.rfft(self.fc(x))", X6, ["spectrum"])
    with pytest.raises(UserInputError, match=r"field 'outputs': 'spectrum' is complex64 from the model, which Triton "
                                             r"cannot serve .*torch\.view_as_real"):
        run_build(spec, tmp_path, quiet)


def test_an_input_named_labels_is_refused_when_data_validation_keys_labels(tmp_path, quiet):
    import numpy as np

    spec = spec_folder(tmp_path, "return self.fc(x)",
                       [{"name": "labels", "dtype": "float32", "shape": [6]}], ["y"],
                       data={"validation": "val.npz"})
    np.savez(spec.parent / "val.npz", labels=np.zeros((16, 6), np.float32))
    with pytest.raises(UserInputError, match=r"field 'inputs': an input is named 'labels', the key data\.validation "
                                             r"keeps for the class ids .*rename the input"):
        run_build(spec, tmp_path, quiet)


def test_a_one_sample_model_is_told_to_set_max_batch_size(tmp_path, quiet):
    spec = spec_folder(tmp_path, "return self.fc(x.view(1, 6))", X6, ["y"])
    with pytest.raises(UserInputError, match=r"It runs on 1 sample but not on a batch of \d+: if forward\(\) takes "
                                             r"one sample at a time, set max_batch_size: 1"):
        run_build(spec, tmp_path, quiet)


@pytest.mark.slow(reason="builds a model")
def test_an_in_between_size_the_model_refuses_is_dropped_with_a_note(tmp_path, quiet):
    # even lengths only (a stride-2 down and up path); min/opt/max are even, the builder's odd pick is not
    spec = spec_folder(tmp_path, "return x + torch.nn.functional.interpolate(torch.nn.functional.avg_pool1d("
                                 "x.unsqueeze(1), 2), scale_factor=2.0).squeeze(1)",
                       [{"name": "x", "dtype": "float32", "shape": [-1], "min_shape": [8], "opt_shape": [16],
                         "max_shape": [32]}], ["y"])
    result = run_build(spec, tmp_path, quiet)
    assert result.published
    assert any(re.match(r"not verified at gen_b1_dmid, gen_b3_dmid, gen_b8_dmid: the model itself does not run there",
                        note) for note in result.context.notes), result.context.notes


def test_a_profile_size_the_model_refuses_names_the_opt_sizes_and_verify_dynamic_sizes(tmp_path, quiet):
    spec = spec_folder(tmp_path, "return x.view(x.shape[0], 2, -1).sum(1)",  # even lengths only; min is 1
                       [{"name": "x", "dtype": "float32", "shape": [-1], "min_shape": [1], "opt_shape": [16],
                         "max_shape": [32]}], ["y"])
    with pytest.raises(UserInputError, match=r"It runs at the opt_shape sizes \(x\[\d+, 16\]\) but not at these, which "
                                             r"the builder picked between min_shape and max_shape .*verify\.dynamic_sizes"):
        run_build(spec, tmp_path, quiet)


def test_dynamic_dims_of_one_input_and_of_two_inputs_are_verified_at_different_sizes():
    from builder.spec.model import parse_spec
    from builder.accuracy.tensors import build_cases

    base = {"name": "m", "source": {"module": "model:build"}, "outputs": [{"name": "y"}], "max_batch_size": 4}
    image = parse_spec(dict(base, inputs=[{"name": "x", "shape": [3, -1, -1]}]))
    shapes = {c["id"]: c["inputs"]["x"].shape[2:] for c in build_cases(image, None)}
    assert shapes["gen_b3_dskew_hl"] == (64, 1) and shapes["gen_b3_dskew_lh"] == (1, 64)  # portrait and landscape
    encdec = parse_spec(dict(base, inputs=[
        {"name": "src", "shape": [-1, 16], "min_shape": [1, 16], "opt_shape": [32, 16], "max_shape": [64, 16]},
        {"name": "tgt", "shape": [-1, 16], "min_shape": [1, 16], "opt_shape": [4, 16], "max_shape": [8, 16]}]))
    lengths = {c["id"]: (c["inputs"]["src"].shape[1], c["inputs"]["tgt"].shape[1]) for c in build_cases(encdec, None)}
    assert lengths["gen_b4_dopt"] == (32, 4) and lengths["gen_b4_dmax"] == (64, 8)  # each input's own range
    assert lengths["gen_b3_dskew_hl"] == (64, 1) and lengths["gen_b3_dskew_lh"] == (1, 8)
    ids_and_mask = parse_spec(dict(base, inputs=[{"name": "ids", "dtype": "int64", "shape": [-1]},
                                                 {"name": "mask", "dtype": "int64", "shape": [-1]}]))
    assert all(c["inputs"]["ids"].shape == c["inputs"]["mask"].shape for c in build_cases(ids_and_mask, None))


@pytest.mark.parametrize("change, message", [
    ({"inputs": [{"name": "x", "shape": [-1], "min_shape": [9], "max_shape": [8]}]},
     r"field 'inputs\[0\].opt_shape': dim 0 has min 9, opt 8, max 8: give min_shape <= opt_shape <= max_shape"),
    ({"inputs": [{"name": "x", "dtype": "uint8", "shape": [4], "value_range": [-5, 10]}]},
     r"field 'inputs\[0\].value_range': \[-5, 10\) does not fit uint8 \(0 to 255\)"),
    ({"inputs": [{"name": "x", "shape": [-1], "max_shape": [8]}], "verify": {"dynamic_sizes": [1, 100]}},
     r"field 'verify.dynamic_sizes': 100 is outside input 'x' dim 0's range 1..8"),
])
def test_spec_ranges_the_builder_could_not_honour_are_refused(change, message):
    from builder.spec.model import parse_spec

    base = {"name": "m", "source": {"module": "model:build"}, "outputs": [{"name": "y"}], "max_batch_size": 4}
    with pytest.raises(UserInputError, match=message):
        parse_spec({**base, **change})
