"""Steady closed-loop load that records every request - when it was sent, how long it took, whether it failed and
which model version answered (the response's ``model_version``) - for measuring what clients see while a new
version or a rollback lands (benchmarks/rollouts.py, benchmarks/soak.py, tests/integration/test_rollouts.py).

Usage::

    with SteadyLoad(server.grpc_url, "grpc", "digits_cnn", [{"image": x}], concurrency=16) as load:
        ...                                   # publish, roll back, reload
        switches.append(Switch("rollout", began, ended, target_version))
    summary = summarise(load.records, switches)
    summary.lines()   # failed requests, p99 during vs outside a switch, which version answered each second
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from builder.serving.client import TritonClient


@dataclass
class Record:
    start: float  #: time.time() when sent
    latency_s: float
    version: str | None  #: the answering model version (None: failed)
    error: str | None = None


@dataclass
class Switch:
    kind: str  #: "rollout" | "rollback" | "kill" | ...
    began: float  #: time.time() when the change started (before the publish / config write)
    ended: float | None = None  #: when it was seen served (the target version answered), None: never
    target: str | None = None
    settle_s: float = 1.0  #: the window lasts this long after ``ended``

    def window(self, limit_s: float = 30.0) -> tuple[float, float]:
        end = (self.ended if self.ended is not None else self.began + limit_s) + self.settle_s
        return self.began, min(end, self.began + limit_s)


def _answered_version(result) -> str | None:
    response = result.get_response()
    if isinstance(response, dict):
        return str(response.get("model_version") or "")
    return str(getattr(response, "model_version", "") or "")


class _Worker(threading.Thread):
    def __init__(self, url: str, protocol: str, model: str, requests, offset: int, timeout: float, pause_s: float):
        super().__init__(daemon=True)
        self.url, self.protocol, self.model, self.requests = url, protocol, model, requests
        self.offset, self.timeout, self.pause_s = offset, timeout, pause_s
        self.records: list[Record] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        client = None
        index = self.offset
        while not self.stop_flag.is_set():
            sent, began = time.time(), time.perf_counter()
            try:
                if client is None:
                    client = TritonClient(self.url, self.protocol, network_timeout=self.timeout)
                    prepared = [client.prepare(r) for r in self.requests]
                result = client.send(self.model, prepared[index % len(prepared)])
                self.records.append(Record(sent, time.perf_counter() - began, _answered_version(result)))
            except Exception as exc:  # noqa: BLE001 - a failed request is data
                self.records.append(Record(sent, time.perf_counter() - began, None, " ".join(str(exc).split())[:160]))
                if client is not None:
                    client.close()
                client = None  # a fresh connection after a failure (a restarted server)
                time.sleep(0.05)
            index += 1
            if self.pause_s:
                time.sleep(self.pause_s)
        if client is not None:
            client.close()


class SteadyLoad:
    """``concurrency`` closed-loop workers (one TritonClient each) on ``model`` until the block ends;
    ``pause_s`` between a worker's requests makes it light load."""

    def __init__(self, url: str, protocol: str, model: str, requests: list[dict[str, np.ndarray]], *,
                 concurrency: int = 16, timeout: float = 30.0, pause_s: float = 0.0):
        self.workers = [_Worker(url, protocol, model, requests, i * 7, timeout, pause_s) for i in range(concurrency)]

    def __enter__(self) -> "SteadyLoad":
        for worker in self.workers:
            worker.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop_flag.set()
        for worker in self.workers:
            worker.join(60)

    @property
    def records(self) -> list[Record]:
        return sorted((r for w in self.workers for r in list(w.records)), key=lambda r: r.start)

    def last_version(self) -> str | None:
        """The version of the latest answered request."""
        done = [w.records[-1] for w in self.workers if w.records and w.records[-1].version]
        return max(done, key=lambda r: r.start).version if done else None

    def wait_for_version(self, version: str, timeout: float = 60.0, since: float | None = None) -> float | None:
        """When (time.time()) ``version`` first answered a request sent after ``since``, waiting up to ``timeout``
        s; None if it did not."""
        deadline = time.time() + timeout
        since = since if since is not None else 0.0
        while time.time() < deadline:
            seen = [r.start + r.latency_s for w in self.workers for r in list(w.records)[-50:]
                    if r.version == version and r.start >= since]
            if seen:
                return min(seen)
            time.sleep(0.05)
        return None


@dataclass
class LoadSummary:
    requests: int
    failed: int
    failed_in_switch: int
    failed_outside: int
    p99_outside_ms: float | None
    p99_during_ms: float | None
    rps: float
    per_second: list[dict[str, Any]] = field(default_factory=list)  #: {"t": s from start, "versions": {v: n}, "failed": n}
    errors: list[str] = field(default_factory=list)
    switches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def p99_ratio(self) -> float | None:
        if not self.p99_during_ms or not self.p99_outside_ms:
            return None
        return self.p99_during_ms / self.p99_outside_ms

    def lines(self, timeline: bool = True) -> list[str]:
        ratio = f"{self.p99_ratio:.2f}x" if self.p99_ratio else "n/a"
        out = [f"requests {self.requests} ({self.rps:.0f}/s), failed {self.failed} (during a switch "
               f"{self.failed_in_switch}, outside {self.failed_outside})",
               f"p99 outside a switch {_ms(self.p99_outside_ms)}, during a switch {_ms(self.p99_during_ms)} "
               f"(ratio {ratio})"]
        out += [f"  {e}" for e in self.errors]
        for s in self.switches:
            out.append(f"  {s['kind']:<8} -> version {s['target']}: served after {s['seconds']} s")
        if timeline:
            out.append("second  versions answering (requests)  failed")
            out += [f"{p['t']:>6}  {', '.join(f'v{v}: {n}' for v, n in sorted(p['versions'].items())) or '-':<30}"
                    f"  {p['failed'] or ''}" for p in self.per_second]
        return out


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def summarise(records: list[Record], switches: list[Switch], exclude: list[tuple[float, float]] = ()) -> LoadSummary:
    """Failed requests and p99 inside vs outside the switches' windows, and which version answered each second;
    ``exclude``: windows left out of everything but the counts (a server kill)."""
    windows = [s.window() for s in switches]

    def inside(t: float, spans) -> bool:
        return any(a <= t <= b for a, b in spans)
    kept = [r for r in records if not inside(r.start, exclude)]
    during = [r for r in kept if inside(r.start, windows)]
    outside = [r for r in kept if not inside(r.start, windows)]

    def p99(items):
        lat = [r.latency_s for r in items if r.error is None]
        return float(np.percentile(lat, 99)) * 1e3 if lat else None
    first = records[0].start if records else 0.0
    span = (records[-1].start - first) if len(records) > 1 else 0.0
    seconds: dict[int, dict[str, Any]] = {}
    for r in records:
        slot = seconds.setdefault(int(r.start - first), {"versions": {}, "failed": 0})
        if r.error is None:
            slot["versions"][r.version] = slot["versions"].get(r.version, 0) + 1
        else:
            slot["failed"] += 1
    errors: dict[str, int] = {}
    for r in kept:
        if r.error:
            errors[r.error] = errors.get(r.error, 0) + 1
    return LoadSummary(
        requests=len(kept), failed=sum(1 for r in kept if r.error), rps=len(records) / span if span else 0.0,
        failed_in_switch=sum(1 for r in during if r.error), failed_outside=sum(1 for r in outside if r.error),
        p99_outside_ms=p99(outside), p99_during_ms=p99(during),
        per_second=[{"t": t, **seconds[t]} for t in sorted(seconds)],
        errors=[f"{n}x {e}" for e, n in sorted(errors.items(), key=lambda kv: -kv[1])[:5]],
        switches=[{"kind": s.kind, "target": s.target,
                   "seconds": None if s.ended is None else round(s.ended - s.began, 2)} for s in switches])
