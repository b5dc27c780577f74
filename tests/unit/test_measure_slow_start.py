"""A slow start (TorchScript's profiling executor: the first calls ran 100-1000x slower than the rest) is
left out of `select`'s in-process figures and of builder/model/measure.py's windows where a comparison asks for
AFTER_SLOW_START windows. A fake clock moved only by the fake model: nothing depends on this host's speed."""

from __future__ import annotations

import numpy as np
import pytest

from builder.model.measure import AFTER_SLOW_START, WARMUP_CALLS, measure, warm_up
from builder.repository.reselect import default_measure


class _Model:
    """Takes ``slow`` s a call for its first ``slow_calls`` calls, then ``fast`` s (on ``self.now``)."""

    def __init__(self, slow_calls: int, fast: float, slow: float = 0.11):
        self.now, self.calls, self.slow_calls, self.fast, self.slow = 0.0, 0, slow_calls, fast, slow

    def clock(self) -> float:
        return self.now

    def __call__(self, inputs=None):
        self.calls += 1
        self.now += self.slow if self.calls <= self.slow_calls else self.fast
        return {"y": np.zeros(1)}


INPUTS = {"x": np.zeros((1, 4), np.float32)}


# WARMUP_CALLS + 3: past the warm-up, one whole window of slow calls, which the fastest-windows rule drops
@pytest.mark.parametrize("slow_calls", [0, WARMUP_CALLS, WARMUP_CALLS + 3])
def test_select_measures_the_steady_speed_after_a_slow_start(slow_calls):
    model = _Model(slow_calls, fast=0.001)
    # --seconds 0.5 as the probe ran it: the figure read 8.8 inf/s, p50 112 ms for a 0.2 ms model
    measured = default_measure(0.5, clock=model.clock)("m/1", model, INPUTS, 2)
    assert measured["p50_ms"] == pytest.approx(1.0)
    assert measured["throughput"] == pytest.approx(1000.0)


def test_select_still_sees_a_model_that_is_slow_throughout():
    model = _Model(0, fast=0.11)
    measured = default_measure(0.5, clock=model.clock)("m/1", model, INPUTS, 2)
    assert measured["p50_ms"] == pytest.approx(110.0)


def test_warm_up_calls_the_builds_count_and_min_windows_outlasts_the_cap():
    model = _Model(5, fast=0.001)
    warm_up(model)
    assert model.calls == WARMUP_CALLS
    # two slow calls are left: one window of 3 calls (0.221 s) would be all a 0.1 s cap allows
    once = measure(model, window_seconds=0.02, max_seconds=0.1, clock=model.clock)
    assert len(once.windows) == 1 and once.percentiles_ms()["p50"] == pytest.approx(110.0)
    model = _Model(5, fast=0.001)
    warm_up(model)
    kept = measure(model, window_seconds=0.02, max_seconds=0.1, min_windows=AFTER_SLOW_START, clock=model.clock)
    assert len(kept.windows) >= AFTER_SLOW_START and kept.percentiles_ms()["p50"] == pytest.approx(1.0)
