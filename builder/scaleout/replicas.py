"""Several embedded Triton replicas on one model repository (a folder or ``s3://``), behind nginx,
scraped by Prometheus, with rolling updates gated by the served accuracy check.

Usage::

    from builder.scaleout.replicas import ReplicaSet

    with ReplicaSet("s3://127.0.0.1:9000/models/prod", replicas=2) as group:
        group.http_url, group.grpc_url        # the balancer (nginx): send traffic here
        group.replicas[0].http_url            # one replica directly (an EmbeddedServer)
        group.prometheus.url                  # Prometheus scraping every replica (None if not installed)
        group.request_counts("digits_cnn")    # {replica index: requests it answered} (statistics API)
        # after `triton-builder publish` of a new version:
        for step in group.roll_out("digits_cnn"):   # one replica at a time; `check` gates each
            print(step.line())
    # everything stopped here, in reverse order

What ``roll_out`` does, replica by replica: asks it to reload the model (explicit model control:
Triton re-reads ``config.pbtxt``, whose version policy names only complete versions, loads the new
version while the old one keeps answering, then unloads the old one once its requests are done),
waits for the new version to be READY, runs ``check_served`` (HTTP and gRPC, every reference case)
against that replica only, and moves to the next replica only if the check passed. If it fails,
that replica is put back on the versions it served before (a reload with its previous config and
``version_policy specific``), the remaining replicas are left alone, and ``RolloutError`` says why.
While a replica reloads and is checked, nginx takes it out of rotation (marked ``down``, nginx
reloaded), so clients never get an answer from a version that has not passed its check; it is put
back once the check passed or the rollback is done. With no other live replica it stays in rotation:
during a reload both versions are loaded, so no request has to fail because of the update.

``run_replicas`` (``triton-builder replicas``) starts a group, prints its addresses, and every
``watch_seconds`` rolls out any version published since (poll of the repository), until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from builder.core.errors import ServerError, UserInputError, VerificationError
from builder.core.processes import refuse_taken_ports, stop_signals
from builder.core.scratch import OwnedFolder
from builder.monitoring.prometheus import LocalPrometheus, find_prometheus, render_config
from builder.repository.layout import existing_versions
from builder.scaleout.balancer import NginxBalancer, find_nginx
from builder.serving import control_key as control
from builder.serving.embedded import EmbeddedServer
from builder.storage.s3 import S3Location, S3Store, is_s3_url, parse_s3_url, policy_versions
from builder.storage.served import check_served_at, served_versions

REPLICAS_PREFIX = "triton-builder-replicas-"  # the temp log folder of a `replicas` session

__all__ = ["REPLICAS_PREFIX", "ReplicaSet", "ReplicaUpdate", "RolloutError", "run_replicas", "target_versions"]

_METRICS_ARGS = ("--metrics-config=summary_latencies=true",)


class RolloutError(VerificationError):
    """A replica failed its check after loading a new version; the rollout stopped there."""


@dataclass
class ReplicaUpdate:
    replica: int
    model: str
    status: str  # "updated" | "already" | "down" | "failed"
    versions_before: list[int] = field(default_factory=list)
    versions_after: list[int] = field(default_factory=list)
    check_lines: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        text = (f"replica {self.replica}: {self.model} {self.status} "
                f"(versions {_fmt(self.versions_before)} -> {_fmt(self.versions_after)}")
        if self.seconds:
            text += f", {self.seconds:.1f} s"
        text += ")"
        if self.check_lines:
            text += "; check: " + self.check_lines[0]
        return text


def _fmt(versions: Sequence[int]) -> str:
    return ",".join(map(str, versions)) or "none"


def target_versions(repository: Any, model: str) -> list[int]:
    """The versions the repository's config makes Triton load now (complete ones only for ``s3://``)."""

    if isinstance(repository, S3Location):

        wanted, incomplete = served_versions(S3Store(repository), model)
        return [v for v in wanted if v not in incomplete]

    folder = Path(repository) / model
    config = folder / "config.pbtxt"
    if not config.is_file():
        return []
    return policy_versions(config.read_text(encoding="utf-8"), existing_versions(folder), str(config))


class ReplicaSet:
    """``replicas`` EmbeddedServers on ``repository`` + an nginx balancer + Prometheus (when installed).

    Arguments:
        repository: a local model repository folder or an ``s3://`` URL (every replica reads the same).
        replicas: how many Triton processes.
        host: where everything listens (127.0.0.1).
        http_port, grpc_port: the balancer's ports (None: free ones).
        prometheus: True starts Prometheus (``ServerError`` if it is missing), False does not, None
            starts it when the binary is installed and otherwise only writes its configuration
            (``prometheus_config``) for a Prometheus elsewhere.
        log_dir: where replica logs go, kept. Default: a temp folder that ``stop()`` removes when
            nothing failed and keeps (``kept_logs``) when a start, a replica or a rollout did.
        extra_args: more tritonserver arguments for every replica.
    """

    def __init__(self, repository: str | Path, replicas: int = 2, host: str = "127.0.0.1",
                 http_port: int | None = None, grpc_port: int | None = None, prometheus: bool | None = None,
                 log_dir: str | Path | None = None, extra_args: Sequence[str] = (), ready_timeout: float = 120.0,
                 load_models: Sequence[str] | None = None):

        if not isinstance(replicas, int) or replicas < 1:
            raise UserInputError(f"--replicas {replicas!r}: must be a whole number >= 1")
        if replicas > 16:
            raise UserInputError(f"--replicas {replicas}: at most 16 local replicas (each is a tritonserver process)")
        self.remote = parse_s3_url(repository, "--repository") if is_s3_url(repository) else None
        if self.remote is None:
            local = Path(repository).expanduser().resolve()
            if not local.is_dir():
                raise UserInputError(f"--repository {repository}: not a directory or an s3:// URL; pass the model "
                                     "repository folder or s3://HOST:PORT/BUCKET/PREFIX")
        self.repository = self.remote if self.remote is not None else Path(repository).expanduser().resolve()
        self.count = replicas
        self.host = host
        self.ports = (http_port, grpc_port)
        self.want_prometheus = prometheus
        # owned (a flock held while this process lives): what a SIGKILLed session leaves, `clean` removes
        self._owned = None if log_dir else OwnedFolder.create(Path(tempfile.gettempdir()), REPLICAS_PREFIX)
        self.log_dir = Path(log_dir).resolve() if log_dir else self._owned.path
        self._own_log_dir = not log_dir
        self.failed = False  # a start, a replica or a rollout failed: its logs are the evidence
        self.kept_logs: Path | None = None  # after stop(): where the logs are, if they were kept
        self.extra_args = tuple(_METRICS_ARGS) + tuple(str(a) for a in extra_args)
        self.ready_timeout = ready_timeout
        self.load_models = list(load_models) if load_models else None
        self.replicas: list = []
        self.balancer = None
        self.control_key: str | None = None  # start(): the key every replica takes (builder/serving/control_key.py)
        self.prometheus = None
        self.prometheus_config: Path | None = None
        self.failed_targets: dict[str, list[int]] = {}  # model -> versions that failed to load or their check
        self._lock = threading.RLock()

    @property
    def repository_arg(self) -> str:
        """The repository as ``check``/``serve`` take it (a path or the s3:// URL)."""
        return self.remote.url if self.remote is not None else str(self.repository)

    def __enter__(self) -> "ReplicaSet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- lifecycle ---------------------------------------------------------------------------

    def _new_replica(self, index: int):  # every replica takes the set's key: one key works through nginx

        self.log_dir.mkdir(parents=True, exist_ok=True)
        return EmbeddedServer(self.repository_arg, host=self.host, log_path=self.log_dir / f"replica-{index}.log",
                              extra_args=self.extra_args, ready_timeout=self.ready_timeout,
                              load_models=self.load_models, control_key=self.control_key,
                              # as `serve`: one bad model of the repository must not take down the rest
                              keep_going=self.load_models is None)

    def start(self) -> "ReplicaSet":
        """Start the replicas (in parallel), then the balancer, then Prometheus; nothing left running on error."""

        with self._lock:
            find_nginx()  # fail before starting any replica
            # the balancer's requested ports too, before minutes of replica start-up (nginx checks again)
            refuse_taken_ports(self.host, zip(("--http-port", "--grpc-port"), self.ports))
            try:
                self.control_key = control.new_key()  # $TRITON_BUILDER_CONTROL_KEY, else made for this start
                self.replicas = [self._new_replica(i) for i in range(self.count)]
                with ThreadPoolExecutor(self.count) as pool:
                    for future in [pool.submit(r.start) for r in self.replicas]:
                        future.result()
                self.balancer = NginxBalancer([r.http_url for r in self.replicas], [r.grpc_url for r in self.replicas],
                                              host=self.host, http_port=self.ports[0], grpc_port=self.ports[1])
                self.balancer.start()
                control.register([self.balancer.http_url, self.balancer.grpc_url], self.control_key)
                self._start_prometheus()
            except BaseException:
                self.failed = True
                self.stop()
                raise
            return self

    def _start_prometheus(self) -> None:
        targets = {"triton": [r.metrics_url for r in self.replicas]}
        if self.want_prometheus is False:
            return
        if self.want_prometheus is None:
            try:
                find_prometheus()
            except ServerError:
                import yaml

                self.prometheus_config = self.log_dir / "prometheus.yml"
                self.prometheus_config.write_text(yaml.safe_dump(render_config(scrape_targets=targets),
                                                                 sort_keys=False))
                return
        self.prometheus = LocalPrometheus(scrape_targets=targets)
        self.prometheus.start()
        self.prometheus_config = self.prometheus.config_path

    def stop(self) -> Path | None:
        """Stop Prometheus, the balancer and every replica. Idempotent. Returns ``kept_logs``: the log
        folder if it stays (given as ``log_dir``, or something failed), None if it was removed."""
        with self._lock:
            # a replica that ended on its own (pid but no process) is a failure worth its log
            self.failed |= bool(self.failed_targets) or any(r.pid is not None and not r.is_running()
                                                             for r in self.replicas)
            if self.prometheus is not None:
                self.prometheus.stop()
            if self.balancer is not None:
                if self.balancer_died():  # its error log (in a temp folder stop() removes) says why
                    self.failed = True
                    self._keep_balancer_logs()
                self.balancer.stop()
            for replica in self.replicas:
                replica.stop()
            if self._own_log_dir and not self.failed:
                self._owned.release()
                self.kept_logs = None
            elif self.log_dir.is_dir():
                self.kept_logs = self.log_dir
            return self.kept_logs

    def balancer_died(self) -> bool:
        """Whether nginx was started and has since exited on its own."""
        return self.balancer is not None and self.balancer.pid is not None and not self.balancer.is_running()

    def _keep_balancer_logs(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for path in (self.balancer.error_log, self.balancer.log_path):
            if path is not None and path.is_file():
                shutil.copyfile(path, self.log_dir / f"nginx-{path.name}")

    # -- addresses and state -----------------------------------------------------------------

    @property
    def http_url(self) -> str:
        return self.balancer.http_url

    @property
    def grpc_url(self) -> str:
        return self.balancer.grpc_url

    @property
    def models(self) -> list[str]:
        return list(self.replicas[0].models) if self.replicas else []

    def alive(self) -> list[int]:
        return [i for i, r in enumerate(self.replicas) if r.is_running()]

    def kill(self, index: int) -> None:
        """SIGKILL replica ``index`` (its whole process group), as a crash would; the others keep serving."""
        replica = self.replicas[index]
        self.failed = True  # a crash, as far as the logs go
        if replica.pid is not None and replica.is_running():
            try:
                os.killpg(replica.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        replica.stop()

    def ready_versions(self, index: int, model: str) -> list[int]:
        """Versions of ``model`` READY on replica ``index`` (repository index API)."""
        return sorted(int(e["version"]) for e in self.replicas[index].repository_index()
                      if e.get("name") == model and e.get("state") == "READY" and str(e.get("version", "")).isdigit())

    def statistics(self, index: int, model: str) -> dict[int, int]:
        """``{version: successful requests}`` of ``model`` on replica ``index`` (statistics API)."""
        with self.replicas[index].triton() as triton:
            stats = triton.statistics(model)
        out: dict[int, int] = {}
        for entry in stats.get("model_stats", []):
            if entry.get("version", "").isdigit():
                out[int(entry["version"])] = int(entry.get("inference_stats", {}).get("success", {}).get("count", 0))
        return out

    def request_counts(self, model: str) -> dict[int, int]:
        """``{replica index: successful requests}`` over every version, for each live replica."""
        return {i: sum(self.statistics(i, model).values()) for i in self.alive()}

    # -- rolling update ----------------------------------------------------------------------

    def pending_updates(self) -> dict[str, list[int]]:
        """``{model: target versions}`` for every served model some live replica does not serve as the repository says."""
        pending = {}
        for model in self.models:
            target = target_versions(self.repository, model)
            if target and any(self.ready_versions(i, model) != target for i in self.alive()):
                pending[model] = target
        return pending

    def roll_out(self, model: str, check: bool = True, protocol: str = "both",
                 progress: Callable[[str], object] | None = None, timeout: float = 180.0) -> list[ReplicaUpdate]:
        """Move every live replica to the versions the repository now serves, one at a time; see the module doc.

        Raises ``RolloutError`` (exit 1) when a replica fails its check (it is rolled back first),
        ``ServerError`` if a replica cannot load the new version.
        """

        say = progress or (lambda message: None)
        target = target_versions(self.repository, model)
        if not target:
            raise UserInputError(f"model '{model}' has no version to serve in {self.repository_arg}")
        newest = target[-1]
        steps: list[ReplicaUpdate] = []
        for index, replica in enumerate(self.replicas):
            if not replica.is_running():
                steps.append(ReplicaUpdate(index, model, "down"))
                continue
            before = self.ready_versions(index, model)
            if before == target:
                steps.append(ReplicaUpdate(index, model, "already", before, before))
                continue
            started = time.monotonic()
            with replica.triton() as triton:
                previous = triton.model_config(model)
            with self._out_of_rotation(index):
                say(f"replica {index}: loading {model} versions {_fmt(target)} (serving {_fmt(before)})")
                try:
                    replica.load_model(model, timeout=timeout)
                    deadline = time.monotonic() + timeout
                    while newest not in self.ready_versions(index, model):
                        if time.monotonic() > deadline:
                            raise ServerError(f"replica {index}: {model} version {newest} not ready {timeout:g} s "
                                              f"after the reload; log: {replica.log_path}")
                        time.sleep(0.1)
                except ServerError:
                    # a version that cannot load will not load on the next poll either; retrying it took
                    # this replica out of rotation every --watch-seconds, leaving the others all the load
                    self.failed_targets[model] = target
                    raise
                step = ReplicaUpdate(index, model, "updated", before, self.ready_versions(index, model))
                if check:
                    report = check_served_at(model, self.repository_arg, url=replica.http_url,
                                             grpc_url=replica.grpc_url, protocol=protocol, version=newest)
                    step.check_lines = report.lines()
                    if not report.ok:
                        step.status = "failed"
                        self.failed_targets[model] = target
                        self._roll_back(index, model, previous, before, timeout)
                        step.versions_after = self.ready_versions(index, model)
                        step.seconds = time.monotonic() - started
                        steps.append(step)
                        say(step.line())
                        raise RolloutError(
                            f"rollout of {model} version {newest} stopped at replica {index}: the served check "
                            f"failed; replica {index} is back on versions {_fmt(step.versions_after)}, replicas "
                            "after it were not touched",
                            failures=[line.strip().removeprefix("- ") for line in report.lines()])
                step.seconds = time.monotonic() - started
                steps.append(step)
                say(step.line())
        return steps

    @contextlib.contextmanager
    def _out_of_rotation(self, index: int) -> Iterator[None]:
        """Replica ``index`` out of nginx's rotation inside (back after, however it ends), so that no
        client request reaches a version that has not passed its check yet. Not when no other live
        replica would be left to answer: then it stays in (both versions are loaded during a reload)."""
        if self.balancer is None or not [i for i in self.alive() if i != index]:
            yield
            return
        self.balancer.take_out(index)
        time.sleep(1.0)  # requests nginx routed to it just before finish (on the old version) before it reloads
        try:
            yield
        finally:
            self.balancer.put_back()

    def _roll_back(self, index: int, model: str, previous_config: dict, before: list[int], timeout: float) -> None:
        if not before:
            self.replicas[index].unload_model(model)
            return
        config = dict(previous_config)
        config["version_policy"] = {"specific": {"versions": [int(v) for v in before]}}
        self.replicas[index].load_model(model, config_json=json.dumps(config), timeout=timeout)

    def roll_out_pending(self, progress: Callable[[str], object] | None = None) -> list[ReplicaUpdate]:
        """``roll_out`` every model with a pending update (what ``triton-builder replicas`` polls for).

        A target whose rollout failed (its check, or loading it) is not tried again until the
        repository serves something else (publish a fixed version)."""
        steps = []
        for model, target in self.pending_updates().items():
            if self.failed_targets.get(model) == target:
                continue
            steps += self.roll_out(model, progress=progress)
        return steps


# --------------------------------------------------------------------------------------------
# `triton-builder replicas`


def _print_flush(*args, **kwargs) -> None:
    print(*args, **kwargs, flush=True)


def run_replicas(repository: str | Path, replicas: int = 2, *, http_port: int | None = None,
                 grpc_port: int | None = None, prometheus: bool | None = None, watch_seconds: float = 10.0,
                 host: str = "127.0.0.1", announce: Callable[[str], object] = _print_flush) -> int:
    """Start a ``ReplicaSet``, announce it, roll out new versions every ``watch_seconds`` until
    SIGINT/SIGTERM; return 0 after a clean stop, 1 if a rollout failed its check during the session,
    2 if the balancer or every replica died. Each replica that dies is announced as it is noticed."""
    if watch_seconds <= 0:
        raise UserInputError(f"--watch-seconds {watch_seconds}: must be > 0")
    group = ReplicaSet(repository, replicas, host=host, http_port=http_port, grpc_port=grpc_port,
                       prometheus=prometheus)
    with stop_signals() as received:
        try:
            group.start()
            announce(f"{replicas} Triton replicas on {group.repository_arg}, behind nginx:")
            announce(f"  HTTP     {group.http_url}   (http://{group.http_url}/v2/health/ready)")
            announce(f"  gRPC     {group.grpc_url}")
            announce(f"  nginx    pid {group.balancer.pid}")
            for i, replica in enumerate(group.replicas):
                announce(f"  replica {i}: HTTP {replica.http_url}  gRPC {replica.grpc_url}  metrics {replica.metrics_url}"
                         f"  pid {replica.pid}  log {replica.log_path}")
            if group.prometheus is not None:
                announce(f"  Prometheus {group.prometheus.url} (scraping every replica)")
            elif group.prometheus_config is not None:
                announce(f"  Prometheus not installed; its scrape config for these replicas: {group.prometheus_config}")
            announce(control.announcement(group.control_key))
            announce(f"  serving  {', '.join(group.models) or '(no models)'}")
            for name, reason in group.replicas[0].left_out.items():
                announce(f"  left out {name}: {reason}")
            for name in sorted(set().union(*(r.failed for r in group.replicas))):
                reason = next(r.failed[name] for r in group.replicas if name in r.failed)
                announce(f"  FAILED   {name} (not served; fix it and restart to serve it): "
                         + reason.replace("\n", "\n           "))
            announce(f"New versions are rolled out every {watch_seconds:g} s, one replica at a time, each gated by "
                     "the served check. Stop with Ctrl-C.")
            next_poll = time.monotonic() + watch_seconds
            dead: set[int] = set()
            exit_code = 0  # the worst outcome of the session's rollouts
            while not received:
                if group.balancer_died():  # every address announced above is gone with it
                    announce(f"nginx (the balancer on {group.http_url} / {group.grpc_url}) exited with code "
                             f"{group.balancer.returncode}: {group.balancer.error_summary()}; stopping")
                    return ServerError.exit_code
                for index, replica in enumerate(group.replicas):
                    if index not in dead and replica.pid is not None and not replica.is_running():
                        dead.add(index)
                        group.failed = True  # keep its log
                        announce(f"replica {index} exited (code {replica.returncode}); the balancer skips it; "
                                 f"its log is kept: {replica.log_path}")
                if not group.alive():
                    announce("every replica has exited; stopping")
                    return ServerError.exit_code
                if time.monotonic() >= next_poll:
                    try:
                        group.roll_out_pending(progress=announce)  # announces each replica's step
                    except (ServerError, VerificationError, UserInputError) as err:
                        group.failed = True  # keep the logs that explain it
                        exit_code = max(exit_code, err.exit_code)
                        announce(f"rollout stopped: {err}")
                    next_poll = time.monotonic() + watch_seconds
                time.sleep(0.2)
            announce(f"received {signal.Signals(received[0]).name}; stopping"
                     + (f" (exit {exit_code}: a rollout failed in this session)" if exit_code else ""))
            return exit_code
        finally:
            kept = group.stop()
            if group.replicas:  # not after a refusal before anything started (no logs to speak of)
                announce(f"logs kept in {kept} (until `triton-builder clean`)" if kept is not None else
                         f"stopped; nothing failed, so the logs ({group.log_dir}) were removed")

