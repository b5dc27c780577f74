"""Close calls in the build's benchmark are re-measured head to head (builder/stages/benchmark.py).
Whether a call is close depends on measurements, so the decision is tested with injected figures
(both outcomes) and the re-measuring path with a real digits build whose decision is forced."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.pipeline import build
from builder.repository.metadata import read_metadata
from builder.stages import benchmark
from builder.stages.base import Variant


def test_close_call_uses_the_larger_of_noise_and_spread():
    assert benchmark.close_call(104, 100, [0.01, 0.02])          # 4 % lead, 5 % noise floor
    assert not benchmark.close_call(120, 100, [0.01, 0.02])      # 20 % lead beats noise and spread
    assert benchmark.close_call(120, 100, [0.25, 0.02])          # ... but not a 25 % window spread
    assert not benchmark.close_call(120, 100, [float("inf")])    # an unknown spread is not a reason
    assert not benchmark.close_call(100, 0, [0.0])


def _variant(name: str, by_batch: dict[int, float], p50: float, spread: float = 0.01) -> Variant:
    v = Variant(name, "onnx", "fp32", Path(f"{name}.onnx"))
    best = max(by_batch, key=by_batch.get)
    v.benchmark = {"throughput_by_batch": by_batch, "best_batch": best, "best_throughput": by_batch[best],
                   "latency_ms_b1": {"p50": p50}, "spread": {b: spread for b in by_batch}}
    return v


def test_finalists_are_the_two_leaders_at_the_batches_that_decide():
    a = _variant("a", {1: 900.0, 8: 4000.0}, 1.0)
    b = _variant("b", {1: 1000.0, 4: 3900.0, 8: 3800.0}, 0.9)
    c = _variant("c", {1: 100.0, 8: 500.0}, 9.0)
    pair, batches = benchmark.finalists([c, a, b], "throughput")
    assert [v.name for v in pair] == ["a", "b"] and batches == [4, 8]
    assert benchmark.finalists([a, b, c], "latency") is None  # p50 0.9 vs 1.0 ms: an 11 % lead
    b.benchmark["latency_ms_b1"]["p50"] = 0.98
    pair, batches = benchmark.finalists([a, b, c], "latency")
    assert [v.name for v in pair] == ["b", "a"] and batches == [1]
    b.benchmark["best_throughput"] = b.benchmark["throughput_by_batch"][4] = 2000.0
    assert benchmark.finalists([a, b, c], "throughput") is None  # a 2x lead is no close call
    assert benchmark.finalists([a], "throughput") is None


@pytest.mark.slow(reason="builds and benchmarks a model")
@pytest.mark.parametrize("forced", [True, False])
def test_a_close_call_is_measured_again_and_recorded(digits_copy, tmp_path, monkeypatch, forced):
    said = []
    if forced:  # whatever this host measured, treat onnx vs onnx_opt as a close call at batch 1 and 64
        monkeypatch.setattr(benchmark, "finalists", lambda variants, objective: (
            sorted(variants, key=lambda v: v.name), [1, 64]))
    else:
        monkeypatch.setattr(benchmark, "finalists", lambda variants, objective: None)
    result = build(digits_copy / "spec.yaml", tmp_path / "repo", variants=["onnx", "onnx_opt"],
                   benchmark_seconds=0.3, progress=said.append)
    meta = read_metadata(Path(result.published[0]["path"]) / "metadata.yaml")
    variants = {v.name: v for v in result.context.variants}
    if forced:
        assert any("onnx and onnx_opt are a close call: measuring all 2 variants again at batch 1, " in s
                   for s in said)
        batches = variants["onnx"].benchmark["confirmed"]["batches"]
        assert {1, 64} <= set(batches)  # the forced ones, plus each variant's best batch of the first round
        assert sum("confirming at batch" in s for s in said) == len(batches)
        for name in ("onnx", "onnx_opt"):
            bench = variants[name].benchmark
            assert bench["confirmed"]["pair"] == ["onnx", "onnx_opt"] and bench["confirmed"]["batches"] == batches
            assert bench["confirmed"]["first_round"]["best_batch"] in batches
            # ranked on the confirmation round alone, never on a first-round figure at another batch
            assert bench["best_batch"] in batches
            assert bench["best_throughput"] == max(bench["throughput_by_batch"][b] for b in batches)
        assert meta["benchmark"]["confirmed"]["batches"] == batches
    else:
        assert not any("close call" in s for s in said)
        assert all("confirmed" not in v.benchmark for v in variants.values())
