"""The per-node sensitivities of the dynamic INT8 search (builder/optimise/onnx_quantize.py OneNodeAtATime): each
single-node model is cut from one quantization of every node and must be exactly what onnxruntime's own
quantize_dynamic(nodes_to_quantize=[node]) makes - checked here on a small MLP with the real quantizer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from builder.optimise import onnx_quantize
from builder.optimise.quant_search import DYNAMIC

NODES = ["fc1", "fc2", "fc3"]


def mlp(path: Path, last: str = "MatMul") -> Path:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=(16, 16)).astype(np.float32), f"w{i}") for i in range(3)]
    weights.append(numpy_helper.from_array(rng.normal(size=16).astype(np.float32), "bias"))
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["a"], name="fc1"),
             helper.make_node("Relu", ["a"], ["b"], name="act"),
             helper.make_node("MatMul", ["b", "w1"], ["c"], name="fc2"),
             helper.make_node("MatMul", ["c", "w2"], ["y"], name="fc3") if last == "MatMul" else
             helper.make_node("Gemm", ["c", "w2", "bias"], ["y"], name="fc3", transB=1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 16])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _run(path: Path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": np.random.default_rng(1).normal(size=(4, 16)).astype(np.float32)})[0]


def _quantizer(source: Path, calls: list):
    def quantize(cand, target, only=None):
        calls.append(only)
        onnx_quantize.quantize_dynamic(source, target, cand, False, only)
    return quantize


def test_each_cut_is_what_onnxruntime_makes_for_that_node_alone(tmp_path):
    source, calls = mlp(tmp_path / "mlp.onnx"), []
    cand = replace(DYNAMIC, per_channel=True)
    one_at_a_time = onnx_quantize.OneNodeAtATime(_quantizer(source, calls), source, tmp_path)
    for node in NODES:
        one_at_a_time(cand, tmp_path / "trial.onnx", [node])
        onnx_quantize.quantize_dynamic(source, tmp_path / "own.onnx", cand, False, [node])
        assert onnx_quantize._same_graph(tmp_path / "trial.onnx", tmp_path / "own.onnx"), node
        assert np.array_equal(_run(tmp_path / "trial.onnx"), _run(tmp_path / "own.onnx")), node
        assert not np.array_equal(_run(tmp_path / "trial.onnx"), _run(source))  # really quantized
    # onnxruntime quantized every node once, and fc1 alone once to check the first cut; nothing else
    assert calls == [None, ["fc1"]] and one_at_a_time.trusted is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx", "own.onnx", "trial.onnx"]


def test_what_cannot_be_cut_cleanly_goes_to_the_quantizer(tmp_path):
    source, calls = mlp(tmp_path / "mlp.onnx"), []
    one_at_a_time = onnx_quantize.OneNodeAtATime(_quantizer(source, calls), source, tmp_path)
    one_at_a_time(DYNAMIC, tmp_path / "trial.onnx", ["act"])  # a Relu: quantize_dynamic leaves it as it is
    one_at_a_time(DYNAMIC, tmp_path / "trial.onnx", ["fc1", "fc2"])  # two nodes: not a per-node sensitivity
    one_at_a_time(DYNAMIC, tmp_path / "trial.onnx")  # every node
    assert calls == [None, ["act"], ["fc1", "fc2"], None]


def test_a_cut_unlike_the_quantizers_own_model_is_not_trusted_again(tmp_path, monkeypatch):
    source, calls = mlp(tmp_path / "mlp.onnx"), []
    monkeypatch.setattr(onnx_quantize, "_same_graph", lambda cut, own: False)  # e.g. a quantizer that renames
    one_at_a_time = onnx_quantize.OneNodeAtATime(_quantizer(source, calls), source, tmp_path)
    for node in NODES:
        one_at_a_time(DYNAMIC, tmp_path / "trial.onnx", [node])
    assert calls == [None, ["fc1"], ["fc2"], ["fc3"]] and one_at_a_time.trusted is False
    assert not (tmp_path / "trial.onnx.cut").exists()


def test_a_gemm_named_alone_or_kept_in_fp32_is_found_after_onnxruntimes_rewrite(tmp_path):
    """quantize_dynamic rewrites every Gemm as MatMul + Add (named G_MatMul, G_Add): a sensitivity of the Gemm
    alone, or keeping it in FP32, must still reach it; and since the rewrite touches nodes that are not
    quantized, a cut from the FP32 graph is not onnxruntime's model - it is not trusted, the quantizer does all."""
    source, calls = mlp(tmp_path / "mlp.onnx", last="Gemm"), []
    onnx_quantize.quantize_dynamic(source, tmp_path / "alone.onnx", DYNAMIC, False, ["fc3"])
    alone = [n.op_type for n in onnx.load(str(tmp_path / "alone.onnx")).graph.node]
    assert alone.count("MatMulInteger") == 1 and alone.count("MatMul") == 2  # fc3 quantized, fc1 and fc2 not
    onnx_quantize.quantize_dynamic(source, tmp_path / "kept.onnx", replace(DYNAMIC, exclude=("fc3",)), False)
    kept = onnx.load(str(tmp_path / "kept.onnx")).graph.node
    assert [n.name for n in kept if n.op_type == "MatMul"] == ["fc3_MatMul"] and sum(
        n.op_type == "MatMulInteger" for n in kept) == 2
    one_at_a_time = onnx_quantize.OneNodeAtATime(_quantizer(source, calls), source, tmp_path)
    for node in NODES:
        one_at_a_time(DYNAMIC, tmp_path / "trial.onnx", [node])
    assert one_at_a_time.trusted is False and calls == [None, ["fc1"], ["fc2"], ["fc3"]]
    assert np.array_equal(_run(tmp_path / "trial.onnx"), _run(tmp_path / "alone.onnx"))
