"""A variant far behind the leader at batch 1 and the largest batch is not measured at the batch sizes between
(builder/stages/benchmark.py far_behind): the measuring is injected (test_benchmark_one_round's FakeMeter), so
nothing depends on this host's speed."""

from __future__ import annotations

from builder.report.build_report import _measurement_lines
from builder.stages import benchmark
from builder.stages.base import Status
from tests.unit.test_benchmark_one_round import FakeMeter, _context

SIZES = [1, 2, 4, 8, 16, 32, 64]
# at every batch size: onnx_opt 300k/s, onnx 150k/s (1/2 of it), torchscript 250k/s (within 1.5x)
FIGURES = {"onnx": {"*": 150e3 * 64}, "onnx_opt": {"*": 300e3 * 64}, "torchscript": {"*": 250e3 * 64}}


def _flat(figures):  # the same inf/s at every batch size (FakeMeter's "*" scales with the batch)
    return {name: {"*": table["*"], **{b: table["*"] / 64 for b in SIZES}} for name, table in figures.items()}


def test_a_variant_far_behind_at_both_ends_is_not_measured_between(monkeypatch):
    said: list[str] = []
    meter = FakeMeter([_flat(FIGURES)])
    ctx = _context("throughput", meter, monkeypatch, said)
    assert benchmark.run(ctx).status is Status.OK
    measured = {b: names for _, b, names in meter.calls}
    assert measured[1] == measured[64] == ["onnx", "onnx_opt", "torchscript"]
    assert all(measured[b] == ["onnx_opt", "torchscript"] for b in (2, 4, 8, 16, 32))
    assert ("    batch 2, 4, 8, 16, 32: not measuring onnx (below 1/1.5 of onnx_opt's 300k inf/s (batch 64) at "
            "batch 1 and 64)") in said
    onnx = ctx.variant("onnx").benchmark
    assert sorted(onnx["throughput_by_batch"]) == [1, 64] and onnx["best_throughput"] == 150e3
    assert onnx["not_measured"] == {"batches": [2, 4, 8, 16, 32], "why": (
        "below 1/1.5 of onnx_opt's 300k inf/s (batch 64) at batch 1 and 64: cannot win at the batch sizes between")}
    assert "not_measured" not in ctx.variant("torchscript").benchmark
    assert any(line.startswith("| onnx | 150000 | - | - |") for line in _measurement_lines(ctx))


def test_every_batch_size_is_measured_where_the_ranking_reads_them_all(monkeypatch):
    for objective, pipeline in (("latency", None), ("throughput", object())):
        said: list[str] = []
        meter = FakeMeter([_flat(FIGURES)])
        ctx = _context(objective, meter, monkeypatch, said)
        ctx.pipeline = pipeline  # a text pipeline ranks by how each variant batches as served
        if pipeline is not None:
            monkeypatch.setattr(benchmark, "time_steps", lambda pipeline, seconds: {})
        assert benchmark.run(ctx).status is Status.OK
        assert all(names == ["onnx", "onnx_opt", "torchscript"] for _, _, names in meter.calls), objective
        assert not any("not measuring" in s for s in said)


def test_the_leader_is_a_variant_that_may_be_published():
    rates = {"onnx": {1: 100.0, 64: 120.0}, "onnx_opt": {1: 300.0, 64: 310.0}, "torchscript": {1: 150.0, 64: 200.0}}
    assert benchmark.far_behind(rates, {"onnx", "onnx_opt", "torchscript"}) == (
        ["onnx", "torchscript"], "below 1/1.5 of onnx_opt's 310 inf/s (batch 64) at batch 1 and 64")
    # onnx_opt kept only as the base of another variant: the best publishable one leads
    assert benchmark.far_behind(rates, {"onnx", "torchscript"}) == (
        ["onnx"], "below 1/1.5 of torchscript's 200 inf/s (batch 64) at batch 1 and 64")
    assert benchmark.far_behind(rates, set()) == ([], "")
    assert benchmark.far_behind({"onnx": {1: 100.0}, "onnx_opt": {1: 140.0}}, {"onnx", "onnx_opt"}) == ([], "")
