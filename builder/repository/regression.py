"""Regression per version: a version against the one published before it, on the NEW version's stored
reference inputs - its outputs vs the previous model's outputs, task accuracy (recorded at build time
on the validation data), and latency measured now on this host (both models in-process, measured
round-robin so a burst of load falls on both alike). ``validate`` shows it; ``--max-regression``
turns it into a gate (exit 1 beyond a limit).

Limits (``--max-regression latency=20,accuracy=0.5,rel_l2=1e-3``; any subset):
  latency   percent slower than the previous version (p50 per reference case, batch as stored)
  accuracy  percentage points of task accuracy lost (the spec's metric, e.g. top1)
  rel_l2    relative L2 distance between the two versions' outputs (worst output and case)

Usage::

    result = compare_with_previous(Path("model_repository/digits_cnn"), 3, limits={"latency": 20.0})
    result.lines(), result.failures
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from builder.accuracy.tensors import UNMEASURED, compare_outputs, merge_case_metrics
from builder.core.errors import UserInputError
from builder.model.measure import AFTER_SLOW_START, measure_round_robin, warm_up
from builder.model.runtime import open_runner
from builder.repository.layout import existing_versions
from builder.repository.metadata import numeric_output_names, read_metadata, read_reference

LIMIT_KEYS = {"latency": "percent slower", "accuracy": "percentage points lost", "rel_l2": "relative L2 distance"}


def parse_limits(text: str | None) -> dict[str, float]:
    """``latency=20,accuracy=0.5,rel_l2=1e-3`` -> {"latency": 20.0, ...}; errors name --max-regression.
    None: no gate. An empty or blank value is an error, not "no gate": it is what a CI job's unset
    variable passes (--max-regression "$LIMITS"), and a gate silently off would pass every regression."""
    if text is None:
        return {}
    form = (f"KEY=NUMBER[,KEY=NUMBER...] (finite, >= 0) with KEY one of "
            f"{', '.join(f'{k} ({v})' for k, v in LIMIT_KEYS.items())}; e.g. --max-regression latency=20,accuracy=0.5")
    if not text.strip():
        raise UserInputError(f"--max-regression is empty (an unset variable?): give {form}, or leave the flag out "
                             "for no gate")
    limits: dict[str, float] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key in limits:  # accuracy=0.5,accuracy=3 kept the last one: which did the user mean?
            raise UserInputError(f"--max-regression: {key} is given twice ({text.strip()!r}); give each limit once")
        try:
            if key not in LIMIT_KEYS:
                raise ValueError
            limits[key] = float(value.strip().rstrip("%"))
            if not math.isfinite(limits[key]) or limits[key] < 0:  # nan/inf would switch the gate off
                raise ValueError
        except ValueError:
            raise UserInputError(f"--max-regression: {part.strip()!r} is not {form}") from None
    return limits


@dataclass
class RegressionCheck:
    version: int
    previous: int
    outputs: dict[str, dict[str, float]] = field(default_factory=dict)  # new vs previous, worst over cases
    accuracy: dict[str, Any] = field(default_factory=dict)  # metric, previous, new, change_pp
    latency_ms: dict[str, float] = field(default_factory=dict)  # previous, new (p50), change_pct
    skipped: str = ""
    failures: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        head = f"regression: version {self.version} vs version {self.previous}"
        if not self.previous:  # the first version: the limits had nothing to compare with
            return [f"regression: version {self.version}: not compared ({self.skipped})"]
        if self.skipped:
            return [f"{head}: not compared ({self.skipped})"]
        out = [f"{head}:"]
        for name, m in self.outputs.items():
            out.append(f"  outputs  {name}: rel L2 {m.get('rel_l2', float('nan')):.1e}, max abs "
                       f"{m.get('max_abs', float('nan')):.1e}")
        if self.accuracy:
            a = self.accuracy
            out.append(f"  accuracy {a['metric']}: {a['previous']:.2f} -> {a['new']:.2f} ({a['change_pp']:+.2f} pp)")
        if self.latency_ms:
            t = self.latency_ms
            out.append(f"  latency  p50 {t['previous']:.3f} -> {t['new']:.3f} ms ({t['change_pct']:+.1f} %, this host)")
        out.extend(f"  - REGRESSION {line}" for line in self.failures)
        return out


def _accuracy(meta: dict[str, Any]) -> tuple[str, float] | None:
    record = meta.get("accuracy") or {}
    if isinstance(record.get("variant"), (int, float)):
        return str(record.get("metric", "accuracy")), float(record["variant"])
    return None


def compare_with_previous(model_folder: Path, version: int, limits: dict[str, float] | None = None,
                          seconds: float = 1.0, *,
                          clock: Callable[[], float] = time.perf_counter) -> RegressionCheck | None:
    """The comparison of ``version`` with the version before it (None when it is the first); ``clock``
    times the latency windows (injectable: tests)."""

    limits = limits or {}
    older = [v for v in existing_versions(model_folder) if v < version]
    if not older:
        return None
    check = RegressionCheck(version, older[-1])
    new_dir, old_dir = model_folder / str(version), model_folder / str(older[-1])
    new_meta, old_meta = read_metadata(new_dir / "metadata.yaml"), read_metadata(old_dir / "metadata.yaml")
    formats = {new_meta["artifact"]["format"], old_meta["artifact"]["format"]}
    if "plan" in formats:
        check.skipped = "a TensorRT plan: compare on the GPU host"
        return check
    inputs = [i["name"] for i in new_meta["spec"]["inputs"]]
    outputs = numeric_output_names(new_meta)  # compared as numbers (a folded label head's strings follow them)
    if inputs != [i["name"] for i in old_meta["spec"]["inputs"]] or outputs != numeric_output_names(old_meta):
        check.skipped = "the inputs or outputs changed between the versions"
        return check
    new_run = open_runner(new_meta["artifact"]["format"], new_dir / new_meta["artifact"]["file"], outputs, inputs, 1)
    old_run = open_runner(old_meta["artifact"]["format"], old_dir / old_meta["artifact"]["file"], outputs, inputs, 1)
    cases, _ = read_reference(new_dir / "reference.npz")
    check.outputs = merge_case_metrics([compare_outputs(old_run(c["inputs"]), new_run(c["inputs"])) for c in cases])
    new_acc, old_acc = _accuracy(new_meta), _accuracy(old_meta)
    if new_acc and old_acc and new_acc[0] == old_acc[0]:
        check.accuracy = {"metric": new_acc[0], "previous": old_acc[1], "new": new_acc[1],
                          "change_pp": new_acc[1] - old_acc[1]}
    if seconds > 0:
        def over(run):
            return lambda: [run(c["inputs"]) for c in cases]
        # untimed first calls, as the build's benchmark makes them: a TorchScript version read 100-600x
        # slow on its first calls, which waved a slower new version through and failed a faster one
        for run in (new_run, old_run):
            for case in cases:
                warm_up(lambda run=run, feed=case["inputs"]: run(feed))
        # room for AFTER_SLOW_START windows in the cap, so a slow start longer than the warm-up drops out
        measured = measure_round_robin({"new": over(new_run), "previous": over(old_run)}, len(cases),
                                       window_seconds=max(seconds / 2 / (AFTER_SLOW_START + 1), 0.02),
                                       max_seconds=seconds / 2, min_windows=AFTER_SLOW_START, clock=clock)
        new_ms = measured["new"].percentiles_ms()["p50"] / len(cases)
        old_ms = measured["previous"].percentiles_ms()["p50"] / len(cases)
        check.latency_ms = {"previous": old_ms, "new": new_ms, "change_pct": (new_ms / old_ms - 1) * 100}
    _gate(check, limits)
    return check


def _gate(check: RegressionCheck, limits: dict[str, float]) -> None:
    if "rel_l2" in limits:
        for name, m in check.outputs.items():
            # missing, reshaped or NaN/Inf in some case: no distance there, whatever the other cases read
            unmeasured = set(UNMEASURED) & set(m)
            distance = float("inf") if unmeasured else m.get("rel_l2", float("inf"))
            if not distance <= limits["rel_l2"]:
                check.failures.append(f"outputs {name}: rel L2 {distance:.1e} from version {check.previous} > "
                                      f"rel_l2={limits['rel_l2']:g}" + (f" ({', '.join(sorted(unmeasured))})"
                                                                        if unmeasured else ""))
    if "accuracy" in limits and check.accuracy and -check.accuracy["change_pp"] > limits["accuracy"]:
        a = check.accuracy
        check.failures.append(f"accuracy {a['metric']}: {a['change_pp']:+.2f} pp vs version {check.previous} "
                              f"(lost more than accuracy={limits['accuracy']:g} pp)")
    if "latency" in limits and check.latency_ms and check.latency_ms["change_pct"] > limits["latency"]:
        t = check.latency_ms
        check.failures.append(f"latency p50 {t['new']:.3f} ms vs {t['previous']:.3f} ms in version {check.previous}: "
                              f"{t['change_pct']:+.1f} % > latency={limits['latency']:g} % on this host")


def regression_vs_previous(model_folder: Path, version: int, limits: dict[str, float],
                           seconds: float = 1.0) -> RegressionCheck | None:
    """compare_with_previous for validate: a previous version that cannot be run is said, not raised
    (unless a limit was asked for: then it is a failure - the gate could not run)."""
    try:
        check = compare_with_previous(model_folder, version, limits, seconds)
        if check is None and limits:  # a CI gate that compared nothing says so (a wrong --version or folder)
            return RegressionCheck(version, 0, skipped=f"no version before {version} in {model_folder}: "
                                                       "the --max-regression limits were not applied")
        return check
    except Exception as err:  # noqa: BLE001 - an old version built by an older triton-builder, a missing file
        previous = max((v for v in existing_versions(model_folder) if v < version), default=0)
        check = RegressionCheck(version, previous, skipped=f"{type(err).__name__}: {err}")
        if limits:
            check.failures.append(f"could not compare with version {previous} ({check.skipped}); "
                                  "--max-regression needs both versions runnable here")
        return check
