"""The typed results of ``builder.loadtest``, ``builder.sweep`` and ``builder.tune`` (builder/api.py returns
them; ``import builder`` exports them): the main figures as fields, ``raw`` the full dict the CLI writes as JSON.

Usage::

    result = LoadTestResult.from_summary(summary)     # summary.json's dict
    result.ok, result.rps, result.p99_ms
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoadTestResult", "SweepResult", "TuneResult"]


@dataclass
class LoadTestResult:
    """What ``loadtest`` measured (client side, Locust) and its verdict; ``raw``: the full summary
    (``summary.json``: the server's view, the files, the settings)."""

    model: str
    url: str
    protocol: str
    requests: int
    failures: int
    rps: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    slo_met: bool
    slo_broken: list[str]
    exit_code: int  #: the CLI's: 0 ok, 1 an SLO broken or a timeout, 2 the server went away
    timed_out: bool
    files: dict[str, str]
    raw: dict[str, Any] = field(repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> "LoadTestResult":
        slo = summary.get("slo") or {}
        return cls(model=summary["model"], url=summary["url"], protocol=summary["protocol"],
                   requests=int(summary.get("requests") or 0), failures=int(summary.get("failures") or 0),
                   rps=float(summary.get("rps") or 0.0), p50_ms=summary.get("p50_ms"), p95_ms=summary.get("p95_ms"),
                   p99_ms=summary.get("p99_ms"), slo_met=bool(slo.get("met")), slo_broken=list(slo.get("broken") or []),
                   exit_code=int(summary["exit_code"]), timed_out=bool(summary.get("timed_out")),
                   files=dict(summary.get("files") or {}), raw=summary)


@dataclass
class SweepResult:
    """One row per concurrency level (``levels``: throughput_rps, p50/p90/p95/p99_ms, failures, stable,
    the server's queue/compute time and batch sizes); ``raw``: the full result (``sweep.json``)."""

    model: str
    url: str
    protocol: str
    engine: str  #: perf_analyzer or python
    client: str  #: the measuring client, in words
    levels: list[dict[str, Any]]
    files: dict[str, str]
    raw: dict[str, Any] = field(repr=False)

    @property
    def best(self) -> dict[str, Any] | None:
        """The level with the highest throughput and no failed request (None: every level failed)."""
        good = [row for row in self.levels if not row.get("failures")]
        return max(good, key=lambda row: row.get("throughput_rps") or 0.0) if good else None

    @property
    def ok(self) -> bool:
        """No level had a failed request (the CLI's exit 0)."""
        return not any(row.get("failures") for row in self.levels)

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> "SweepResult":
        return cls(model=result["model"], url=result["url"], protocol=result["protocol"], engine=result["engine"],
                   client=result.get("client") or "", levels=list(result["levels"]),
                   files=dict(result.get("files") or {}), raw=result)


@dataclass
class TuneResult:
    """The config ``tune`` chose: ``winner`` (None: no candidate met the budget), its ``ratios`` to the
    baselines, the printable ``table`` and ``summary`` line; ``raw``: the full record (``tuning.json``)."""

    model: str
    p99_budget_ms: float
    winner: dict[str, Any] | None
    ratios: dict[str, float | None]
    summary: str
    table: list[str]
    written: bool  #: the winner went into the repository (write= or publish=)
    exit_code: int  #: the CLI's: 0 a winner met the budget, 1 none did
    raw: dict[str, Any] = field(repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "TuneResult":
        return cls(model=record["model"], p99_budget_ms=record["p99_budget_ms"], winner=record.get("winner"),
                   ratios=dict(record.get("ratios") or {}), summary=record.get("summary") or "",
                   table=list(record.get("table") or []), written=bool(record.get("written")),
                   exit_code=int(record["exit_code"]), raw=record)
