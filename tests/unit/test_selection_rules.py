"""Selection and measuring rules on hand-made measurements (deterministic on a busy machine): the
objective picks among eligible variants, windows stop once stable, round robin takes turns.
Split from test_variants.py, which builds the digits CNN for real."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from builder.model.measure import Window, batch_sizes, human, is_stable, least_disturbed, measure, measure_round_robin, within
from builder.stages import select
from builder.spec.model import load_spec
from builder.stages.base import BuildContext, BuildOptions, Status, Variant
from tests.conftest import EXAMPLES

# ------------------------------------------------------------------------------------------------
# selection on hand-made measurements (deterministic)


def _variant(name, p50, ips, drop=0.0, verified=True, precision="fp32"):
    v = Variant(name, "onnx", precision, Path(f"/nonexistent/{name}.onnx"), verified=verified)
    v.accuracy = {"metric": "top1", "drop": drop}
    v.benchmark = {"latency_ms_b1": {"p50": p50, "p95": p50 * 1.2, "p99": p50 * 1.5}, "best_throughput": ips,
                   "best_batch": 64, "throughput_by_batch": {1: 1000 / p50, 64: ips}}
    return v


def _context(objective="throughput", base_only=None) -> BuildContext:
    spec = load_spec(EXAMPLES / "digits" / "spec.yaml")
    spec.objective = objective
    ctx = BuildContext(spec=spec, options=BuildOptions(repository=Path("/nonexistent")), workdir=Path("/nonexistent"))
    ctx.base_only = base_only or {}
    return ctx


def test_select_latency_objective_lowest_p50_among_eligible():
    ctx = _context("latency")
    ctx.variants = [_variant("onnx", 0.30, 6000), _variant("onnx_opt", 0.25, 5000),
                    _variant("onnx_int8_static", 0.10, 9000, drop=1.5, precision="int8"),  # over the drop limit
                    _variant("torchscript", 0.05, 1000, verified=False)]  # failed verification
    ctx.variants[3].rejected = "failed verification:\n- logits: rel L2 1e-01 > 1e-05"
    assert select.run(ctx).status is Status.OK
    assert ctx.selected.name == "onnx_opt"
    assert ctx.selected.selection_reason.startswith("selected: lowest p50 latency (p50 0.250 ms at batch 1)")
    static = ctx.variant("onnx_int8_static")
    assert not static.selected and static.rejected == "accuracy drop 1.50 points > 1.0 allowed"
    assert static.selection_reason.startswith("rejected: accuracy drop 1.50 points > 1.0 allowed (p50 0.100 vs")
    assert ctx.variant("onnx").selection_reason == \
        "rejected: 1.2x slower than onnx_opt (p50 0.300 vs 0.250 ms at batch 1)"
    assert ctx.variant("torchscript").selection_reason == "rejected: failed verification"


def test_select_throughput_names_the_measurement_and_ignores_base_only():
    ctx = _context("throughput", base_only={"onnx": ["onnx_int8_dynamic", "onnx_int8_static"]})
    ctx.variants = [_variant("onnx", 0.2, 63000), _variant("onnx_int8_dynamic", 0.9, 12000, precision="int8"),
                    _variant("onnx_int8_static", 0.1, 61000, drop=0.3, precision="int8")]
    select.run(ctx)
    assert ctx.selected.name == "onnx_int8_static"  # onnx is faster but only a base: never selected
    assert ctx.variant("onnx").rejected == "not requested; base for onnx_int8_dynamic, onnx_int8_static"
    assert ctx.variant("onnx_int8_dynamic").selection_reason == \
        "rejected: 5.1x slower than onnx_int8_static (measured 12k vs 61k inf/s)"
    reason = ctx.selected.selection_reason
    assert reason.startswith("selected: highest throughput (61k inf/s at batch 64); 0.97x the throughput of onnx")
    assert reason.endswith("accuracy drop +0.30 points (limit 1.0)")


def test_select_fails_when_nothing_is_eligible():
    ctx = _context()
    ctx.variants = [_variant("onnx_int8_static", 0.1, 9000, drop=3.0)]
    result = select.run(ctx)
    assert result.status is Status.FAIL and ctx.selected is None


# ------------------------------------------------------------------------------------------------
# the stability rule (builder/model/measure.py)


def test_stability_rule_last_three_within_ten_percent():
    assert is_stable([100, 104, 98])  # 104 / 98 = 1.061
    assert is_stable([50, 300, 100, 105, 109])  # only the last three count
    assert not is_stable([100, 111, 100])  # 1.11 > 1.10
    assert not is_stable([100, 100])  # fewer than three windows
    assert not is_stable([100, 100, 100], latencies=[1.0, 1.0, 1.2])  # latency must settle too
    assert is_stable([100, 100, 100], latencies=[1.0, 1.05, 1.02])
    assert is_stable([100, 114, 100], tolerance=0.15) and not is_stable([100, 109, 100], windows=4)
    assert within([1.0, 1.1]) and not within([0.0, 1.0]) and not within([])


class FakeModel:
    """A scripted machine: call i takes ``per_call[i // 10]`` seconds on a fake clock. With
    window_seconds=0 and min_calls=10 every measuring window is exactly 10 calls."""

    def __init__(self, per_call_by_window):
        self.now = 0.0
        self.calls = 0
        self.per_call = per_call_by_window

    def clock(self):
        return self.now

    def __call__(self):
        self.now += self.per_call[min(self.calls // 10, len(self.per_call) - 1)]
        self.calls += 1


def test_measure_stops_once_stable():
    # two disturbed windows, then three that agree within 10 %; the 6th (slow) one is never run
    model = FakeModel([0.03, 0.02, 0.010, 0.0102, 0.0099, 0.05])
    m = measure(model, 4, window_seconds=0, max_seconds=100, min_calls=10, clock=model.clock)
    assert m.stable and len(m.windows) == 5 and model.calls == 50
    assert [round(w.throughput) for w in m.windows] == [133, 200, 400, 392, 404]
    assert m.used == m.windows[-3:]
    assert m.throughput == pytest.approx(120 / (0.1 + 0.102 + 0.099))
    assert m.percentiles_ms()["p50"] == pytest.approx(10.0)


def test_measure_caps_time_and_reports_the_fastest_windows():
    # alternating 10 ms / 20 ms calls: window throughputs 100, 50, 100, 50, ... never settle
    model = FakeModel([0.01, 0.02] * 50)
    m = measure(model, 1, window_seconds=0, max_seconds=0.9, min_calls=10, clock=model.clock)
    assert not m.stable
    assert 0.9 - 1e-9 <= model.now <= 1.1 + 1e-9  # stops after the window under way
    assert len(m.used) == 3 and all(w.throughput == pytest.approx(100) for w in m.used)
    assert m.spread == pytest.approx(0.0, abs=1e-9)


def test_round_robin_takes_turns_and_stops_each_on_its_own():
    clock = [0.0]
    order = []

    def model(name, per_call):
        def call():
            clock[0] += per_call(len([o for o in order if o == name]))
            order.append(name)
        return call

    steady = model("steady", lambda i: 0.01)
    jumpy = model("jumpy", lambda i: 0.01 if (i // 10) % 2 == 0 else 0.03)  # windows of 10 calls alternate
    result = measure_round_robin({"steady": steady, "jumpy": jumpy}, 2, window_seconds=0, min_calls=10,
                                 max_seconds={"steady": 10.0, "jumpy": 1.0}, clock=lambda: clock[0])
    assert result["steady"].stable and len(result["steady"].windows) == 3
    assert order[:40] == ["steady"] * 10 + ["jumpy"] * 10 + ["steady"] * 10 + ["jumpy"] * 10  # in turns
    jumpy_m = result["jumpy"]
    assert not jumpy_m.stable and sum(w.seconds for w in jumpy_m.windows) >= 1.0
    assert all(w.throughput == pytest.approx(200) for w in jumpy_m.used)  # the 3 fastest windows


def test_least_disturbed_and_batch_sizes():
    windows = [Window(1, 1, s) for s in (1.0, 0.5, 2.0, 0.4, 0.6)]
    assert [w.seconds for w in least_disturbed(windows)] == [0.5, 0.4, 0.6]
    assert batch_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_sizes(24) == [1, 2, 4, 8, 16, 24]
    assert batch_sizes(0) == [1] and batch_sizes(1) == [1]
    assert human(6300) == "6.3k" and human(1.25e6) == "1.25M" and human(950) == "950"
    assert human(999.7) == "1k" and human(999_700) == "1M" and human(123456) == "123k" and human(61000) == "61k"
    assert np.isclose(Window(5, 20, 0.5).throughput, 40)
