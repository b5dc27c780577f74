"""`triton-builder sweep`: a closed-loop concurrency sweep (1, 2, 4, ... N requests in flight) of a
model on a running Triton, each level measured until stable, with the server's view of each level.

Usage::

    result = run_sweep("digits_cnn", "127.0.0.1:8001", "grpc", max_concurrency=16, out_dir="runs/sweep",
                       repository="model_repository")
    result["levels"][0]["throughput_rps"], result["files"]["png"]

Writes ``sweep.csv`` (one row per level: client throughput and p50/p95/p99/mean, failures, whether
the level settled, server queue and compute time per request, average formed batch and the batch
size histogram), ``sweep.json`` (the same plus the engine, client type and settings) and ``sweep.png``
(latency against throughput, one point per concurrency; and the server's queue/compute split).

On an ensemble (a Hugging Face text pipeline, a monitored model) each level also reads the statistics of
every step (builder/tuning/steps.py): ``steps`` in each level of sweep.json says where a request's time
went (tokenizer, model, post-processing, the ensemble's own hand-offs), and a table of it is reported
after the sweep.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Callable

from builder.core.errors import UserInputError
from builder.core.files import output_folder
from builder.tuning.engine import choose_engine
from builder.tuning.payload import check_batch_size, fetch_model, load_samples, make_requests
from builder.tuning.stats import StatsReader, format_batch_sizes
from builder.tuning.steps import StepTimer, ensemble_steps, format_step_table, model_step


def concurrency_levels(max_concurrency: int) -> list[int]:
    """1, 2, 4, ... up to ``max_concurrency`` (itself included)."""
    if max_concurrency < 1:
        raise UserInputError(f"--max-concurrency {max_concurrency}: must be >= 1")
    levels, c = [], 1
    while c < max_concurrency:
        levels.append(c)
        c *= 2
    return levels + [max_concurrency]


def run_sweep(model: str, url: str, protocol: str = "grpc", max_concurrency: int = 16,
              out_dir: str | Path = "runs/sweep", *, payload: str | Path | None = None,
              repository: str | Path | None = None, levels: list[int] | None = None, window_s: float = 0.5,
              max_seconds_per_level: float = 8.0, batch_size: int = 1, engine: str = "auto",
              progress: Callable[[str], object] | None = None) -> dict[str, Any]:
    """Measure every concurrency level in ``levels`` (default 1, 2, 4, ... ``max_concurrency``) with
    ``engine`` (builder/tuning/engine.py: perf_analyzer when present, else the Python client).

    Raises ``UserInputError`` for bad arguments, ``ServerError`` if the model cannot be reached.
    """

    levels = sorted(set(levels)) if levels else concurrency_levels(max_concurrency)
    if any(c < 1 for c in levels):
        raise UserInputError(f"--levels {levels}: every concurrency must be >= 1")
    if not window_s > 0:
        raise UserInputError(f"--window {window_s}: must be > 0 s")
    if not max_seconds_per_level >= 3 * window_s:
        raise UserInputError(f"--seconds-per-level {max_seconds_per_level}: must allow three windows of --window "
                             f"{window_s} s (stability needs 3): raise it or lower --window")
    say = progress or (lambda message: None)
    interface = fetch_model(url, protocol, model)
    check_batch_size(interface, batch_size)
    samples, source = load_samples(interface, payload, repository)
    requests = make_requests(samples, batch_size, interface.batching)
    out = output_folder(out_dir)
    meter = choose_engine(engine, say)
    meter.prepare(url, protocol, interface, samples, requests, batch_size=batch_size, work_dir=out / "perf_analyzer")
    stats = StatsReader(url, protocol)
    steps = ensemble_steps(interface.config)
    timer = StepTimer(stats, model, steps) if steps else None
    rows, client = [], ""
    try:
        for concurrency in levels:
            before = timer.snapshot() if timer else None
            level = meter.measure(concurrency, window_s=window_s, max_s=max_seconds_per_level, stats=stats)
            client = level.client
            row = level.as_row()
            row["errors"] = level.errors
            batches = f"batches {format_batch_sizes(row['server_batch_sizes'], 4)}"
            if timer is not None:
                row["steps"] = timer.split(before, timer.snapshot())
                step = next((r for r in row["steps"].get("steps") or [] if r["step"] == model_step(model, steps)),
                            None)
                if step is not None:  # an ensemble forms no batches itself: its model step's are the ones
                    row["model_step_batch_sizes"] = step["batch_sizes"]
                    row["model_step_avg_batch"] = step["average_batch_size"]
                    batches = (f"model step batches {format_batch_sizes(step['batch_sizes'], 4)} "
                               f"(avg {step['average_batch_size'] or 0:.2f})")
            rows.append(row)
            say(f"  concurrency {concurrency:4d}: {row['throughput_rps']:8.1f} req/s  p50 {_ms(row['p50_ms'])}  "
                f"p99 {_ms(row['p99_ms'])} ms  {'stable' if level.stable else 'NOT stable'}  "
                f"server queue {_us(row['server_queue_us'])} / compute {_us(row['server_compute_us'])} us, "
                f"{batches}" + (f"  FAILURES {level.failures}" if level.failures else ""))
    finally:
        stats.close()
    table = format_step_table([(r["concurrency"], r["steps"]) for r in rows if "steps" in r])
    if table:
        say(f"where the time goes in {model}, per request (Triton's statistics of each step):\n{table}")
    result = {"model": model, "url": url, "protocol": protocol, "batch_size": batch_size,
              "engine": meter.name, "client": client, "payload": source,
              "window_s": window_s, "max_seconds_per_level": max_seconds_per_level, "levels": rows,
              "steps_table": table or None,
              "files": {"csv": str(out / "sweep.csv"), "png": str(out / "sweep.png"), "json": str(out / "sweep.json")}}
    write_csv(out / "sweep.csv", rows)
    plot_sweep(out / "sweep.png", rows, title=f"{model} over {protocol} (closed loop, batch {batch_size})")
    tmp = out / "sweep.json.tmp"
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out / "sweep.json")
    return result


def _ms(value: float | None) -> str:
    return "    -" if value is None else f"{value:5.2f}"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    columns = ["concurrency", "throughput_rps", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms", "requests", "failures",
               "stable", "windows", "server_queue_us", "server_compute_us", "server_avg_batch", "server_batch_sizes",
               "model_step_avg_batch", "model_step_batch_sizes"]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, **{key: " ".join(f"{k}:{v}" for k, v in (row.get(key) or {}).items())
                                       for key in ("server_batch_sizes", "model_step_batch_sizes")}})


def plot_sweep(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    """Latency (p50/p95/p99) against throughput, each point labelled with its concurrency; and the
    server's queue vs compute time per request at each concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    x = [r["throughput_rps"] for r in rows]
    for key, style in (("p50_ms", "o-"), ("p95_ms", "s--"), ("p99_ms", "^:")):
        left.plot(x, [r[key] if r[key] is not None else float("nan") for r in rows], style, label=key[:3])
    for r in rows:
        if r["p99_ms"] is not None:
            left.annotate(f"c={r['concurrency']}", (r["throughput_rps"], r["p99_ms"]), textcoords="offset points",
                          xytext=(4, 4), fontsize=8)
    left.set_xlabel("throughput (requests/s)")
    left.set_ylabel("client latency (ms)")
    left.set_title(title)
    left.grid(True, alpha=0.3)
    left.legend()
    labels = [str(r["concurrency"]) for r in rows]
    queue = [r.get("server_queue_us") or 0 for r in rows]
    compute = [r.get("server_compute_us") or 0 for r in rows]
    right.bar(labels, queue, label="queue")
    right.bar(labels, compute, bottom=queue, label="compute (input+infer+output)")
    for i, r in enumerate(rows):
        if r.get("server_avg_batch"):
            right.annotate(f"b={r['server_avg_batch']:.1f}", (i, queue[i] + compute[i]), ha="center",
                           textcoords="offset points", xytext=(0, 3), fontsize=8)
    right.set_xlabel("concurrency (requests in flight)")
    right.set_ylabel("server time per request (us)")
    right.set_title("Triton statistics: queue vs compute, b = average formed batch")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
