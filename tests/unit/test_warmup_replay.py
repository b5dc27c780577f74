"""Every model a build publishes (the --publish-variants companions too) runs its Triton warm-up
in-process first: one Triton would fail to load is not published, and says why."""

from __future__ import annotations

import pytest
import torch

from builder.core.errors import VerificationError
from builder.repository.config import ModelConfig, TensorConfig, Warmup, WarmupInput
from builder.repository.description import VersionDescription
from builder.repository.layout import existing_versions
from builder.repository.publish import publish_model


class RefusesZeros(torch.nn.Module):
    """Like a dynamically quantized model fed an input it cannot quantize."""

    def forward(self, x):
        if bool((x == 0).all()):
            raise RuntimeError("In ChooseQuantizationParams, min should be less than or equal to max")
        return x * 2


class Doubles(torch.nn.Module):
    def forward(self, x):
        return x * 2


def _description(tmp_path, module, name):
    path = tmp_path / f"{name}.pt"
    torch.jit.script(module).save(str(path))
    config = ModelConfig(name=name, backend="pytorch_libtorch", max_batch_size=8,
                         inputs=[TensorConfig("x", "TYPE_FP32", [4])], outputs=[TensorConfig("y", "TYPE_FP32", [4])],
                         warmups=[Warmup("warmup_batch1", 1, [WarmupInput("x", "TYPE_FP32", [4])])])
    return VersionDescription(name=name, config=config, model_format="torchscript", model_files=[path], metadata={})


def test_a_model_failing_its_warm_up_is_not_published_and_says_why(tmp_path):
    repo = tmp_path / "repo"
    assert publish_model(repo, _description(tmp_path, Doubles(), "m"))["version"] == 1
    with pytest.raises(VerificationError, match=r"'m__torchscript_int8_dynamic' was not published: its warm-up "
                                                r"\(zeros, config.pbtxt's model_warmup\) fails in torchscript, so "
                                                r"Triton would not load it: .*min should be less than or equal to "
                                                r"max.*; models published before it in this run stay"):
        publish_model(repo, _description(tmp_path, RefusesZeros(), "m__torchscript_int8_dynamic"))
    assert not (repo / "m__torchscript_int8_dynamic").exists()
    assert existing_versions(repo / "m") == [1]
    assert "zero_data: true" in (repo / "m" / "config.pbtxt").read_text()


def test_the_warm_up_feed_is_what_triton_gives_the_model():
    from builder.repository.warmup import warmup_inputs

    config = ModelConfig(name="m", backend="onnxruntime_onnx", max_batch_size=8,
                         inputs=[TensorConfig.per_sample("temperature", "TYPE_FP32", []),
                                 TensorConfig("ids", "TYPE_INT64", [-1])],
                         outputs=[TensorConfig("y", "TYPE_FP32", [4])],
                         warmups=[Warmup("warmup_batch1", 1, [WarmupInput("temperature", "TYPE_FP32", [1]),
                                                              WarmupInput("ids", "TYPE_INT64", [16])])])
    feed, = warmup_inputs(VersionDescription(name="m", config=config, model_format="onnx", model_files=[]))
    # a scalar per sample: dims [1] on the wire, reshape [] for the model, so [batch]
    assert feed["temperature"].shape == (1,) and feed["ids"].shape == (1, 16)
    assert feed["ids"].dtype == "int64" and not feed["temperature"].any()


def test_with_reference_data_the_warm_up_is_a_real_sample_and_zeros_are_never_sent(tmp_path):
    """The same zero-refusing model, published with its reference cases: Triton's warm-up reads the first
    sample from <model>/warmup/ (input_data_file), the replay feeds that sample, so the model is published."""
    import numpy as np

    from builder.repository.config import parse_config
    from builder.repository.metadata import reference_bytes

    repo = tmp_path / "repo"
    cases = [{"id": "val_b3", "inputs": {"x": np.arange(12, dtype=np.float32).reshape(3, 4) + 1}}]
    description = _description(tmp_path, RefusesZeros(), "m")
    description = VersionDescription(**{**description.__dict__, "extra_files": {
        "reference.npz": reference_bytes(cases, [{"y": cases[0]["inputs"]["x"] * 2}])}})
    assert publish_model(repo, description)["version"] == 1
    warm = parse_config((repo / "m" / "config.pbtxt").read_text()).model_warmup[0].inputs["x"]
    assert not warm.zero_data and list(warm.dims) == [4] and warm.input_data_file.startswith("x.")
    data = (repo / "m" / "warmup" / warm.input_data_file).read_bytes()
    assert np.array_equal(np.frombuffer(data, dtype=np.float32), [1, 2, 3, 4])
    assert not any(p.name.startswith("x.") for p in (repo / "m" / "1").iterdir())  # model folder, not version
