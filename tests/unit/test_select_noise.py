"""The tie rule (builder/model/objective.py prefer_accurate, used by stage select and `triton-builder select`):
a variant further from the reference is published only when it is faster by more than the measurement
noise. Measurements are injected: the outcome does not depend on this host."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.model.objective import prefer_accurate
from builder.pipeline import BuildOptions
from builder.spec.model import load_spec
from builder.stages import select
from builder.stages.base import BuildContext, Variant
from tests.conftest import EXAMPLES

FP32, INT8 = 2.8e-7, 1.7e-2


@pytest.mark.parametrize("int8_speed, published", [
    (141.5e3, "onnx"),  # 1.05x: inside the noise, the exact variant is published
    (136e3, "onnx"),
    (150e3, "onnx_int8_static"),  # 1.11x: a real speed-up, the lossy variant earns its error
])
def test_prefer_accurate_both_outcomes(int8_speed, published):
    choice = prefer_accurate({"onnx_int8_static": int8_speed, "onnx": 135e3, "torchscript": 40e3},
                             {"onnx_int8_static": INT8, "onnx": FP32, "torchscript": 0.0})
    assert choice.name == published
    if published == "onnx":
        assert choice.fastest == "onnx_int8_static"
        assert choice.why.startswith("within measurement noise of onnx_int8_static (1.0")
        assert "rel L2 2.8e-07 vs 1.7e-02" in choice.why
    else:
        assert choice.why is None


def test_prefer_accurate_ignores_similar_errors_and_unknown_ones():
    # onnx_opt vs onnx: both FP32, errors alike -> the fastest, however close
    assert prefer_accurate({"onnx_opt": 101.0, "onnx": 100.0}, {"onnx_opt": 3e-7, "onnx": 2.8e-7}).name == "onnx_opt"
    # both within float32 rounding (3e-7 vs exactly 0): the fastest, not the "exact" one
    assert prefer_accurate({"onnx": 100.0, "torchscript": 99.0}, {"onnx": 3e-7, "torchscript": 0.0}).name == "onnx"
    # a variant verified by task accuracy (no rel L2) neither displaces nor is displaced
    assert prefer_accurate({"onnx_pruned": 101.0, "onnx": 100.0}, {"onnx_pruned": None, "onnx": 1e-7}).name == \
        "onnx_pruned"
    assert prefer_accurate({"onnx": 101.0, "onnx_pruned": 100.0}, {"onnx": 1e-2, "onnx_pruned": None}).name == "onnx"


def _variant(name, precision, p50, ips, rel_l2):
    v = Variant(name, "onnx", precision, Path(f"/nonexistent/{name}.onnx"), verified=True)
    v.accuracy = {"metric": "top1", "drop": 0.0}
    v.verification = {"metrics": {"logits": {"rel_l2": rel_l2, "max_abs": 0.0}}}
    v.benchmark = {"latency_ms_b1": {"p50": p50}, "best_throughput": ips, "best_batch": 64,
                   "throughput_by_batch": {1: 1000 / p50, 64: ips}}
    return v


def _context(objective: str) -> BuildContext:
    spec = load_spec(EXAMPLES / "digits" / "spec.yaml")
    spec.objective = objective
    return BuildContext(spec=spec, options=BuildOptions(repository=Path("/nonexistent")), workdir=Path("/nonexistent"))


def test_stage_select_publishes_fp32_when_int8_wins_inside_the_noise():
    ctx = _context("throughput")
    ctx.variants = [_variant("onnx", "fp32", 0.03, 135e3, FP32), _variant("onnx_int8_static", "int8", 0.02, 141.5e3, INT8)]
    select.run(ctx)
    assert ctx.selected.name == "onnx"
    assert ctx.selected.selection_reason.startswith("selected: within measurement noise of onnx_int8_static (1.05x")
    assert "measured (135k inf/s at batch 64)" in ctx.selected.selection_reason
    assert ctx.variant("onnx_int8_static").selection_reason == (
        "rejected: only 1.05x faster than onnx (measured 142k vs 135k inf/s), inside measurement noise, "
        "for rel L2 1.7e-02 vs 2.8e-07")


def test_stage_select_publishes_int8_when_it_is_really_faster_and_latency_uses_p50():
    ctx = _context("throughput")
    ctx.variants = [_variant("onnx", "fp32", 0.03, 135e3, FP32), _variant("onnx_int8_static", "int8", 0.02, 300e3, INT8)]
    select.run(ctx)
    assert ctx.selected.name == "onnx_int8_static"
    assert ctx.selected.selection_reason.startswith("selected: highest throughput (300k inf/s")
    latency = _context("latency")  # p50 0.0290 vs 0.0300 ms: inside the noise -> the exact one
    latency.variants = [_variant("onnx", "fp32", 0.030, 1e3, FP32), _variant("onnx_int8_static", "int8", 0.029, 1e3, INT8)]
    select.run(latency)
    assert latency.selected.name == "onnx"
    assert latency.variant("onnx_int8_static").selection_reason.startswith("rejected: only 1.03x faster than onnx (p50")
