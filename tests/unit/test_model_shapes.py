"""Shapes every model a user brings can have, without a server: a scalar per sample (Triton's
dims [1] + reshape []), the wire shape helpers, and the error class of a config the builder got wrong."""

from __future__ import annotations

import numpy as np
import pytest

from builder.errors import InternalError, VerificationError
from builder.repository.config import ModelConfig, TensorConfig, config_as_dict, render_config
from builder.tensors import from_wire, to_wire


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
