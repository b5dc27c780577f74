"""Dynamic INT8 on a convolutional model: skipped where MatMul/Gemm (nn.Linear) hold a small share of the
multiply-adds (it would be the FP32 graph with an INT8 head), made where they carry the model, and always made when
the spec or --variants names it; static INT8 on a transformer encoder skipped where openvino_int8 covers it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from builder.optimise.onnx_tools import macs_by_op
from builder.stages.quantize import MIN_DYNAMIC_SHARE, NotApplicable, small_dynamic_share


def _graph(path: Path, conv_channels: int, hidden: int, pixels: int = 16) -> Path:
    """x [N, 3, pixels, pixels] -> Conv 3x3 (conv_channels) -> global average -> Gemm (hidden) -> MatMul (10)."""
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n) for n, s in (
        ("conv_w", (conv_channels, 3, 3, 3)), ("fc_w", (hidden, conv_channels)), ("out_w", (hidden, 10)))]
    nodes = [helper.make_node("Conv", ["x", "conv_w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc_w"], ["h"], transB=1),
             helper.make_node("MatMul", ["h", "out_w"], ["y"])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, pixels, pixels])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _ctx(path: Path | None, named=None):
    variant = SimpleNamespace(path=path) if path is not None else None
    return SimpleNamespace(options=SimpleNamespace(variants=named), spec=SimpleNamespace(variants=None),
                           variant=lambda name: variant if name == "onnx" else None)


def test_multiply_adds_count_a_conv_kernel_at_every_output_pixel(tmp_path):
    macs = macs_by_op(onnx.load(str(_graph(tmp_path / "m.onnx", 32, 64))), ("Conv", "Gemm", "MatMul"))
    assert macs == {"Conv": 32 * 3 * 3 * 3 * 16 * 16, "Gemm": 64 * 32, "MatMul": 64 * 10}


def test_a_cnn_whose_dense_layers_are_a_sliver_of_the_work_skips_dynamic_int8(tmp_path):
    skip = small_dynamic_share(_ctx(_graph(tmp_path / "m.onnx", 32, 64)), "onnx_int8_dynamic", "MatMul/Gemm")
    assert isinstance(skip, NotApplicable)
    assert str(skip).startswith("MatMul/Gemm hold 1.2% of the multiply-adds, the convolutions 98.8%: dynamic INT8 "
                                "quantizes only the former")
    assert "Name onnx_int8_dynamic in variants (or --variants) to make it anyway" in str(skip)


def test_a_model_whose_dense_layers_carry_the_work_keeps_dynamic_int8(tmp_path):
    wide = _graph(tmp_path / "m.onnx", 4, 4096, pixels=4)  # Conv 1.7k multiply-adds, Gemm + MatMul 57k
    assert small_dynamic_share(_ctx(wide), "onnx_int8_dynamic", "MatMul/Gemm") is None


def test_a_named_variant_is_made_whatever_the_share(tmp_path):
    ctx = _ctx(_graph(tmp_path / "m.onnx", 32, 64), named=["onnx", "onnx_int8_dynamic"])
    assert small_dynamic_share(ctx, "onnx_int8_dynamic", "MatMul/Gemm") is None


@pytest.mark.parametrize("linear, conv, skipped", [(5, 95, True), (10, 90, False), (100, 0, False)])
def test_without_an_onnx_export_the_weights_decide(linear, conv, skipped):
    assert MIN_DYNAMIC_SHARE == 0.10
    skip = small_dynamic_share(_ctx(None), "torchscript_int8_dynamic", "nn.Linear layers", (linear, conv))
    assert (skip is not None) == skipped
    if skipped:
        assert str(skip).startswith("nn.Linear layers hold 5.0% of the weights, the convolutions 95.0%")


# -- static INT8 on a transformer encoder ---------------------------------------------------------------------------

def _encoder_ctx(tmp_path: Path, named=None, search="auto", wants_openvino=True, fused=True):
    fused_graph = tmp_path / "onnx_opt.onnx"
    fused_graph.write_bytes(b"")
    onnx_opt = SimpleNamespace(name="onnx_opt", path=fused_graph,
                               passes=["onnxruntime transformer optimizer (bert)"] if fused else ["extended"])
    onnx_base = SimpleNamespace(name="onnx", path=fused_graph)
    return SimpleNamespace(options=SimpleNamespace(variants=named),
                           spec=SimpleNamespace(variants=None, quantization=SimpleNamespace(search=search)),
                           wants=lambda name: wants_openvino or name != "openvino_int8",
                           variant=lambda name: {"onnx_opt": onnx_opt, "onnx": onnx_base}.get(name))


@pytest.mark.parametrize("case, kwargs, plugin, skipped", [
    ("a fused encoder, openvino_int8 made here", {}, None, True),
    ("the OpenVINO CPU plugin does not run here", {}, "OpenVINO's CPU plugin does not run on this host", False),
    ("openvino_int8 not asked for", {"wants_openvino": False}, None, False),
    ("onnx_int8_static named", {"named": ["onnx_int8_static", "openvino_int8"]}, None, False),
    ("quantization.search on", {"search": "on"}, None, False),
    ("not an encoder (no transformer fusion)", {"fused": False}, None, False),
])
def test_static_int8_on_an_encoder_is_skipped_only_where_openvino_int8_covers_it(tmp_path, monkeypatch, case, kwargs,
                                                                                  plugin, skipped):
    from builder.stages import quantize
    from builder.stages.quantize import static_on_an_encoder

    monkeypatch.setattr(quantize, "cpu_plugin_problem", lambda: plugin)
    skip = static_on_an_encoder(_encoder_ctx(tmp_path, **kwargs))
    assert (skip is not None) == skipped, case
    if skipped:
        assert str(skip).startswith("a transformer encoder (its graph fused as onnx_opt): static activation scales "
                                    "lost the task")
        assert "Name onnx_int8_static in variants (or --variants) to search it anyway" in str(skip)
