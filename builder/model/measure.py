"""Measuring loops with perf_analyzer's stability rule, shared by the benchmark stage and sweeps.

A *window* calls the model back to back for ``window_seconds`` (and at least a few calls). Windows
repeat until the last three agree within 10 % - both throughput and p50 latency, as
perf_analyzer's ``--stability-percentage`` (max / min of the recent 3 within 10 %) - or until the
time cap. A measurement that never settles is flagged not stable and reports its three fastest
windows: interference from other processes only ever slows a window down, so the fastest windows
are the least disturbed ones.

Usage::

    m = measure(lambda: session.run(None, feed), items_per_call=8, window_seconds=0.1, max_seconds=2)
    m.stable, m.throughput, m.percentiles_ms()        # True, 5312.0, {"p50": 1.5, "p95": ..., "p99": ...}
    both = measure_round_robin({"a": call_a, "b": call_b}, 8, window_seconds=0.1, max_seconds=2)
    warm_up(lambda: run(feed))                         # before timing: WARMUP_CALLS calls, per input shape
    is_stable([100, 104, 98])                          # True: 104 / 98 = 1.06 <= 1.10
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from builder.core.host import usable_cores

STABLE_WINDOWS = 3
STABLE_TOLERANCE = 0.10
MIN_CALLS_PER_WINDOW = 3
# calls per input shape before any timed window (the benchmark stage's rule): TorchScript's profiling
# executor specialises per shape, and its first calls ran 100-1000x slower than the rest
WARMUP_CALLS = 3
# windows before a time cap may stop a measurement that compares with another: one more than the
# fastest-windows rule keeps, so a slow start that outlasted the warm-up falls out of the figure
AFTER_SLOW_START = STABLE_WINDOWS + 1


def within(values: Sequence[float], tolerance: float = STABLE_TOLERANCE) -> bool:
    """True when max / min of ``values`` is at most 1 + tolerance (all values positive)."""
    values = list(values)
    if not values or min(values) <= 0:
        return False
    return max(values) / min(values) <= 1.0 + tolerance


def is_stable(throughputs: Sequence[float], latencies: Sequence[float] | None = None, *,
              windows: int = STABLE_WINDOWS, tolerance: float = STABLE_TOLERANCE) -> bool:
    """perf_analyzer's rule: the last ``windows`` values agree within ``tolerance`` (max / min),
    for throughput and, when given, latency."""
    if len(throughputs) < windows:
        return False
    if not within(throughputs[-windows:], tolerance):
        return False
    return latencies is None or (len(latencies) >= windows and within(latencies[-windows:], tolerance))


@dataclass
class Window:
    calls: int
    items: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def throughput(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def p50_ms(self) -> float:
        return float(np.median(self.latencies_ms)) if self.latencies_ms else 0.0


@dataclass
class Measurement:
    windows: list[Window]
    stable: bool
    used: list[Window]  # the windows the figures are computed from

    @property
    def throughput(self) -> float:
        seconds = sum(w.seconds for w in self.used)
        return sum(w.items for w in self.used) / seconds if seconds > 0 else 0.0

    @property
    def spread(self) -> float:
        """max / min - 1 of the used windows' throughput (0.04 = 4 %)."""
        values = [w.throughput for w in self.used]
        return max(values) / min(values) - 1.0 if values and min(values) > 0 else float("inf")

    def percentiles_ms(self) -> dict[str, float]:
        latencies = np.array([x for w in self.used for x in w.latencies_ms])
        if latencies.size == 0:
            return {}
        return {"p50": float(np.percentile(latencies, 50)), "p95": float(np.percentile(latencies, 95)),
                "p99": float(np.percentile(latencies, 99)), "mean": float(latencies.mean())}


def least_disturbed(windows: list[Window], count: int = STABLE_WINDOWS) -> list[Window]:
    """The ``count`` windows with the highest throughput, in their original order."""
    chosen = sorted(range(len(windows)), key=lambda i: -windows[i].throughput)[:count]
    return [windows[i] for i in sorted(chosen)]


def warm_up(call: Callable[[], object], calls: int = WARMUP_CALLS) -> None:
    """Call ``call`` ``calls`` times untimed; once per input shape the measurement will use."""
    for _ in range(calls):
        call()


def run_window(call: Callable[[], object], items_per_call: int, window_seconds: float,
               min_calls: int = MIN_CALLS_PER_WINDOW, clock: Callable[[], float] = time.perf_counter) -> Window:
    latencies = []
    start = clock()
    now = start
    while len(latencies) < min_calls or now - start < window_seconds:
        before = clock()
        call()
        now = clock()
        latencies.append((now - before) * 1e3)
    return Window(len(latencies), len(latencies) * items_per_call, now - start, latencies)


def measure(call: Callable[[], object], items_per_call: int = 1, *, window_seconds: float, max_seconds: float,
            windows: int = STABLE_WINDOWS, tolerance: float = STABLE_TOLERANCE,
            min_calls: int = MIN_CALLS_PER_WINDOW, min_windows: int = 1,
            clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Repeat windows until the last ``windows`` are stable or ``max_seconds`` have passed (the
    window under way is finished; at least ``min_windows`` windows always run)."""
    done: list[Window] = []
    start = clock()
    while True:
        done.append(run_window(call, items_per_call, window_seconds, min_calls, clock))
        if is_stable([w.throughput for w in done], [w.p50_ms for w in done], windows=windows, tolerance=tolerance):
            return Measurement(done, True, done[-windows:])
        if clock() - start >= max_seconds and len(done) >= min_windows:
            return Measurement(done, False, least_disturbed(done, windows))


def measure_round_robin(calls: dict[str, Callable[[], object]], items_per_call: int = 1, *, window_seconds: float,
                        max_seconds: dict[str, float] | float, windows: int = STABLE_WINDOWS,
                        tolerance: float = STABLE_TOLERANCE, min_calls: int = MIN_CALLS_PER_WINDOW,
                        min_windows: int = 1,
                        clock: Callable[[], float] = time.perf_counter) -> dict[str, Measurement]:
    """``measure`` for several candidates at once, one window each in turn, so that a burst of
    load from other processes falls on all of them alike. Each stops on its own when stable or when
    its windows (at least ``min_windows``) add up to its ``max_seconds``."""
    caps = max_seconds if isinstance(max_seconds, dict) else {name: max_seconds for name in calls}
    done: dict[str, list[Window]] = {name: [] for name in calls}
    stable: dict[str, bool] = {}
    while len(stable) < len(calls):
        for name, call in calls.items():
            if name in stable:
                continue
            done[name].append(run_window(call, items_per_call, window_seconds, min_calls, clock))
            series = done[name]
            if is_stable([w.throughput for w in series], [w.p50_ms for w in series], windows=windows,
                         tolerance=tolerance):
                stable[name] = True
            elif sum(w.seconds for w in series) >= caps[name] and len(series) >= min_windows:
                stable[name] = False
    return {name: Measurement(done[name], stable[name],
                              done[name][-windows:] if stable[name] else least_disturbed(done[name], windows))
            for name in calls}


# ------------------------------------------------------------------------------------------------
# machine facts


def cpu_cores() -> int:
    """CPU cores this process may use: its affinity mask bounded by its cgroup CPU quota (builder/core/host.py
    usable_cores, what metadata's host profile records), so variants are measured on the threads they are
    recorded and served with."""

    return usable_cores()


def load_average() -> float | None:
    """The 1-minute load average (runnable processes), or None where the OS has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # pragma: no cover
        return None


def rss_mb() -> float:
    """The process's resident memory now, in MB (Linux /proc, else psutil, else the peak so far)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil
        return psutil.Process().memory_info().rss / 1e6
    except ImportError:  # pragma: no cover
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... up to max_batch_size (itself included); [1] for a model without a batch dim."""
    if max_batch_size <= 1:
        return [1]
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch_size]


def human(value: float) -> str:
    """Three significant digits with a k/M/G suffix: 6300 -> '6.3k', 1.25e6 -> '1.25M', 999.7 -> '1k'."""
    rounded = float(f"{value:.3g}")
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(rounded) >= limit:
            return f"{rounded / limit:g}{suffix}"
    return f"{rounded:g}"
