"""onnxruntime's transformer fusions for Hugging Face encoders (builder/optimise/transformer_fusion.py, stage optimize's
onnx_opt) and dynamic INT8 of the fused graph (stage quantize), on the tiny BERT example."""

from __future__ import annotations

import pytest

from builder.optimise.transformer_fusion import eager_attention, encoder_shape
from tests.conftest import EXAMPLES


def _bert(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bert_tiny_model", EXAMPLES / "bert_tiny" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build()


def test_the_encoder_shape_comes_from_the_hugging_face_config_inside_the_module(tmp_path):
    import torch

    assert encoder_shape(_bert(tmp_path)) == ("bert", 2, 64)
    assert encoder_shape(torch.nn.Linear(4, 4)) is None  # not a transformer: the usual onnx_opt path


def test_attention_is_eager_while_exporting_and_restored_after(tmp_path):
    model = _bert(tmp_path)
    inner = next(m for m in model.modules() if hasattr(m, "set_attn_implementation"))
    inner.set_attn_implementation("sdpa")
    with eager_attention(model) as switched:
        assert inner.config._attn_implementation == "eager" and switched == ["BertModel: sdpa -> eager"]
    assert inner.config._attn_implementation == "sdpa"


@pytest.mark.slow(reason="builds the tiny BERT")
def test_onnx_opt_of_an_encoder_is_fused_and_dynamic_int8_quantizes_that_graph(tmp_path, quiet):
    from builder.pipeline import build

    result = build(EXAMPLES / "bert_tiny" / "spec.yaml", tmp_path / "repo",
                   variants=["onnx", "onnx_opt", "onnx_int8_dynamic"], benchmark_seconds=0, progress=quiet)
    ctx = result.context
    opt, int8 = ctx.variant("onnx_opt"), ctx.variant("onnx_int8_dynamic")
    assert opt.verified is True, opt.rejected
    fused = opt.passes[0]
    assert fused.startswith("onnxruntime transformer optimizer (bert, 2 heads, hidden 64) on the legacy export")
    assert "Attention 2" in fused and "SkipLayerNormalization" in fused
    assert opt.exporter == "legacy+optimised"
    assert int8.notes[1].startswith("quantized from onnx_opt, the transformer-fused graph")
    assert "QAttention x2" in int8.notes[0] and "(from Attention, MatMul)" in int8.notes[0]
