"""onnx_opt's graph passes (onnxoptimizer, onnxslim) remove an input forward() never reads as dead code;
config.pbtxt declares every spec input and Triton's onnxruntime backend refuses a model missing one, so the
passes put it back, in its place."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from builder.optimise.onnx_tools import standard_passes


def test_an_unused_input_survives_the_graph_passes_in_its_place():
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])], "g",
        [helper.make_tensor_value_info("unused", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])
    model, ran = standard_passes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    assert "onnxslim" in ran
    assert [i.name for i in model.graph.input] == ["unused", "x"]
    session = ort.InferenceSession(model.SerializeToString())
    feeds = {"unused": np.zeros((2, 3), np.float32), "x": np.ones((2, 3), np.float32)}
    assert session.run(None, feeds)[0].tolist() == [[2.0] * 3] * 2
