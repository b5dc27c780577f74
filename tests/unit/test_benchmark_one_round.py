"""A close call is measured again, and then every ranked figure and every ratio comes from that one round
(builder/stages/benchmark.py confirm_round): the pair's second figures are never ranked against the others'
first ones. The measuring is injected: a fake ``measure_round_robin`` answers from a table per round (the
n-th time a batch size is measured is round n), so nothing depends on this host's speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.model.measure import Measurement, Window
from builder.pipeline import BuildOptions
from builder.report.build_report import variant_rows
from builder.spec.model import load_spec
from builder.stages import benchmark, select
from builder.stages.base import BuildContext, Status, Variant
from tests.conftest import EXAMPLES

FP32 = 3e-7  # every variant within float32 rounding: the fastest wins, no tie rule in the way


def _measurement(ips: float, items_per_call: int) -> Measurement:
    """Three identical 1-second windows at ``ips`` inferences/s (spread 0: stable)."""
    ms = 1e3 * items_per_call / ips
    windows = [Window(calls=10, items=int(round(ips)), seconds=1.0, latencies_ms=[ms] * 10) for _ in range(3)]
    return Measurement(windows, True, windows)


class FakeMeter:
    """Stands in for ``measure_round_robin``: the figure of ``name`` at batch ``b`` in round ``r`` is
    ``rounds[r][name][b]``, else ``rounds[r][name]["*"] * b / 64`` (lower than batch 64 below it)."""

    def __init__(self, rounds: list[dict[str, dict]]):
        self.rounds, self.seen, self.calls, self.caps = rounds, {}, [], []

    def __call__(self, calls, items_per_call=1, *, window_seconds, max_seconds, **_):
        r = self.seen[items_per_call] = self.seen.get(items_per_call, -1) + 1
        self.calls.append((r, items_per_call, sorted(calls)))
        self.caps.append(max_seconds)
        out = {}
        for name in calls:
            table = self.rounds[r][name]
            out[name] = _measurement(table.get(items_per_call, table["*"] * items_per_call / 64), items_per_call)
        return out


def _context(objective: str, figures: FakeMeter, monkeypatch, said: list[str]) -> BuildContext:
    spec = load_spec(EXAMPLES / "digits" / "spec.yaml")  # max_batch_size 64: batches 1, 2, 4, ... 64
    spec.objective = objective

    monkeypatch.setattr(benchmark, "measure_round_robin", figures)
    monkeypatch.setattr(benchmark, "_open", lambda ctx, variant, feeds, sizes, threads: (
        (lambda feed: None), {"load_seconds": 0.0, "peak_memory_mb": 1.0}))
    ctx = BuildContext(spec=spec, options=BuildOptions(repository=Path("/nonexistent"), benchmark_seconds=0.5),
                       workdir=Path("/nonexistent"), progress=said.append)
    for name in ("onnx", "onnx_opt", "torchscript"):
        v = Variant(name, "onnx", "fp32", Path(f"/nonexistent/{name}.onnx"), verified=True)
        v.accuracy = {"metric": "top1", "drop": 0.0}
        v.verification = {"metrics": {"logits": {"rel_l2": FP32, "max_abs": 0.0}}}
        ctx.variants.append(v)
    return ctx


# First round: onnx_opt leads torchscript by 2.9 % (a close call); onnx is 8 % behind. Measured again side
# by side at batch 64, onnx_opt 99k, onnx 95k, torchscript 88k: onnx_opt is 1.04x onnx, not 1.08x, and
# onnx's first-round 100k would have beaten onnx_opt's second-round 99k. torchscript's first-round 95k at
# batch 32 (not measured again) is higher than its second-round best: it must not be ranked either.
ROUNDS = [{"onnx": {"*": 100e3}, "onnx_opt": {"*": 108e3}, "torchscript": {"*": 105e3, 32: 95e3}},
          {"onnx": {"*": 95e3}, "onnx_opt": {"*": 99e3}, "torchscript": {"*": 88e3}}]


def test_published_variant_and_every_ratio_come_from_the_confirmation_round(monkeypatch):
    said: list[str] = []
    meter = FakeMeter(ROUNDS)
    ctx = _context("throughput", meter, monkeypatch, said)
    assert benchmark.run(ctx).status is Status.OK
    assert any("onnx_opt and torchscript are a close call: measuring all 3 variants again at batch 64" in s
               for s in said)
    # the confirmation round measured every variant, together, at the batch that decides
    assert meter.calls[-1] == (1, 64, ["onnx", "onnx_opt", "torchscript"])
    # the pair gets another cap (0.5 s); onnx what the first round gave it at batch 64 (1 share of 8)
    assert meter.caps[-1] == {"onnx": pytest.approx(0.5 / 8), "onnx_opt": 0.5, "torchscript": 0.5}
    for v in ctx.variants:
        bench = v.benchmark
        assert bench["best_batch"] == 64 and bench["best_throughput"] == ROUNDS[1][v.name]["*"]
        assert bench["confirmed"]["first_round"]["best_throughput"] == ROUNDS[0][v.name]["*"]
        assert bench["confirmed"]["pair"] == ["onnx_opt", "torchscript"]
        assert bench["confirmed"]["measured_with"] == ["onnx", "onnx_opt", "torchscript"]
    assert ctx.variant("torchscript").benchmark["throughput_by_batch"][32] == 95e3  # kept, shown, not ranked

    select.run(ctx)
    assert ctx.selected.name == "onnx_opt"  # onnx's first-round 100k would have won against the mix
    reason = ctx.selected.selection_reason
    assert reason.startswith("selected: highest throughput (99k inf/s at batch 64)")
    assert "1.04x the throughput of onnx" in reason  # 99k / 95k, both second round (mixed: 99k / 100k)
    assert "runner-up onnx within 4.2%" in reason
    assert ctx.variant("onnx").selection_reason == "rejected: 1.04x slower than onnx_opt (measured 95k vs 99k inf/s)"
    assert ctx.variant("torchscript").selection_reason == (
        "rejected: 1.1x slower than onnx_opt (measured 88k vs 99k inf/s)")
    rows = {r["variant"]: r for r in variant_rows(ctx)}
    assert rows["onnx_opt"]["x onnx"] == pytest.approx(99 / 95)
    assert rows["torchscript"]["x onnx"] == pytest.approx(88 / 95)


def test_no_close_call_means_one_round_and_no_confirmation(monkeypatch):
    said: list[str] = []
    rounds = [{"onnx": {"*": 100e3}, "onnx_opt": {"*": 130e3}, "torchscript": {"*": 105e3}}]
    meter = FakeMeter(rounds)
    ctx = _context("throughput", meter, monkeypatch, said)
    benchmark.run(ctx)
    assert not any("close call" in s for s in said) and {r for r, _, _ in meter.calls} == {0}
    assert all("confirmed" not in v.benchmark for v in ctx.variants)
    select.run(ctx)
    assert ctx.selected.name == "onnx_opt" and "1.3x the throughput of onnx" in ctx.selected.selection_reason


def test_latency_close_call_measures_batch_1_and_every_best_batch_again(monkeypatch):
    # p50 at batch 1 (1e3 / figure ms): onnx 1.000 ms vs onnx_opt 0.980 ms, a 2 % lead; side by side onnx
    # is the faster one at batch 1, and the throughput column ("x onnx") comes from that round too
    rounds = [{"onnx": {"*": 100e3, 1: 1000}, "onnx_opt": {"*": 110e3, 1: 1020}, "torchscript": {"*": 50e3, 1: 500}},
              {"onnx": {"*": 90e3, 1: 1010}, "onnx_opt": {"*": 99e3, 1: 970}, "torchscript": {"*": 60e3, 1: 400}}]
    meter = FakeMeter(rounds)
    ctx = _context("latency", meter, monkeypatch, [])
    benchmark.run(ctx)
    assert [(r, b) for r, b, _ in meter.calls if r == 1] == [(1, 1), (1, 64)]
    select.run(ctx)
    assert ctx.selected.name == "onnx"
    assert ctx.variant("onnx_opt").selection_reason == (
        "rejected: 1.04x slower than onnx (p50 1.031 vs 0.990 ms at batch 1)")
    rows = {r["variant"]: r for r in variant_rows(ctx)}
    assert rows["onnx_opt"]["x onnx"] == pytest.approx(99 / 90)


def test_a_variant_that_fails_when_measured_again_is_not_ranked_on_its_first_figures(monkeypatch):
    said: list[str] = []
    meter = FakeMeter(ROUNDS)
    ctx = _context("throughput", meter, monkeypatch, said)
    real_group = benchmark.benchmark_group

    def group(ctx, members, cap, threads, failed, batches=None, *args, **kwargs):
        if batches is not None:  # the confirmation round: onnx cannot be loaded again
            failed["onnx"] = "model file vanished"
            members = [v for v in members if v.name != "onnx"]
        return real_group(ctx, members, cap, threads, failed, batches, *args, **kwargs)

    monkeypatch.setattr(benchmark, "benchmark_group", group)
    benchmark.run(ctx)
    onnx = ctx.variant("onnx")
    assert onnx.benchmark is None
    assert "benchmark failed: when measured again (a close call): model file vanished" in onnx.notes
    select.run(ctx)
    assert ctx.selected.name == "onnx_opt"
    assert "x the throughput of onnx" not in ctx.selected.selection_reason
    assert ctx.variant("torchscript").selection_reason == (
        "rejected: 1.1x slower than onnx_opt (measured 88k vs 99k inf/s)")


def test_confirmation_batches_are_the_decisive_ones_and_every_best_batch():
    def v(best):
        out = Variant("x", "onnx", "fp32", Path("x.onnx"))
        out.benchmark = {"best_batch": best}
        return out

    assert benchmark.confirmation_batches([v(64), v(32), v(64)], [32, 64]) == [32, 64]
    assert benchmark.confirmation_batches([v(64), v(16)], [1]) == [1, 16, 64]
