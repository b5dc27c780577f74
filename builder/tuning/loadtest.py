"""`triton-builder loadtest`: Locust (loadtest/locustfile.py) against a running Triton, headless, in a
subprocess under a hard timeout, with the server's own view of the same window.

Usage::

    summary = run_loadtest("digits_cnn", "127.0.0.1:8001", "grpc", users=8, run_time_s=10,
                           out_dir="runs/loadtest", repository="model_repository")
    print(format_summary(summary))
    summary["exit_code"]    # 0 SLO met, 1 SLO broken / run killed at its timeout

What lands in ``out_dir``: Locust's CSV reports (``locust_stats.csv``, ``locust_failures.csv``,
``locust_exceptions.csv``, ``locust_stats_history.csv``; the first is rewritten once a second, so its
last rows may lag the end of the run by up to a second - summary.json has the final numbers),
``report.html``, the Locust logs, and ``summary.json``:

- ``client``: requests, failures, failure ratio, RPS, p50/p90/p95/p99/avg/max ms over the run
  (Locust rounds response times under 100 ms to whole milliseconds), the most frequent errors;
- ``server``: from Triton's statistics before and after the run (``/v2/models/NAME/stats``):
  requests it answered, queue and compute time per request (us), the batch sizes it formed
  (``batch_sizes``: size -> executions) and their average; ``counts_match`` says whether the
  server answered exactly the requests Locust counted (only true when nothing else sends to
  that model meanwhile; behind a balancer the statistics come from whichever replica answered
  the statistics requests, and the printed line says so);
- ``requests``, ``failures``, ``rps``, ``p50_ms``, ``p95_ms``, ``p99_ms``: the headline client
  numbers again, at the top level (``None`` for percentiles when no request completed);
- ``slo``: the thresholds, whether they were met, and why not;
- ``exit_code``, ``timed_out``, ``duration_s``, ``files``.

The run always ends: if Locust has not exited ``timeout_s`` after it started (a client that hangs,
a server that stopped answering), its process groups get SIGTERM, then SIGKILL 5 s later.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from builder.core import assets
from builder.core.errors import ServerError, UserInputError
from builder.core.files import output_folder
from builder.core.processes import LocalService, free_port, stop_all
from builder.tuning.payload import check_batch_size, fetch_model, locust_payload
from builder.tuning.stats import StatsReader, format_batch_sizes, server_view
from builder.tuning.steps import ensemble_steps, model_step

#: loadtest/ as installed (package data): the locustfile, its load shapes, what it sends and locust.conf
LOADTEST_DIR = assets.loadtest_dir()
SHAPES = ("constant", "ramp", "steps")
STOP_TIMEOUT_S = 5  # locust.conf's stop-timeout: users finish the request in flight
START_MARGIN_S = 60.0  # start-up, workers connecting, reports
_KILL_GRACE_S = 5.0


def _locust_files(locustfile: str | Path | None) -> tuple[list[Path], Path]:
    """(the files Locust is given with -f, the locustfile first; locust.conf). A "-f -" worker receives
    exactly those files from the master, so the modules the locustfile imports are among them."""
    folder = Path(locustfile).resolve().parent if locustfile else LOADTEST_DIR
    main = Path(locustfile).resolve() if locustfile else folder / "locustfile.py"
    files, conf = [main, folder / "shapes.py", folder / "triton_target.py"], folder / "locust.conf"
    for path in (*files, conf):
        if not path.is_file():
            raise UserInputError(f"{path} is missing: a custom locustfile= needs shapes.py, triton_target.py and "
                                 f"locust.conf beside it; copy them from {LOADTEST_DIR}")
    return files, conf


class _Locust(LocalService):
    """One Locust process (master, local runner or worker) that runs to its own end: no readiness
    wait, a fresh log file; it dies with us (a SIGKILLed loadtest or run must not leave load running)."""

    label = "locust"
    error = ServerError
    log_mode = "wb"
    leftover_grace = 0.0  # whatever it left in its group gets SIGKILL

    def __init__(self, command: list[str], log_path: Path, cwd: Path, env: dict[str, str]):
        super().__init__()
        self.command, self.log_path, self.cwd, self.env = command, log_path, cwd, env

    def _command(self) -> list[str]:
        return self.command

    def _cwd(self) -> Path:
        return self.cwd

    def _env(self) -> dict[str, str]:
        return self.env

    def _wait_ready(self) -> None:
        pass


def _stop_all(procs: list[_Locust]) -> None:
    """SIGTERM the process group of every Locust process still running, SIGKILL them after a grace period."""
    stop_all(procs, _KILL_GRACE_S)


def _validate(protocol: str, users: int, run_time_s: float, workers: int, shape: str, timeout_s: float | None,
              slo_p99_ms: float | None, slo_max_failure_ratio: float | None, spawn_rate: float | None,
              batch_size: int) -> None:
    if protocol not in ("http", "grpc"):
        raise UserInputError(f"--protocol {protocol!r}: use http or grpc")
    if users < 1:
        raise UserInputError(f"--users {users}: must be >= 1")
    if spawn_rate is not None and spawn_rate <= 0:
        raise UserInputError(f"--spawn-rate {spawn_rate}: must be > 0 users per second")
    if run_time_s < 1:
        raise UserInputError(f"--run-time {run_time_s}: must be >= 1 second")
    if workers < 0:
        raise UserInputError(f"--workers {workers}: must be >= 0 (0 = one local process)")
    if workers > users:
        raise UserInputError(f"--workers {workers} > --users {users}: a worker needs at least one user")
    if shape not in SHAPES:
        raise UserInputError(f"--shape {shape!r}: use one of {', '.join(SHAPES)}")
    if timeout_s is not None and timeout_s <= run_time_s:
        raise UserInputError(f"--timeout {timeout_s}: must exceed --run-time {run_time_s} (it bounds the whole run)")
    if slo_p99_ms is not None and not slo_p99_ms > 0:  # nan too
        raise UserInputError(f"--slo-p99-ms {slo_p99_ms}: must be > 0 ms")
    if slo_max_failure_ratio is not None and not 0 <= slo_max_failure_ratio <= 1:
        raise UserInputError(f"--slo-max-failure-ratio {slo_max_failure_ratio}: must be within 0..1")
    if batch_size < 1:
        raise UserInputError(f"--batch-size {batch_size}: must be >= 1")


def run_loadtest(model: str, url: str, protocol: str = "http", users: int = 8, run_time_s: float = 30.0,
                 out_dir: str | Path = "runs/loadtest", payload: str | Path | None = None,
                 timeout_s: float | None = None, *, repository: str | Path | None = None,
                 spawn_rate: float | None = None, shape: str = "constant", slo_p99_ms: float | None = None,
                 slo_max_failure_ratio: float | None = None, workers: int = 0, batch_size: int = 1,
                 locustfile: str | Path | None = None,
                 progress: Callable[[str], object] | None = None) -> dict[str, Any]:
    """Run Locust headless against model ``model`` at ``url`` (the server's port for ``protocol``).

    ``payload``: an .npz of request inputs; default: the latest version's reference.npz in
    ``repository`` when given, else inputs generated from the model's metadata. ``workers`` > 0 runs
    one master and that many worker processes on this machine. ``timeout_s`` (default
    ``run_time_s`` + 65 s) is a hard limit on the whole run. SLO thresholds default to
    loadtest/locust.conf's (failure ratio 0.01, no p99).

    Returns the summary (also written to ``out_dir/summary.json``). Raises ``UserInputError`` for bad
    arguments and ``ServerError`` if the server or model cannot be reached before the run.
    """

    _validate(protocol, users, run_time_s, workers, shape, timeout_s, slo_p99_ms, slo_max_failure_ratio,
              spawn_rate, batch_size)
    say = progress or (lambda message: None)
    locust_files, conf = _locust_files(locustfile)
    interface = fetch_model(url, protocol, model)  # ServerError (exit 2) before anything starts
    # what would fail every request is refused now, as sweep does, not reported as failures after the run
    check_batch_size(interface, batch_size)
    payload_path, source = locust_payload(interface, payload, repository)
    out = output_folder(Path(out_dir).resolve())
    run_seconds = int(math.ceil(run_time_s))
    timeout = float(timeout_s) if timeout_s is not None else run_seconds + STOP_TIMEOUT_S + START_MARGIN_S
    result_path = out / "locust_result.json"
    if result_path.exists():
        result_path.unlink()

    command = [sys.executable, "-m", "locust", "--config", str(conf), "-f", ",".join(map(str, locust_files)),
               "--headless", "--host", url, "--triton-model", model, "--triton-protocol", protocol,
               "--users", str(users), "--spawn-rate", str(spawn_rate if spawn_rate is not None else users),
               "--run-time", f"{run_seconds}s", "--load-shape", shape, "--triton-batch-size", str(batch_size),
               "--csv", str(out / "locust"), "--html", str(out / "report.html"),
               "--result-json", str(result_path)]
    if payload_path is not None:
        command += ["--payload", str(payload_path)]
    if slo_p99_ms is not None:
        command += ["--slo-p99-ms", str(slo_p99_ms)]
    if slo_max_failure_ratio is not None:
        command += ["--slo-max-failure-ratio", str(slo_max_failure_ratio)]
    worker_tmp = None
    worker_commands = []
    if workers:
        port = free_port()
        command += ["--master", "--expect-workers", str(workers), "--expect-workers-max-wait", "60",
                    "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port)]
        # "-f -": each worker gets the locustfiles and settings from the master, as on another machine
        worker_commands = [[sys.executable, "-m", "locust", "-f", "-", "--worker", "--master-host", "127.0.0.1",
                            "--master-port", str(port)] for _ in range(workers)]
        worker_tmp = Path(tempfile.mkdtemp(prefix="locust-workers-"))

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    reader = StatsReader(url, protocol)
    procs: list[_Locust] = []
    timed_out = False
    # an ensemble forms no batches itself: the batches its model step formed are the ones to report
    step = model_step(model, ensemble_steps(interface.config))
    step_view: dict[str, Any] | None = None
    try:
        before = reader.snapshot(model)
        step_before = reader.snapshot(step) if step else None
        started = time.monotonic()
        say(f"locust: {model} over {protocol} at {url}, {users} users, {run_seconds} s, shape {shape}"
            + (f", 1 master + {workers} workers" if workers else "") + f" (hard timeout {timeout:g} s)")
        procs.append(_Locust(command, out / "locust.log", out, env).start())
        for index, worker_command in enumerate(worker_commands, 1):
            tmp = worker_tmp / f"w{index}"  # where "-f -" writes the files it receives
            tmp.mkdir()
            procs.append(_Locust(worker_command, out / f"locust-worker-{index}.log", tmp,
                                 dict(env, TMPDIR=str(tmp))).start())
        deadline = started + timeout
        master_done_at = None
        while any(p.is_running() for p in procs):
            now = time.monotonic()
            if now > deadline:
                timed_out = True
                break
            if not procs[0].is_running():  # workers get "quit" from the master; give them a moment
                master_done_at = master_done_at or now
                if now - master_done_at > 15:
                    break
            time.sleep(0.1)
        _stop_all(procs)
        duration = time.monotonic() - started
        try:
            server = server_view(before, reader.snapshot(model))
            if step:
                step_view = {"name": step, **server_view(step_before, reader.snapshot(step))}
        except ServerError as exc:
            server = {"error": str(exc)}
    finally:
        _stop_all(procs)
        reader.close()
        if worker_tmp is not None:
            shutil.rmtree(worker_tmp, ignore_errors=True)

    log_text = (out / "locust.log").read_text(errors="replace")
    code = procs[0].returncode
    client = None
    if result_path.is_file():
        client = json.loads(result_path.read_text())
        result_path.unlink()
    elif code == 2 and not timed_out:
        errors = [line.split("error:", 1)[1].strip() for line in log_text.splitlines() if "triton-locust: error:" in line]
        reason = errors[-1] if errors else _last_lines(log_text)
        raise UserInputError(f"locust refused the run: {reason} (log: {out / 'locust.log'})")
    if client is None:  # killed before it could write the final numbers: Locust's last CSV rows
        client = _client_from_csv(out / "locust_stats.csv")
    slo = client.pop("slo", None) or {"met": False, "broken": []}
    if timed_out:
        slo["met"] = False
        slo["broken"] = list(slo.get("broken", [])) + [
            f"Locust did not finish within the {timeout:g} s timeout and was killed; numbers are partial"]
    # 2: the server went away during the run (the locustfile stopped it); 1: an SLO broken or a timeout
    exit_code = 2 if client.get("unreachable") else 0 if (code == 0 and not timed_out) else 1
    expected = (client.get("requests") or 0) - (client.get("failures") or 0)
    summary: dict[str, Any] = {
        "model": model, "url": url, "protocol": protocol, "users": users,
        "spawn_rate": spawn_rate if spawn_rate is not None else users, "run_time_s": run_seconds, "shape": shape,
        "workers": workers, "batch_size": batch_size,
        "payload": source,
        # the headline numbers, flat, for callers that only want those (same values as in "client")
        **{key: client.get(key) for key in ("requests", "failures", "rps", "p50_ms", "p95_ms", "p99_ms")},
        "client": client, "server": server, **({"model_step": step_view} if step_view else {}),
        "counts_match": server.get("error") is None and server.get("requests") == expected,
        "slo": slo, "exit_code": exit_code, "locust_exit_code": code, "timed_out": timed_out,
        "duration_s": round(duration, 2),
        "files": {"summary": str(out / "summary.json"), "html": str(out / "report.html"),
                  "csv_prefix": str(out / "locust"), "log": str(out / "locust.log")},
    }
    _write_json(out / "summary.json", summary)
    say(format_summary(summary))
    return summary


def _last_lines(text: str, count: int = 5) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-count:])


def _number(value: str) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _client_from_csv(path: Path) -> dict[str, Any]:
    """Partial client numbers from Locust's last periodic CSV write (the run did not end normally)."""
    empty = {"requests": 0, "failures": 0, "failure_ratio": None, "rps": None, "p50_ms": None, "p90_ms": None,
             "p95_ms": None, "p99_ms": None, "avg_ms": None, "max_ms": None, "errors": {}, "partial": True}
    if not path.is_file():
        return empty
    with open(path, newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("Name") == "Aggregated"]
    if not rows:
        return empty
    row = rows[-1]
    requests, failures = int(row.get("Request Count") or 0), int(row.get("Failure Count") or 0)
    return {"requests": requests, "failures": failures,
            "failure_ratio": round(failures / requests, 6) if requests else None,
            "rps": _number(row.get("Requests/s")), "p50_ms": _number(row.get("50%")), "p90_ms": _number(row.get("90%")),
            "p95_ms": _number(row.get("95%")), "p99_ms": _number(row.get("99%")),
            "avg_ms": _number(row.get("Average Response Time")), "max_ms": _number(row.get("Max Response Time")),
            "errors": {}, "partial": True}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _fmt_ms(value: Any) -> str:
    return "-" if value is None else f"{value:g}"


def format_summary(summary: dict[str, Any]) -> str:
    """One line: client numbers, the server's queue/compute split and batches, the SLO verdict; when
    requests failed, a second line with the most common failure reason."""

    c, s = summary.get("client", {}), summary.get("server", {})
    text = (f"{summary.get('model')} over {summary.get('protocol')}, {summary.get('users')} users: "
            f"{c.get('requests', 0)} requests, {c.get('failures', 0)} failures, "
            f"{(c.get('rps') or 0):.1f} req/s, p50 {_fmt_ms(c.get('p50_ms'))} / p95 {_fmt_ms(c.get('p95_ms'))} / "
            f"p99 {_fmt_ms(c.get('p99_ms'))} ms")
    if s.get("error") is None and s.get("requests"):
        figures = f"queue {s['queue_us_per_request']:.0f} us + compute {s['compute_us_per_request']:.0f} us per request"
        if s.get("average_batch_size") is not None:  # an ensemble executes no batches of its own
            figures += f", avg batch {s['average_batch_size']} ({format_batch_sizes(s['batch_sizes'], 4)})"
        step = summary.get("model_step") or {}
        if step.get("error") is None and step.get("executions"):  # an ensemble: its model step's batches
            figures += (f"; model step {step['name']}: avg formed batch {step['average_batch_size']} "
                        f"({format_batch_sizes(step['batch_sizes'], 4)})")
        answered = (c.get("requests") or 0) - (c.get("failures") or 0)
        # the statistics come from the one Triton at --url: behind a balancer that is one replica's share,
        # and other clients' requests count too; then they are not this run's server figures
        if summary.get("counts_match", True) or s["requests"] == answered:
            text += f"; server: {figures}"
        elif s["requests"] < answered:
            text += (f"; server figures from one backend: {s['requests']} of {answered} requests - behind a "
                     f"balancer? (that backend: {figures})")
        else:
            text += (f"; server figures are not this run's: {s['requests']} requests answered there, {answered} by "
                     f"the client's count - other clients, or behind a balancer? (there: {figures})")
    elif s.get("error"):
        text += "; server statistics unavailable"
    slo = summary.get("slo", {})
    text += "; SLO met" if slo.get("met") else "; SLO BROKEN: " + "; ".join(slo.get("broken", []))
    if summary.get("timed_out"):
        text += " (timed out)"
    errors = c.get("errors") or {}
    if c.get("failures") and errors:  # the reason was only in summary.json: a failing run says why here too
        reason, count = max(errors.items(), key=lambda item: item[1])
        text += f"\n  most common failure ({count} of {c['failures']}): {reason[:400]}"
    return text
