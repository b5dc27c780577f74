"""A light in-process closed-loop load generator, for sweeps and tuning (Locust is for load tests).

``concurrency`` threads, each with its own synchronous tritonclient (gRPC by default), send requests
back to back: exactly ``concurrency`` requests are in flight at any time. Measured on a 2-core
machine against the embedded server (digits_cnn), threads of ``tritonclient.grpc`` clients drove
~4.6k req/s at concurrency 16 where one asyncio ``tritonclient.grpc.aio`` client drove ~3.2k, so
threads it is (the GIL is released while a call waits). Client and server share the CPU here; the
client type is recorded with every measurement.

A level is measured in windows until stable: perf_analyzer's rule as ``builder.model.measure.is_stable``
implements it (the last 3 windows agree within 10 % on throughput and p50), capped in time; a level
that never settles is flagged and reports its 3 least disturbed (fastest) windows. The server's
statistics are read at every window boundary, so queue/compute time and the batch sizes formed
cover the same windows as the client's numbers.

Usage::

    level = measure_level("127.0.0.1:8001", "grpc", "digits_cnn", requests, ["logits"], concurrency=8,
                          window_s=0.5, max_s=5.0)
    level.throughput, level.p99_ms, level.stable, level.server["average_batch_size"]
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from builder.model.measure import STABLE_TOLERANCE, STABLE_WINDOWS, is_stable
from builder.serving.client import TritonClient, prepare_request
from builder.tuning.stats import server_view

CLIENT_KINDS = {
    "grpc": "in-process closed loop: one thread per request in flight, each with its own synchronous tritonclient.grpc client",
    "http": "in-process closed loop: one thread per request in flight, each with its own synchronous tritonclient.http client",
}


@dataclass
class LevelResult:
    concurrency: int
    throughput: float  #: successful requests per second over the used windows
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    requests: int  #: successful requests in the used windows
    failures: int  #: failed requests over the whole level (warm-up included)
    stable: bool
    windows: int  #: windows measured (after warm-up)
    seconds: float  #: wall time of the level, warm-up included
    server: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    client: str = ""
    p90_ms: float | None = None  #: perf_analyzer reports it; the Python engine too

    def as_row(self) -> dict[str, Any]:
        s = self.server or {}
        return {
            "concurrency": self.concurrency, "throughput_rps": round(self.throughput, 1),
            "p50_ms": _round(self.p50_ms), "p90_ms": _round(self.p90_ms), "p95_ms": _round(self.p95_ms),
            "p99_ms": _round(self.p99_ms),
            "mean_ms": _round(self.mean_ms), "requests": self.requests, "failures": self.failures,
            "stable": self.stable, "windows": self.windows,
            "server_queue_us": s.get("queue_us_per_request"), "server_compute_us": s.get("compute_us_per_request"),
            "server_avg_batch": s.get("average_batch_size"), "server_batch_sizes": s.get("batch_sizes", {}),
        }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


class _Worker(threading.Thread):
    def __init__(self, make_client, infer, requests, offset):
        super().__init__(daemon=True)
        self.make_client, self.infer, self.requests = make_client, infer, requests
        self.offset = offset
        self.done: list[tuple[float, float]] = []  # (end time, latency s) of each success
        self.failed: list[tuple[float, str]] = []
        self.stop_flag = threading.Event()
        self.ready = threading.Event()

    def run(self):
        client = self.make_client()
        try:
            self.ready.set()
            index = self.offset
            clock = time.perf_counter
            while not self.stop_flag.is_set():
                request = self.requests[index % len(self.requests)]
                index += 1
                start = clock()
                try:
                    self.infer(client, request)
                except Exception as exc:  # noqa: BLE001 - a failed request is data, not a crash
                    self.failed.append((clock(), " ".join(str(exc).split())[:200]))
                    time.sleep(0.01)  # a dead server answers instantly: do not spin
                    continue
                end = clock()
                self.done.append((end, end - start))
        finally:
            self.ready.set()
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass


def _protocol_functions(url: str, protocol: str, model: str, outputs: list[str], timeout: float):
    """One ``TritonClient`` per worker; requests prepared once; ``send`` does no conversion of the answer."""

    def make_client() -> TritonClient:
        return TritonClient(url, protocol, network_timeout=timeout)

    def prepare(sample: dict[str, np.ndarray]):
        return prepare_request(protocol, sample, outputs)

    def infer(client: TritonClient, prepared):
        client.send(model, prepared)

    return make_client, infer, prepare


def measure_level(url: str, protocol: str, model: str, requests: list[dict[str, np.ndarray]], outputs: list[str],
                  concurrency: int, *, window_s: float = 0.5, max_s: float = 6.0, timeout: float = 10.0,
                  stats=None, windows: int = STABLE_WINDOWS, tolerance: float = STABLE_TOLERANCE) -> LevelResult:
    """Measure one concurrency level until stable (or ``max_s``); ``stats``: a ``StatsReader`` or None."""

    make_client, infer, prepare = _protocol_functions(url, protocol, model, outputs, timeout)
    prepared = [prepare(r) for r in requests]
    workers = [_Worker(make_client, infer, prepared, offset=i * 7) for i in range(concurrency)]
    began = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.ready.wait(timeout)
    try:
        time.sleep(window_s)  # warm-up window: connections, thread start, the batcher's queue filling
        boundaries = [time.perf_counter()]
        snapshots = [_snapshot(stats, model)]
        throughputs: list[float] = []
        p50s: list[float] = []
        stable = False
        while True:
            time.sleep(window_s)
            boundaries.append(time.perf_counter())
            snapshots.append(_snapshot(stats, model))
            latencies = _window_latencies(workers, boundaries[-2], boundaries[-1])
            throughputs.append(len(latencies) / (boundaries[-1] - boundaries[-2]))
            p50s.append(float(np.median(latencies)) * 1e3 if latencies else 0.0)
            if is_stable(throughputs, p50s, windows=windows, tolerance=tolerance):
                stable = True
                break
            if time.perf_counter() - began >= max_s:
                break
    finally:
        for w in workers:
            w.stop_flag.set()
        for w in workers:
            w.join(timeout + 1)
    if stable:
        used = list(range(len(throughputs) - windows, len(throughputs)))
    else:  # never settled: the least disturbed windows (interference only ever slows a window down)
        used = sorted(sorted(range(len(throughputs)), key=lambda i: -throughputs[i])[:windows])
    first, last = used[0], used[-1]
    latencies = np.array([lat for i in used for lat in _window_latencies(workers, boundaries[i], boundaries[i + 1])])
    seconds = sum(boundaries[i + 1] - boundaries[i] for i in used)
    server: dict[str, Any] = {}
    if stats is not None:
        before, after = snapshots[first], snapshots[last + 1]
        server = server_view(before, after) if before is not None and after is not None else \
            {"error": "statistics unavailable"}
    errors: dict[str, int] = {}
    for w in workers:
        for _, message in w.failed:
            errors[message] = errors.get(message, 0) + 1
    pct = (lambda q: float(np.percentile(latencies, q)) * 1e3) if latencies.size else (lambda q: None)
    return LevelResult(
        concurrency=concurrency, throughput=latencies.size / seconds if seconds > 0 else 0.0,
        p50_ms=pct(50), p95_ms=pct(95), p99_ms=pct(99), p90_ms=pct(90),
        mean_ms=float(latencies.mean()) * 1e3 if latencies.size else None,
        requests=int(latencies.size), failures=sum(len(w.failed) for w in workers), stable=stable,
        windows=len(throughputs), seconds=round(time.perf_counter() - began, 2), server=server,
        errors=[f"{count}x {message}" for message, count in sorted(errors.items(), key=lambda kv: -kv[1])[:5]],
        client=CLIENT_KINDS[protocol])


def _snapshot(stats, model):
    if stats is None:
        return None
    try:
        return stats.snapshot(model)
    except Exception:  # noqa: BLE001 - reported as "statistics unavailable"
        return None


def _window_latencies(workers: list[_Worker], start: float, end: float) -> list[float]:
    """Latencies (s) of the successes that ended in (start, end]; each worker's list is in time order."""
    out: list[float] = []
    for w in workers:
        done = w.done[:]  # a snapshot: the thread keeps appending
        lo = bisect.bisect_right(done, start, key=lambda r: r[0])
        hi = bisect.bisect_right(done, end, key=lambda r: r[0])
        out.extend(latency for _, latency in done[lo:hi])
    return out
