"""The main job, end to end on the embedded default: build a spec, serve the repository on the
embedded tritonserver, run the served accuracy gate over HTTP and gRPC, drive a short Locust load and,
once it has ended, a perf_analyzer measurement (when installed) until it settles (else reported as a
lower bound, saying why), print one report, stop the server.

Usage::

    code = run_main_job("examples/digits/spec.yaml", "runs/model_repository", load_seconds=10)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from builder.core.assets import monitoring_dir
from builder.core.errors import BuilderError, UserInputError
from builder.core.processes import stop_signals, terminate_as_interrupt
from builder.pipeline import build
from builder.report.build_report import format_table
from builder.repository.layout import latest_version
from builder.repository.triton_releases import COMPOSE_RELEASE
from builder.repository.validate import validate_model
from builder.serving.check import check_served
from builder.serving.embedded import EmbeddedServer
from builder.serving.install import require_stub_safe_tmpdir
from builder.serving.startup import load_error
from builder.spec.model import load_spec
from builder.tuning.engine import PerfAnalyzerEngine, choose_engine
from builder.tuning.loadtest import format_summary, run_loadtest
from builder.tuning.payload import fetch_model, load_samples
from builder.tuning.stats import StatsReader, format_batch_sizes

JOB_LOCK = ".main-job.lock"  # suffix of ``.<repository name>.main-job.lock`` beside the job's repository


def job_lock_path(repository: Path) -> Path:
    """The lock of a job on ``repository``: beside it (Triton reads the repository) and named after it, so
    runs into sibling repositories (one parent folder) do not refuse each other."""
    repository = Path(repository).resolve()
    return repository.parent / f".{repository.name}{JOB_LOCK}"


def job_outputs(repository: Path) -> Path:
    """Where a job on ``repository`` writes its server log, load-test and perf_analyzer reports: beside it
    and named after it, so sibling repositories' jobs never write over each other's."""
    repository = Path(repository).resolve()
    return repository.parent / f"{repository.name}-run"


@contextlib.contextmanager
def job_lock(repository: Path) -> Iterator[None]:
    """Hold the main job's lock on ``repository``: a second job there (which would empty the repository and
    the log of a server still serving them, ``run --keep-serving``) is refused, naming the first one's pid.
    The lock file goes when the job ends."""
    path = job_lock_path(repository)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise UserInputError(f"another `triton-builder run` (pid {holder}) is using {Path(repository).resolve()} "
                                 "(its server may still be serving it, run --keep-serving): stop it (Ctrl-C), or give "
                                 "this run another --repository") from None
        try:
            same = os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        # the job before us removed this file as it ended: locking it would not exclude a job that opens the new one
        handle.close()
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        path.unlink(missing_ok=True)  # while still locked: a job waiting on this file retries on a fresh one
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


JOB_REPOSITORY = "runs/model_repository"  # the job's scratch repository: emptied at the start of each run
JOB_MARK = ".triton-builder-job"  # in JOB_REPOSITORY: a run made it, so the next run may empty it


def _check_arguments(spec, load_seconds: float, users: int) -> None:
    """What can be refused before anything is built or removed: the load test's numbers, the spec (a typo
    in its path once cost the repository), and a target the embedded server cannot serve."""
    import math


    if isinstance(users, bool) or not isinstance(users, int) or users < 1:
        raise UserInputError(f"--users {users}: give a whole number of load-test users >= 1 (default 8)")
    if not (isinstance(load_seconds, (int, float)) and math.isfinite(load_seconds) and load_seconds > 0):
        raise UserInputError(f"--load-seconds {load_seconds}: give the load test's length in seconds, > 0 (default 10)")

    require_stub_safe_tmpdir()  # the server needs it, after the build: said before the build
    target = load_spec(spec).deploy.target
    if target == "gpu":
        raise UserInputError(
            "deploy.target: gpu: `run` serves on the embedded tritonserver, which has no GPU backends (TensorRT, "
            "KIND_GPU instances); set deploy.target: cpu for the main job, or `triton-builder build SPEC` and serve "
            "it on Triton's own image on the GPU host (docker-compose.yml, k8s)")


def _empty_job_repository(repository: Path) -> None:
    """Empty the job's default repository before a run: only a folder an earlier run made (it holds
    JOB_MARK) or an empty one, never one a tritonserver serves. ``runs/model_repository`` is relative to
    the folder the job runs from, where a project of the user's may keep a folder of that name."""
    where = f"{repository} ({repository.resolve()})" if not repository.is_absolute() else str(repository)
    if repository.is_symlink() or not repository.is_dir():
        raise UserInputError(f"{where} is {'a symbolic link' if repository.is_symlink() else 'not a folder'}; the job "
                             "empties its default repository before building and will not follow or replace that: "
                             "pass --repository DIR (a folder it never empties), or remove it")
    entries = sorted(p.name for p in repository.iterdir() if p.name not in (JOB_MARK, ".triton-builder.lock"))
    if entries and not (repository / JOB_MARK).is_file():
        raise UserInputError(
            f"{where} holds {', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''}, which `triton-builder "
            "run` did not put there (an earlier run leaves a .triton-builder-job file in it); the job empties its "
            "default repository before building, so it stops here: pass --repository DIR to build into another "
            "folder (never emptied), or move those files away (an earlier version's run: remove the folder)")
    serving = live_servers(repository)
    if serving:  # emptying it would pull the files from under that server's models
        raise UserInputError(
            f"--repository {repository}: tritonserver (pid {', '.join(map(str, serving))}) serves it; the job "
            "empties its own default repository before building, so stop that server first (Ctrl-C in its "
            "`serve` / `run --keep-serving`), or pass another --repository")
    shutil.rmtree(repository)  # the main job's own scratch repository, never the user's


def live_servers(repository: Path) -> list[int]:
    """pids of running tritonserver processes whose --model-repository is ``repository`` (directly or
    through the symlink a path with spaces is served by); [] where /proc cannot tell."""
    want = Path(repository).resolve()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not args or not args[0].endswith(b"tritonserver"):
            continue
        for arg in args:
            if arg.startswith(b"--model-repository="):
                path = Path(os.fsdecode(arg.split(b"=", 1)[1]))
                try:
                    if path.resolve() == want:
                        found.append(int(proc.name))
                except OSError:
                    pass
    return sorted(found)


def run_main_job(spec: str | Path, repository: str | Path = JOB_REPOSITORY, *, load_seconds: float = 10.0,
                 users: int = 8, keep_serving: bool = False, fresh: bool = True,
                 progress: Callable[[str], object] | None = None) -> int:
    repository = Path(repository)
    # SIGTERM (kill, a CI timeout) stops the server as Ctrl-C does: no tritonserver left serving alone
    with job_lock(repository), terminate_as_interrupt():
        _check_arguments(spec, load_seconds, users)
        return _run(spec, repository, load_seconds, users, keep_serving, fresh, progress)


def _run(spec, repository: Path, load_seconds: float, users: int, keep_serving: bool, fresh: bool, progress) -> int:
    announce = progress or (lambda message: None)
    if fresh and os.path.lexists(repository) and repository.resolve() == Path(JOB_REPOSITORY).resolve():
        _empty_job_repository(repository)
    if fresh and repository.resolve() == Path(JOB_REPOSITORY).resolve():
        repository.mkdir(parents=True, exist_ok=True)
        (repository / JOB_MARK).write_text("made by `triton-builder run`, which empties this folder at each start\n")
    started = time.perf_counter()
    announce("== 1/4 build")
    result = build(spec, repository, progress=progress)
    name = result.context.spec.name
    announce("")
    announce(format_table(result.rows))
    # the runtime gate for docker-compose.yml's Triton release (builder/repository/runtime_gate.py)
    announce(f"\n== runtime gate: can Triton {COMPOSE_RELEASE} (docker-compose.yml's) load and reproduce it?")
    gate = validate_model(repository / name, triton_release=COMPOSE_RELEASE, progress=progress, regression_seconds=0)
    for line in gate.lines():
        announce("  " + line)

    announce("\n== 2/4 serve (embedded tritonserver)")
    code = 0 if gate.ok else 1
    # beside the job's other outputs, so the path printed below still holds the log after the job
    server_log = job_outputs(repository) / "tritonserver" / f"{name}.log"
    server_log.unlink(missing_ok=True)
    # as `serve`: a broken companion beside the job's model (another published variant, an older model)
    # must not end a job whose own model loads; only the job's own model failing does
    with EmbeddedServer(repository, log_path=server_log, extra_args=["--metrics-config=summary_latencies=true"],
                        keep_going=True) as server:
        announce(f"  HTTP {server.http_url}  gRPC {server.grpc_url}  metrics {server.metrics_url}")
        announce(f"  log  {server.log_path}")
        for left, why in server.left_out.items():
            announce(f"  left out {left}: {why}")
        for failed, why in server.failed.items():
            announce(f"  FAILED   {failed} (not served; fix it and restart to serve it): "
                     + why.replace("\n", "\n           "))
        if name in server.failed:
            raise load_error({name: server.failed[name]}, server.log_path)

        announce("\n== 3/4 check (served answers vs reference.npz, HTTP and gRPC)")
        report = check_served(name, repository=repository, url=server.http_url, grpc_url=server.grpc_url)
        for line in report.lines():
            announce("  " + line)
        if not report.ok:
            code = 1

        announce(f"\n== 4/4 load test ({users} users, {load_seconds:.0f} s, HTTP)")
        summary = _load(name, server, users, load_seconds, repository, announce)
        # after the load test, whose Locust processes have all ended: they would share the server's cores
        measured = _perf_analyzer(name, server, users, repository, announce)

        announce("\n== report")
        rows = [
            ("model", f"{name} version {report.version} ({result.published[0]['backend']} backend)"),
            ("selected variant", result.context.selected.name),
            ("served check", "OK (HTTP + gRPC)" if report.ok else "FAIL"),
            (f"Triton {COMPOSE_RELEASE} runtime gate", "OK" if gate.ok else "FAIL"),
        ]
        # the served figures are perf_analyzer's (C++, little of the server's CPU); Locust's are the client's
        # side of a load test, its users sharing the server's cores, shown with their ratio to it
        if measured:
            rows += [("served (perf_analyzer)", measured.line)]
        if summary:  # a ratio to a lower bound would overstate Locust's share: only to a settled figure
            rows += [("load test (Locust)", _format_load(summary, measured.rps if measured and measured.settled
                                                         else None))]
        rows += [("metrics (Prometheus text)", server.metrics_url),
                 ("Prometheus scrape config", f"{monitoring_dir() / 'prometheus' / 'prometheus.yml'} (scrapes "
                                              f"127.0.0.1:8002, `serve`'s default; this run's: {server.metrics_port})"),
                 ("elapsed", f"{time.perf_counter() - started:.1f} s")]
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            announce(f"  {key.ljust(width)} | {value}")
        if summary and summary.get("failures", 0):
            code = code or 1
        if keep_serving:
            _serve_until_stopped(server, announce)
    announce("server stopped")
    return code


def _serve_until_stopped(server, announce) -> None:
    """From here the job is a serving session, as `serve` is: Ctrl-C or SIGTERM is the stop it waits for, so
    the job keeps its own verdict as exit code (not 130). Its own handlers, as `serve`'s: Python's Ctrl-C
    default is not installed where SIGINT came in ignored (a job started with `&` from a script)."""
    import signal


    with stop_signals() as received:
        announce("\nserving until Ctrl-C or SIGTERM ...")  # once the handlers are in: a signal right after it is a stop
        while server.is_running() and not received:
            time.sleep(0.2)
    if received:
        announce(f"received {signal.Signals(received[0]).name}; stopping tritonserver (pid {server.pid})")
    else:
        announce(f"tritonserver exited on its own (code {server.returncode}); its log: {server.log_path}")


def _load(name, server, users, seconds, repository, announce):
    out = job_outputs(repository) / "loadtest" / name
    try:
        summary = run_loadtest(name, server.http_url, "http", users, seconds, out,
                               payload=_payload(repository, name), timeout_s=seconds + 60)
    except BuilderError as exc:
        announce(f"  load test failed: {exc}")
        return {"failures": 1}
    announce("  " + format_summary(summary))
    announce(f"  reports: {out}")
    return summary


PA_WINDOW_S = 1.0  # one perf_analyzer window: 0.5 s ones rarely agreed within 10 % on 2 shared cores
PA_MAX_S = 8.0  # per try: up to 5 windows to settle, then 3 with the rule relaxed (builder/tuning/pa_measure.py)
PA_TRIES = 2  # a try that does not settle is measured once more; the faster of the two is then a lower bound
IDLE_TIMEOUT_S = 5.0  # at most this long waiting for the server to finish the load test's requests


@dataclass
class ServedFigure:
    """perf_analyzer's figure for the report: its line, req/s, and whether it settled (else a lower bound).
    Unpacks as ``(line, rps)``."""

    line: str
    rps: float
    settled: bool = True

    def __iter__(self):
        return iter((self.line, self.rps))


def settled_measurement(measure: Callable[[], object], tries: int = PA_TRIES) -> tuple[object, int]:
    """``(level, tries made)``: ``measure()`` (a ``LevelResult``) is called until a try settles
    (``stable``), at most ``tries`` times; a failed try ends it (returned as it is); where none settles,
    the fastest try, whose figure is a lower bound of what the server gives."""
    made = []
    for attempt in range(1, tries + 1):
        level = measure()
        if level.failures or level.stable:
            return level, attempt
        made.append(level)
    return max(made, key=lambda level: level.throughput), tries


def figure_line(level, concurrency: int, tries_made: int, tries: int = PA_TRIES, window_s: float = PA_WINDOW_S,
                max_s: float = PA_MAX_S, load: tuple[float, int] | None = None) -> str:
    """The report's line for ``level`` (settled_measurement's): the figure, and where it did not settle,
    plainly that it is a lower bound and why. ``load``: (1-minute load average, cores) of this machine."""
    figure = (f"{level.throughput:.0f} req/s at concurrency {concurrency} over gRPC, p50 {level.p50_ms:.1f} ms, "
              f"p99 {level.p99_ms:.1f} ms")
    if level.stable:
        again = f", on try {tries_made} of {tries}: the first did not settle" if tries_made > 1 else ""
        return f"{figure} (settled: 3 windows of {window_s:g} s within 10 %{again})"
    busy = f", load average {load[0]:.1f} on {load[1]} cores" if load else ""
    best = "the faster try" if tries == 2 else "the fastest try" if tries > 2 else "that try"
    return (f"at least {figure} (a lower bound: perf_analyzer's {window_s:g} s windows did not agree within 10 % "
            f"in {tries} tr{'ies' if tries > 1 else 'y'} of up to {max_s:g} s - other work was taking CPU from the "
            f"server{busy}; {best} is shown)")


def _wait_until_idle(snapshot: Callable[[], object], timeout: float = IDLE_TIMEOUT_S, interval: float = 0.25,
                     clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether the server finished what the load test sent (its count of answered requests unchanged over
    ``interval``) within ``timeout`` s; Locust's processes have all ended when run_loadtest returns."""
    deadline = clock() + timeout
    last = snapshot()
    while True:
        sleep(interval)
        now = snapshot()
        if (now.success, now.fail) == (last.success, last.fail):
            return True
        if clock() >= deadline:
            return False
        last = now


def _perf_analyzer(name, server, concurrency, repository, announce) -> ServedFigure | None:
    """Triton's perf_analyzer on the served model (gRPC, ``concurrency`` in flight), once the load test's
    requests are done: the throughput the server gives, measured by a client that takes little of its CPU,
    until it settles (``settled_measurement``); None where it is not installed (`make setup` installs it)
    or the measurement failed."""

    engine = choose_engine("auto", install=False)
    if not isinstance(engine, PerfAnalyzerEngine):
        announce("  perf_analyzer is not installed (scripts/install-perf-analyzer.sh, part of `make setup`)")
        return None
    try:
        interface = fetch_model(server.grpc_url, "grpc", name)
        samples, _ = load_samples(interface, None, repository)
        engine.prepare(server.grpc_url, "grpc", interface, samples, samples,
                       work_dir=job_outputs(repository) / "perf_analyzer" / name)
        stats = StatsReader(server.grpc_url, "grpc")
        try:
            _wait_until_idle(lambda: stats.snapshot(name))
            level, tries_made = settled_measurement(
                lambda: engine.measure(concurrency, window_s=PA_WINDOW_S, max_s=PA_MAX_S, stats=stats))
        finally:
            stats.close()
    except BuilderError as exc:
        announce(f"  perf_analyzer failed: {exc}")
        return None
    if level.failures:
        announce(f"  perf_analyzer failed: {'; '.join(level.errors)}")
        return None
    line = figure_line(level, concurrency, tries_made, load=(os.getloadavg()[0], os.cpu_count() or 1))
    announce(f"  perf_analyzer {engine.tool.version}: {line}")
    return ServedFigure(line, level.throughput, level.stable)


def _payload(repository: Path, name: str) -> Path | None:
    folder = Path(repository) / name
    version = latest_version(folder)
    path = folder / str(version) / "reference.npz" if version else None
    return path if path and path.exists() else None


def _format_load(summary: dict, served_rps: float | None = None) -> str:
    """Locust's side of the load test: failures and the SLO verdict first, then its client-side figures,
    with their ratio to perf_analyzer's ``served_rps`` where there is one (Locust's Python users share the
    server's cores: on 2 cores they read 0.6-1.0 of it)."""
    def ms(key: str) -> str:  # percentiles are None when no request completed
        value = summary.get(key)
        return "-" if value is None else f"{value:.1f} ms"

    slo = summary.get("slo") or {}
    verdict = "SLO met" if slo.get("met") else "SLO BROKEN" + (f" ({'; '.join(slo['broken'])})" if slo.get("broken")
                                                                else "")
    parts = [f"{summary.get('requests', 0)} requests, {summary.get('failures', 0)} failures", verdict]
    client = f"client-side {summary.get('rps') or 0:.0f} req/s"
    if served_rps:
        client += f" = {(summary.get('rps') or 0) / served_rps:.2f} x perf_analyzer's"
    parts.append(f"{client}, p50 {ms('p50_ms')}, p99 {ms('p99_ms')}")
    server_side = summary.get("server") or {}
    step = summary.get("model_step") or {}
    if step.get("average_batch_size"):  # an ensemble: the batches its model step formed
        parts.append(f"model step's avg formed batch {step['average_batch_size']:.2f} "
                     f"({format_batch_sizes(step.get('batch_sizes') or {}, 4)})")
    elif server_side.get("average_batch_size"):
        parts.append(f"avg formed batch {server_side['average_batch_size']:.2f}")
    return ", ".join(parts)
