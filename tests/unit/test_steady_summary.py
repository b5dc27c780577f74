"""builder/tuning/steady.py's summary of a load through switches: failed requests and p99 inside vs outside a switch's
window, a kill window left out, and which version answered each second (no server: records made here)."""

from __future__ import annotations

import pytest

from builder.tuning.steady import Record, Switch, summarise


def _records():
    out = []
    for i in range(200):  # 20 s at 10 requests/s: version 1 until 10 s, then 2; slow and one failure at 10-11 s
        t = 1000.0 + i / 10
        switching = 1010.0 <= t < 1011.0
        out.append(Record(t, 0.050 if switching else 0.010, None if i == 101 else ("1" if t < 1010.5 else "2"),
                          "connection reset" if i == 101 else None))
    return out


def test_failures_and_p99_are_told_apart_inside_and_outside_a_switch():
    summary = summarise(_records(), [Switch("rollout", 1010.0, 1010.5, "2", settle_s=0.5)])
    assert (summary.requests, summary.failed, summary.failed_in_switch, summary.failed_outside) == (200, 1, 1, 0)
    assert summary.p99_outside_ms == pytest.approx(10.0) and summary.p99_during_ms == pytest.approx(50.0)
    assert summary.p99_ratio == pytest.approx(5.0)
    assert summary.switches == [{"kind": "rollout", "target": "2", "seconds": 0.5}]
    ten = next(p for p in summary.per_second if p["t"] == 10)
    assert ten["versions"] == {"1": 4, "2": 5} and ten["failed"] == 1
    assert "requests 200" in summary.lines()[0] and "failed 1 (during a switch 1, outside 0)" in summary.lines()[0]


def test_a_kill_window_is_left_out_and_a_switch_never_served_lasts_its_limit():
    summary = summarise(_records(), [], exclude=[(1009.55, 1011.45)])
    assert summary.failed == 0 and summary.requests == 181
    assert Switch("rollback", 1000.0, None).window(limit_s=30.0) == (1000.0, 1030.0)
