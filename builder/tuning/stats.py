"""The server's side of a measurement, from Triton's statistics API (``/v2/models/NAME/stats``).

Triton keeps cumulative counters per model version: successful/failed requests, time spent queued
and computing (input, infer, output), and ``batch_stats``: how many times it executed the model at
each batch size. The batch sizes the dynamic batcher actually formed are visible nowhere else.
A measurement takes a snapshot before and after and reports the difference.

Usage::

    reader = StatsReader("127.0.0.1:8001", "grpc")
    before = reader.snapshot("digits_cnn")
    ...  # load
    view = server_view(before, reader.snapshot("digits_cnn"))
    view["average_batch_size"], view["batch_sizes"], view["queue_us_per_request"]
    reader.close()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from builder.core.errors import ServerError
from builder.serving.client import TritonClient

_PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass
class StatsSnapshot:
    """Cumulative counters of one model, summed over its loaded versions."""

    success: int = 0
    fail: int = 0
    success_ns: int = 0  #: summed request durations of the successful requests (arrival to response)
    inferences: int = 0  #: samples executed (a request of batch 4 counts 4)
    executions: int = 0  #: model executions (one per formed batch)
    ns: dict[str, int] = field(default_factory=lambda: {p: 0 for p in _PHASES})
    batches: dict[int, int] = field(default_factory=dict)  #: formed batch size -> executions


def parse_stats(answer: dict[str, Any], model: str) -> StatsSnapshot:
    """A snapshot from a statistics answer (``TritonClient.statistics``; int64s as strings are read too)."""
    snap = StatsSnapshot()
    for entry in answer.get("model_stats", []):
        if entry.get("name") != model:
            continue
        stats = entry.get("inference_stats", {})
        snap.success += int(stats.get("success", {}).get("count", 0))
        snap.success_ns += int(stats.get("success", {}).get("ns", 0))
        snap.fail += int(stats.get("fail", {}).get("count", 0))
        snap.inferences += int(entry.get("inference_count", 0))
        snap.executions += int(entry.get("execution_count", 0))
        for phase in _PHASES:
            snap.ns[phase] += int(stats.get(phase, {}).get("ns", 0))
        for batch in entry.get("batch_stats", []):
            size = int(batch.get("batch_size", 0))
            snap.batches[size] = snap.batches.get(size, 0) + int(batch.get("compute_infer", {}).get("count", 0))
    return snap


class StatsReader:
    """Reads a model's statistics over HTTP or gRPC (whichever the measurement uses)."""

    def __init__(self, url: str, protocol: str, timeout: float = 10.0):
        self.url, self.protocol, self.timeout = url, protocol, timeout
        self._client = TritonClient(url, protocol, network_timeout=timeout)

    def snapshot(self, model: str) -> StatsSnapshot:
        try:
            answer = self._client.statistics(model)
        except ServerError as exc:
            raise ServerError(f"cannot read statistics of model '{model}' from Triton at {self.url} "
                              f"over {self.protocol}: {' '.join(exc.reason.split())[:200]}") from None
        return parse_stats(answer, model)

    def close(self) -> None:
        self._client.close()


def server_view(before: StatsSnapshot, after: StatsSnapshot) -> dict[str, Any]:
    """What the server did between two snapshots: requests, per-request queue/compute time, batches.

    Times are microseconds per successful request (Triton adds a batch's compute time to each
    request in it). ``batch_sizes`` maps each formed batch size to its number of executions;
    ``average_batch_size`` is samples per execution.
    """
    requests = after.success - before.success
    executions = after.executions - before.executions
    inferences = after.inferences - before.inferences
    if requests < 0 or executions < 0:  # the model was reloaded in between: counters restarted
        return {"error": "statistics went backwards (the model was reloaded during the measurement)"}
    per_request = {}
    for phase in _PHASES:
        delta = after.ns[phase] - before.ns[phase]
        per_request[f"{phase}_us_per_request"] = round(delta / requests / 1e3, 2) if requests else None
    compute = sum(v for k, v in per_request.items() if k.startswith("compute") and v is not None)
    queue = per_request["queue_us_per_request"]
    batches = {size: after.batches.get(size, 0) - before.batches.get(size, 0)
               for size in sorted(set(after.batches) | set(before.batches))}
    batches = {size: count for size, count in batches.items() if count > 0}
    return {
        "requests": requests,
        "failures": after.fail - before.fail,
        "executions": executions,
        "inferences": inferences,
        "average_batch_size": round(inferences / executions, 2) if executions else None,
        "batch_sizes": {str(size): count for size, count in batches.items()},
        **per_request,
        "compute_us_per_request": round(compute, 2) if requests else None,
        "queue_share": round(queue / (queue + compute), 3) if requests and (queue + compute) > 0 else None,
        "error": None,
    }


def format_batch_sizes(batch_sizes: dict[str, int], limit: int = 6) -> str:
    """``"1x120 2x40 4x10 (+2 sizes: 13 executions)"``: the ``limit`` most frequent formed batch sizes, in
    size order, and what was left out (so a missing size is never read as one Triton did not form)."""
    if not batch_sizes:
        return "-"
    ranked = sorted(batch_sizes.items(), key=lambda item: -item[1])
    top, rest = ranked[:limit], ranked[limit:]
    shown = " ".join(f"{size}x{count}" for size, count in sorted(top, key=lambda item: int(item[0])))
    if rest:
        shown += (f" (+{len(rest)} size{'s' if len(rest) > 1 else ''}: "
                  f"{sum(count for _, count in rest)} executions)")
    return shown
