"""One concurrency level measured by perf_analyzer (builder/tuning/perf_analyzer.py finds the binary).

- ``input_data``: the requests' rows as perf_analyzer's ``--input-data`` JSON (one step per sample,
  each input as raw bytes in base64 with its shape, batch dimension left out where the model batches:
  ``-b`` says how many rows a request carries; a text (BYTES) input as its strings, ``{"content":
  ["a text"], "shape": [1]}``: perf_analyzer serialises those itself); ``shape_args``: ``--shape NAME:D1,D2`` for the
  inputs with dynamic dims.
- ``parse_csv``: the ``-f`` latency report (one row per concurrency; times in microseconds).
- ``measure_with_perf_analyzer``: runs ``--measurement-mode time_windows`` with the window and the
  stability rule of the Python engine (the last 3 windows within 10 %); a level that never settles
  is measured once more over 3 windows with the rule relaxed and flagged ``stable=False``. Returns the
  same ``LevelResult`` as builder/tuning/client.py: throughput in requests/s (perf_analyzer counts
  inferences: rows), client latency percentiles, and the server's queue/compute time per request as
  perf_analyzer read them; the batch sizes Triton formed come from its statistics API (StatsReader),
  read before and after the run.

Usage::

    Path("data.json").write_text(json.dumps(input_data(samples, batching=True)))
    level = measure_with_perf_analyzer(tool, "127.0.0.1:8001", "grpc", "digits_cnn", 16, Path("data.json"),
                                       work_dir=Path("runs/sweep/pa"), window_s=0.5, max_s=8, stats=reader)
"""

from __future__ import annotations

import base64
import csv
import io
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builder.core.errors import UserInputError
from builder.core.processes import TimeoutExpired, run_command
from builder.model.measure import STABLE_TOLERANCE, STABLE_WINDOWS
from builder.tuning.client import LevelResult, _snapshot
from builder.tuning.perf_analyzer import PerfAnalyzer
from builder.tuning.stats import server_view

UNSTABLE = "Failed to obtain stable measurement"
RELAXED_STABILITY_PCT = 1000  # any 3 windows "agree": the fallback for a level that never settles


def input_data(samples: list[dict[str, np.ndarray]], batching: bool) -> dict[str, Any]:
    """perf_analyzer's ``--input-data`` JSON for ``samples`` (each one request of batch 1 when ``batching``)."""
    steps = []
    for sample in samples:
        step = {}
        for name, array in sample.items():
            array = np.asarray(array)
            rows = array if not batching else array.reshape(array.shape[1:]) if array.shape[:1] == (1,) else None
            if rows is None:
                raise UserInputError(f"input '{name}': a request row of shape {list(array.shape)}; perf_analyzer "
                                     "takes one row per step (batch dimension 1)")
            if rows.dtype == object or rows.dtype.kind in "SU":
                step[name] = {"content": _strings(rows, name), "shape": [int(d) for d in rows.shape]}
                continue
            row = np.ascontiguousarray(rows)
            step[name] = {"b64": base64.b64encode(row.astype(row.dtype.newbyteorder("<")).tobytes()).decode("ascii"),
                          "shape": [int(d) for d in row.shape]}
        steps.append(step)
    return {"data": steps}


def _strings(rows: np.ndarray, name: str) -> list[str]:
    """A text tensor's values, flattened, as the JSON strings perf_analyzer sends as BYTES elements."""
    values = []
    for value in rows.reshape(-1).tolist():
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise UserInputError(f"input '{name}': a value that is not UTF-8 text ({value[:40]!r}) cannot go "
                                     "through perf_analyzer's JSON input data; use --engine python") from None
        if not isinstance(value, str):
            raise UserInputError(f"input '{name}': {type(value).__name__} values in a text (BYTES) tensor; "
                                 "give strings")
        values.append(value)
    return values


def shape_args(inputs: list[tuple[str, str, list[int]]], samples: list[dict[str, np.ndarray]],
               batching: bool) -> list[str]:
    """``--shape NAME:D1,D2`` for each input with a dynamic dim (-1) that has one shape in every sample.
    Where the samples' shapes differ there is none: perf_analyzer takes ``--shape`` as the only shape
    it may send ("supplied shape ... is incompatible"), and each step of the input data carries its own."""
    out: list[str] = []
    skip = 1 if batching else 0
    for name, _, dims in inputs:
        shapes = {np.asarray(sample[name]).shape[skip:] for sample in samples if name in sample}
        if any(d < 0 for d in dims) and len(shapes) == 1:
            [shape] = shapes
            if shape:
                out += ["--shape", f"{name}:{','.join(str(d) for d in shape)}"]
    return out


def uniform_samples(samples: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The samples of the most common set of shapes (the first such on a tie): perf_analyzer builds a
    request of batch > 1 from consecutive steps and "can not batch tensors with different shapes"."""
    def signature(sample):
        return tuple((name, np.asarray(array).shape) for name, array in sorted(sample.items()))

    counts: dict[tuple, int] = {}
    for sample in samples:
        counts[signature(sample)] = counts.get(signature(sample), 0) + 1
    if len(counts) <= 1:
        return samples
    common = max(counts, key=counts.get)  # max keeps the first of equal counts
    return [sample for sample in samples if signature(sample) == common]


@dataclass
class PerfAnalyzerReport:
    """One row of perf_analyzer's ``-f`` CSV (``--verbose-csv``); times in microseconds."""

    concurrency: int
    inferences_per_s: float
    p50_us: float | None
    p90_us: float | None
    p95_us: float | None
    p99_us: float | None
    avg_us: float | None
    client_send_us: float | None
    network_us: float | None  #: "Network+Server Send/Recv"
    server_queue_us: float | None
    server_compute_input_us: float | None
    server_compute_infer_us: float | None
    server_compute_output_us: float | None
    client_recv_us: float | None

    @property
    def server_compute_us(self) -> float | None:
        parts = [self.server_compute_input_us, self.server_compute_infer_us, self.server_compute_output_us]
        return None if any(p is None for p in parts) else float(sum(parts))


_COLUMNS = {"p50_us": "p50 latency", "p90_us": "p90 latency", "p95_us": "p95 latency", "p99_us": "p99 latency",
            "avg_us": "Avg latency", "client_send_us": "Client Send", "network_us": "Network+Server Send/Recv",
            "server_queue_us": "Server Queue", "server_compute_input_us": "Server Compute Input",
            "server_compute_infer_us": "Server Compute Infer", "server_compute_output_us": "Server Compute Output",
            "client_recv_us": "Client Recv"}


def parse_csv(text: str) -> list[PerfAnalyzerReport]:
    """The rows of a perf_analyzer latency report; ``ValueError`` naming what is missing."""
    reader = csv.DictReader(io.StringIO(text))
    fields = reader.fieldnames or []
    for needed in ("Concurrency", "Inferences/Second", "p99 latency"):
        if needed not in fields:
            raise ValueError(f"perf_analyzer's report has no '{needed}' column (columns: {', '.join(fields) or 'none'})")
    rows = []
    for row in reader:
        def number(column: str) -> float | None:
            value = (row.get(column) or "").strip()
            return float(value) if value else None

        rows.append(PerfAnalyzerReport(int(row["Concurrency"]), float(row["Inferences/Second"]),
                                       **{key: number(column) for key, column in _COLUMNS.items()}))
    return rows


def level_from_report(report: PerfAnalyzerReport, batch_size: int, *, requests: int, stable: bool, windows: int,
                      seconds: float, server: dict[str, Any], client: str) -> LevelResult:
    """A ``LevelResult`` (requests/s, ms) from perf_analyzer's row; its queue/compute times replace the
    statistics API's in ``server`` (they cover exactly the measured windows)."""
    def ms(value: float | None) -> float | None:
        return None if value is None else value / 1e3

    server = dict(server)
    if report.server_queue_us is not None:
        server["queue_us_per_request"] = report.server_queue_us
    if report.server_compute_us is not None:
        server["compute_us_per_request"] = report.server_compute_us
    return LevelResult(concurrency=report.concurrency, throughput=report.inferences_per_s / max(1, batch_size),
                       p50_ms=ms(report.p50_us), p95_ms=ms(report.p95_us), p99_ms=ms(report.p99_us),
                       mean_ms=ms(report.avg_us), requests=requests, failures=0, stable=stable, windows=windows,
                       seconds=round(seconds, 2), server=server, client=client, p90_ms=ms(report.p90_us))


def command_args(model: str, url: str, protocol: str, concurrency: int, data: Path, report: Path, *,
                 batch_size: int = 1, window_s: float = 0.5, stability_pct: float = STABLE_TOLERANCE * 100,
                 max_trials: int = 10, shapes: list[str] = ()) -> list[str]:
    """perf_analyzer's arguments for one concurrency level."""
    host = re.sub(r"^[a-z]+://", "", url)
    return ["-m", model, "-u", host, "-i", protocol, "-b", str(batch_size),
            "--concurrency-range", f"{concurrency}:{concurrency}", "--measurement-mode", "time_windows",
            "--measurement-interval", str(max(1, int(round(window_s * 1000)))), "-s", f"{stability_pct:g}",
            "--max-trials", str(max_trials), "--input-data", str(data), "-f", str(report), "--verbose-csv",
            *shapes]


def client_description(tool: PerfAnalyzer, protocol: str) -> str:
    return (f"perf_analyzer {tool.version} (Triton's C++ load generator, closed loop over {protocol}, "
            f"time windows until stable)")


def measure_with_perf_analyzer(tool: PerfAnalyzer, url: str, protocol: str, model: str, concurrency: int,
                               data: Path, *, work_dir: Path, batch_size: int = 1, window_s: float = 0.5,
                               max_s: float = 8.0, stats=None, shapes: list[str] = (),
                               tolerance: float = STABLE_TOLERANCE) -> LevelResult:
    """Measure one level with perf_analyzer (module doc). A perf_analyzer that fails for another reason
    gives a level with ``failures=1`` and its message in ``errors``."""

    report = work_dir / f"{model}_c{concurrency}.csv"
    # the time cap covers both runs: a level that never settles is measured again over 3 windows
    trials = max(STABLE_WINDOWS, int(max_s / window_s) - STABLE_WINDOWS)
    began = time.perf_counter()
    output, code, stable = "", None, True
    for pct, max_trials in ((tolerance * 100, trials), (RELAXED_STABILITY_PCT, STABLE_WINDOWS)):
        # Triton's counts from the run whose figures are reported: an unsettled first run's executions
        # were shown beside the re-run's requests (14,964 executions for 2,965 requests)
        before = _snapshot(stats, model)
        report.unlink(missing_ok=True)
        args = command_args(model, url, protocol, concurrency, data, report, batch_size=batch_size, window_s=window_s,
                            stability_pct=pct, max_trials=max_trials, shapes=list(shapes))
        try:
            done = run_command(tool.command(args), max_s + 60 + 2 * window_s * max_trials, env=tool.environment())
            output, code = (done.stdout or "") + (done.stderr or ""), done.returncode
        except TimeoutExpired:
            output, code = f"perf_analyzer did not finish within {max_s + 60:g} s", None
        if code == 0 or UNSTABLE not in output:
            break
        stable = False  # never settled: measured once more over 3 windows, and flagged
    after = _snapshot(stats, model)
    seconds = time.perf_counter() - began
    client = client_description(tool, protocol)
    rows = parse_csv(report.read_text()) if code == 0 and report.is_file() else []
    if not rows:
        message = " ".join(line.strip() for line in output.splitlines() if "rror" in line or "ailed" in line)
        return LevelResult(concurrency, 0.0, None, None, None, None, requests=0, failures=1, stable=False, windows=0,
                           seconds=round(seconds, 2), client=client,
                           errors=[f"perf_analyzer exit {code}: {(message or output.strip())[-400:]}"])
    server: dict[str, Any] = {}
    if stats is not None:
        server = server_view(before, after) if before is not None and after is not None else \
            {"error": "statistics unavailable"}
    counted = re.search(r"Request count: (\d+)", output)
    return level_from_report(rows[0], batch_size, requests=int(counted.group(1)) if counted else 0, stable=stable,
                             windows=len(re.findall(r"^\s*Pass \[\d+\]", output, re.M)) or STABLE_WINDOWS,
                             seconds=seconds, server=server, client=client)
