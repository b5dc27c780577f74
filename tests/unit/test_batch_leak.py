"""The batch-independence check at the model's precision: fp32 kernels for other batch sizes move an
answer by ~1e-7, so a 0.5 % leak from batch-mates (each client's answer moved by strangers' inputs
under dynamic batching) is refused, while a model whose batched kernels are merely noisier, shown
by a batch of the sample's own copies, is not. Eval-mode BatchNorm (running statistics) passes."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch
import yaml

from builder.core.errors import UserInputError
from builder.model.source import batch_independence_limit, check_batch_independent
from builder.pipeline import build

LEAK = "field 'max_batch_size': the model's answer for a sample depends on the other samples of its batch"


def spec_folder(tmp_path, forward: str) -> str:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.py").write_text(textwrap.dedent(f"""
        import torch
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__(); torch.manual_seed(0)
                self.fc = torch.nn.Linear(6, 4); self.bn = torch.nn.BatchNorm1d(4)
                self.bn.running_mean.uniform_(-1, 1); self.bn.running_var.uniform_(0.5, 2)
            def forward(self, x):
                h = self.fc(x)
                {forward}
        def build():
            return M().eval()
    """))
    data = {"name": "m", "source": {"module": "model:build"},
            "inputs": [{"name": "x", "dtype": "float32", "shape": [6]}], "outputs": [{"name": "y"}],
            "max_batch_size": 8, "variants": ["onnx"]}
    (folder / "spec.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "spec.yaml"


def test_a_half_percent_leak_from_batch_mates_is_refused(tmp_path):
    spec = spec_folder(tmp_path, "return h + 0.005 * h.mean(0, keepdim=True)")
    with pytest.raises(UserInputError, match=LEAK + r" \(alone vs in a batch of 8: output 'y' of sample 0: rel L2 "
                                                    r"\d\.\de-0[34] \(\d\.\de[-+]\d\d in a batch of its own copies\)"):
        build(spec, tmp_path / "repo", benchmark_seconds=0, progress=lambda m: None)
    assert not (tmp_path / "repo" / "m").exists()


@pytest.mark.slow(reason="builds a model")
def test_batchnorm_in_eval_mode_uses_running_statistics_and_passes(tmp_path):
    result = build(spec_folder(tmp_path, "return self.bn(h)"), tmp_path / "repo", benchmark_seconds=0,
                   progress=lambda m: None)
    assert result.published and (tmp_path / "repo" / "m" / "1").is_dir()


def _linear_run(mix):
    torch.manual_seed(0)
    fc = torch.nn.Linear(8, 4)

    def run(feed):
        with torch.inference_mode():
            h = fc(torch.from_numpy(feed["x"]))
            return {"y": mix(h).numpy()}
    return run


X = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)


def test_a_time_major_recurrent_layer_is_refused_naming_batch_first():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 4)  # batch_first=False: [B, T, F] is read as [T, B, F], so samples mix over time

    def run(feed):
        with torch.inference_mode():
            return {"y": lstm(torch.from_numpy(feed["x"]))[0].numpy()}
    x = np.random.default_rng(0).standard_normal((8, 5, 8)).astype(np.float32)
    with pytest.raises(UserInputError, match=LEAK + r".*needs batch_first=True, as batch_first=False reads the "
                                                    r"batch as time"):
        check_batch_independent(run, {"x": x}, run({"x": x}), "spec.yaml")


def test_a_hidden_state_returned_layers_first_is_refused_naming_the_transpose():
    torch.manual_seed(0)
    gru = torch.nn.GRU(8, 4, num_layers=2, batch_first=True)  # h_n stays [layers, batch, hidden]

    def run(feed):
        with torch.inference_mode():
            return {"h_n": gru(torch.from_numpy(feed["x"]))[1].numpy()}
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)  # batch 2 = layers: same shape
    with pytest.raises(UserInputError, match=LEAK + r".*their h_n/c_n are \[layers, batch, hidden\] even then: "
                                                    r"return h_n\.transpose\(0, 1\)"):
        check_batch_independent(run, {"x": x}, run({"x": x}), "spec.yaml")


def test_noise_the_batch_size_alone_causes_is_forgiven_a_sum_over_the_batch_is_not():
    def noisy(feed):  # kernels whose rounding depends on the batch size only, 1e-3 relative
        x = feed["x"]
        return {"y": x * np.float32(2.0 + 2e-3 * (len(x) > 1))}
    check_batch_independent(noisy, {"x": X}, noisy({"x": X}), "spec.yaml")

    summed = _linear_run(lambda h: h + 0.05 * h.sum(0, keepdim=True))  # copies differ too, far above the ceiling
    with pytest.raises(UserInputError, match=LEAK):
        check_batch_independent(summed, {"x": X}, summed({"x": X}), "spec.yaml")


def test_the_bar_follows_the_outputs_precision():
    assert batch_independence_limit(np.dtype("float32")) == batch_independence_limit(np.dtype("float64")) == 1e-4
    assert batch_independence_limit(np.dtype("float16")) == 1e-2
    independent = _linear_run(lambda h: h * 3.0)
    check_batch_independent(independent, {"x": X}, independent({"x": X}), "spec.yaml")
