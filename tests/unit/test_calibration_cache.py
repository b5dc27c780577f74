"""Recipes that calibrate alike calibrate once (builder/optimise/onnx_quantize.py): the real onnxruntime
quantizer on a tiny conv net, with a calibration reader that counts what it is asked for."""

from __future__ import annotations

import inspect
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from builder.optimise import onnx_quantize
from builder.optimise.quant_search import DEFAULT


def conv_net(path):
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "w1"),
               numpy_helper.from_array(rng.normal(size=(8, 8, 3, 3)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Conv", ["b", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8, 8, 8])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def calls(monkeypatch):
    """How many calibration batches the quantizer read (onnx_quantize.reader's get_next, non-empty ones)."""
    count = []
    real = onnx_quantize.reader

    def reader(feeds):
        inner = real(feeds)
        get_next = inner.get_next

        def counted():
            feed = get_next()
            if feed is not None:
                count.append(1)
            return feed

        inner.get_next = counted
        return inner

    monkeypatch.setattr(onnx_quantize, "reader", reader)
    return count


def _initializers(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def test_a_recipe_that_calibrates_alike_reuses_the_ranges_and_gives_the_same_model(tmp_path, calls):
    from onnxruntime.quantization import quantize_static

    if "calibration_cache_path" not in inspect.signature(quantize_static).parameters:
        pytest.skip("this onnxruntime has no calibration_cache_path: every recipe calibrates (the old behaviour)")
    source = conv_net(tmp_path / "net.onnx")
    samples = {"x": np.random.default_rng(1).normal(size=(8, 3, 8, 8)).astype(np.float32)}
    cache = tmp_path / "calibration"
    onnx_quantize.quantize_static(source, tmp_path / "default.onnx", DEFAULT, samples, 4, False,
                                  calibration_cache=cache)
    assert len(calls) == 2 and sorted(p.name for p in cache.iterdir()) == ["minmax-all-all.json"]
    reduced = replace(DEFAULT, activation_type="U8", reduce_range=True, exclude=("conv2",))
    onnx_quantize.quantize_static(source, tmp_path / "cached.onnx", reduced, samples, 4, False, calibration_cache=cache)
    assert len(calls) == 2  # no calibration batch read again
    onnx_quantize.quantize_static(source, tmp_path / "fresh.onnx", reduced, samples, 4, False)
    assert len(calls) == 4
    cached, fresh = _initializers(tmp_path / "cached.onnx"), _initializers(tmp_path / "fresh.onnx")
    assert cached.keys() == fresh.keys() and all(np.array_equal(cached[k], fresh[k]) for k in cached)
    # what the calibration depends on gives another file: the method, the sample count, the op types
    for other in (replace(DEFAULT, calibration="percentile"), replace(DEFAULT, samples=4),
                  replace(DEFAULT, op_types=("Conv",))):
        onnx_quantize.quantize_static(source, tmp_path / "other.onnx", other, samples, 4, False,
                                      calibration_cache=cache)
    assert len(calls) == 4 + 2 + 1 + 2
    assert sorted(p.name for p in cache.iterdir()) == ["minmax-4-all.json", "minmax-all-Conv.json",
                                                       "minmax-all-all.json", "percentile-all-all.json"]


def test_the_calibration_file_is_named_by_what_the_calibration_depends_on():
    assert onnx_quantize.calibration_key(DEFAULT) == "minmax-all-all.json"
    assert onnx_quantize.calibration_key(replace(DEFAULT, per_channel=False, reduce_range=True, weight_type="U8",
                                                 quant_format="QOperator", exclude=("n",))) == "minmax-all-all.json"
    assert onnx_quantize.calibration_key(replace(DEFAULT, calibration="entropy", samples=32,
                                                 op_types=("MatMul", "Gemm"))) == "entropy-32-MatMul+Gemm.json"
