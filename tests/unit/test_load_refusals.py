"""What stage load refuses before anything is exported, each naming the field and the fix: a model
whose samples mix within a batch, outputs Triton has no type for, an input named like the labels
key, and the narrower fix when the builder's own batch or dynamic size is what the model rejects."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from builder.errors import UserInputError
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

    from builder.model_source import check_batch_independent

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


def test_a_size_the_builder_picked_between_min_and_max_is_named_with_verify_dynamic_sizes(tmp_path, quiet):
    # even lengths only (a stride-2 down and up path); min/opt/max are even, the builder's odd pick is not
    spec = spec_folder(tmp_path, "return x + torch.nn.functional.interpolate(torch.nn.functional.avg_pool1d("
                                 "x.unsqueeze(1), 2), scale_factor=2.0).squeeze(1)",
                       [{"name": "x", "dtype": "float32", "shape": [-1], "min_shape": [8], "opt_shape": [16],
                         "max_shape": [32]}], ["y"])
    with pytest.raises(UserInputError, match=r"It runs at size 16 \(opt_shape\) but not at size \d+, which the "
                                             r"builder picked between min_shape and max_shape .*verify\.dynamic_sizes"):
        run_build(spec, tmp_path, quiet)
