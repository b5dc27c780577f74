"""Triton's model warm-up from the version's reference data (builder/repository/warmup_data.py): one sample per
input in <model>/warmup/, named by its content's hash, and every path that copies a config copies them."""

from __future__ import annotations

import numpy as np
import pytest

from builder.core.errors import UserInputError
from builder.repository.config import ModelConfig, TensorConfig, Warmup, WarmupInput, parse_config, render_config
from builder.repository.layout import _place_model_files
from builder.repository.metadata import reference_bytes
from builder.repository.warmup_data import (file_name, read_warmup_files, referenced_files, warmup_array,
                                            with_reference_warmup)


def _config(max_batch_size=8):
    batching = max_batch_size > 0
    inputs = [TensorConfig.per_sample("temperature", "TYPE_FP32", [], batching),
              TensorConfig("ids", "TYPE_INT64", [-1])]
    # a scalar without a batch dimension: only the python backend serves it (dims [1], no reshape)
    return ModelConfig(name="m", backend="onnxruntime_onnx" if batching else "python", max_batch_size=max_batch_size, inputs=inputs,
                       outputs=[TensorConfig("y", "TYPE_FP32", [4])],
                       warmups=[Warmup("warmup_batch1", 1, [WarmupInput("temperature", "TYPE_FP32", [1]),
                                                            WarmupInput("ids", "TYPE_INT64", [16])])])


def _reference(batched=True):
    gen = {"temperature": np.full((2,) if batched else (), 9.0, np.float32),
           "ids": np.full((2, 5) if batched else (5,), 9, np.int64)}
    val = {"temperature": np.array([0.5, 0.7] if batched else 0.5, np.float32),
           "ids": np.array([[3, 1, 4], [1, 5, 9]] if batched else [3, 1, 4], np.int64)}
    # sorted by case key: the generated case comes first, the validation case is still the one chosen
    return reference_bytes([{"id": "gen_b2", "inputs": gen}, {"id": "val_b2", "inputs": val}],
                           [{"y": np.zeros((2, 4), np.float32)}] * 2)


@pytest.mark.parametrize("max_batch_size", [8, 0])
def test_the_first_validation_sample_in_wire_dims_becomes_the_warm_up(max_batch_size):
    config, files = with_reference_warmup(_config(max_batch_size), _reference(batched=max_batch_size > 0))
    text = render_config(config)
    warm = parse_config(text).model_warmup[0].inputs
    assert list(warm["temperature"].dims) == [1] and list(warm["ids"].dims) == [3]  # the sample's own length
    assert not warm["ids"].zero_data and "zero_data" not in text
    assert sorted(files) == referenced_files(text) == sorted(f"warmup/{w.input_data_file}" for w in warm.values())
    assert warmup_array(files[f"warmup/{warm['ids'].input_data_file}"], "TYPE_INT64", [3]).tolist() == [3, 1, 4]
    assert warmup_array(files[f"warmup/{warm['temperature'].input_data_file}"], "TYPE_FP32", [1]).tolist() == [0.5]


def test_without_reference_data_the_warm_up_stays_zeros():
    config, files = with_reference_warmup(_config(), None)
    assert files == {} and "zero_data: true" in render_config(config)


def test_a_file_name_carries_its_content_hash_and_a_safe_input_name():
    assert file_name("input:0/x", b"ab") != file_name("input:0/x", b"ac")
    assert file_name("input:0/x", b"ab").startswith("input_0_x.") and file_name("x", b"").endswith(".bin")
    with pytest.raises(ValueError, match="warm-up data holds 4 bytes; TYPE_INT64 dims \\[3\\] need 24"):
        warmup_array(b"\0" * 4, "TYPE_INT64", [3])


def test_a_copied_config_needs_its_files_unchanged(tmp_path):
    config, files = with_reference_warmup(_config(), _reference())
    text = render_config(config)
    model = tmp_path / "repo" / "m"
    model.mkdir(parents=True)
    _place_model_files(tmp_path / "repo", model, files)
    assert read_warmup_files(model, text) == files
    path = sorted(files)[0]
    (model / path).write_bytes(b"\1" * len(files[path]))
    with pytest.raises(UserInputError, match=r"was changed after it was published .* rebuild the model"):
        read_warmup_files(model, text)
    (model / path).unlink()
    with pytest.raises(UserInputError, match=r"is missing: config.pbtxt's model_warmup reads it \(Triton would not "
                                             r"load the model\)"):
        read_warmup_files(model, text)
    _place_model_files(tmp_path / "repo", model, files)  # put back whole, readable by Triton's user
    assert read_warmup_files(model, text) == files and oct((model / path).stat().st_mode)[-3:] == "644"
