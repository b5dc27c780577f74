"""Run a real local Prometheus (and the batch-size exporter) against a Triton server, without docker.

Prometheus comes from Debian's ``prometheus`` package (``scripts/install-system-deps.sh``, run by
``make setup``); the scrape configuration is derived from ``monitoring/prometheus/prometheus.yml``
and the rules from ``monitoring/prometheus/rules/*.yml``, so what runs here is what the docker
compose deployment runs, with the targets rewritten.

Usage::

    from builder.serving.embedded import EmbeddedServer
    from builder.monitoring.prometheus import LocalExporter, LocalPrometheus

    with EmbeddedServer(repo, extra_args=["--metrics-config=summary_latencies=true"]) as triton, \\
         LocalExporter(triton.http_url) as exporter, \\
         LocalPrometheus(scrape_targets={"triton": triton.metrics_url,
                                         "triton-builder-exporter": exporter.address}) as prom:
        print(prom.url)                                  # http://127.0.0.1:<free port>
        prom.query('triton:requests:rate1m')             # instant query -> list of {"metric", "value"}
        prom.metric_names()                              # every metric name Prometheus has stored
        prom.alerts()                                    # /api/v1/alerts: pending and firing alerts
    # stopped here (also at interpreter exit): Prometheus' tsdb lived in a temp dir and is removed

From a shell, against a running ``triton-builder serve`` (HTTP 8000, metrics 8002)::

    python -m builder.monitoring.prometheus --triton-url 127.0.0.1:8000 --triton-metrics 127.0.0.1:8002
    # Prometheus on http://127.0.0.1:9090, the exporter on 127.0.0.1:9102; Ctrl-C stops both

Details:

- ``LocalPrometheus`` binds 127.0.0.1 on a free port (or ``port``), keeps its tsdb in a temp dir,
  waits for ``/-/ready`` and raises ``ServerError`` with Prometheus' own log lines if it exits or
  does not become ready. A missing binary is a ``ServerError`` telling to run
  ``scripts/install-system-deps.sh`` (or ``make setup``).
- ``scrape_targets`` maps a job name to ``host:port`` or a URL (``http://host:port/path`` sets the
  job's ``metrics_path`` too) or a list of those. Jobs of the template that are not named are
  dropped (so nothing scrapes a default port another process may own); names the template does not
  have become new jobs. ``scrape_targets=None`` keeps the template's jobs as they are.
- ``rule_files=None`` loads the template's rule files (absolute paths); ``[]`` loads none.
- ``alertmanager_url`` (``http://host:port``, e.g. ``LocalAlertmanager.url``) is where firing alerts
  go; None drops the template's ``alerting:`` block, so nothing is sent to a default port.
- ``scrape_interval`` / ``evaluation_interval`` override the template's (1 s by default: tests see
  rates quickly); the scrape timeout is capped at the scrape interval.
- Processes started here run in their own session, get SIGTERM if this process dies (Linux
  ``PR_SET_PDEATHSIG``), and are stopped by ``stop()`` and at interpreter exit, so none is left
  behind. Start them from a thread that lives as long as they should (the main thread normally):
  the death signal follows the thread that started the process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from builder.core import assets
from builder.core.errors import ServerError, UserInputError
from builder.core.processes import http_get as _http, refuse_taken_ports, stop_signals
from builder.monitoring.configured_service import ConfiguredService, find_binary
from builder.monitoring.local_exporter import LocalExporter

__all__ = [
    "DEFAULT_CONFIG",
    "INSTALL_HINT",
    "find_prometheus",
    "render_config",
    "LocalPrometheus",
    "LocalExporter",
    "main",
]

#: The scrape configuration ``LocalPrometheus`` derives its own from (monitoring/ as installed).
DEFAULT_CONFIG = assets.monitoring_dir() / "prometheus" / "prometheus.yml"
INSTALL_HINT = "run scripts/install-system-deps.sh (or `make setup`): it installs Debian's `prometheus` package"

_STOP_TIMEOUT_S = 10.0
_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+\Z")
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


# --------------------------------------------------------------------------------------------
# helpers


def find_prometheus(binary: str | os.PathLike | None = None) -> str:
    """Path of the ``prometheus`` binary (``binary``, else ``$PROMETHEUS_BINARY``, else PATH)."""
    return find_binary("prometheus", "PROMETHEUS_BINARY", ("prometheus",), binary, INSTALL_HINT)


def _seconds(duration: str) -> float:
    if not _DURATION.match(duration):
        raise UserInputError(f"'{duration}' is not a Prometheus duration (e.g. 1s, 500ms, 15s, 1m)")
    return sum(int(n) * _UNIT_S[unit] for n, unit in _DURATION_PART.findall(duration))


def _split_target(target: str) -> tuple[str, str | None, str | None]:
    """``host:port`` or ``http://host:port/path`` -> (host:port, scheme or None, path or None)."""
    target = str(target).strip()
    if "://" not in target:
        return target.rstrip("/"), None, None
    parsed = urllib.parse.urlsplit(target)
    if not parsed.netloc:
        raise UserInputError(f"scrape target '{target}' has no host:port")
    return parsed.netloc, parsed.scheme, (parsed.path or None)


def render_config(
    template: Path | str = DEFAULT_CONFIG,
    scrape_targets: Mapping[str, str | Sequence[str]] | None = None,
    rule_files: Sequence[Path | str] | None = None,
    scrape_interval: str | None = "1s",
    evaluation_interval: str | None = "1s",
    alertmanager_url: str | None = None,
) -> dict[str, Any]:
    """The Prometheus configuration ``LocalPrometheus`` writes, as a dict (see the module doc)."""
    template = Path(template)
    try:
        config = yaml.safe_load(template.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise UserInputError(f"cannot read the Prometheus config template {template}: {err}") from None
    glob = config.setdefault("global", {})
    if scrape_interval is not None:
        glob["scrape_interval"] = scrape_interval
    if evaluation_interval is not None:
        glob["evaluation_interval"] = evaluation_interval
    interval = _seconds(str(glob.get("scrape_interval", "1m")))
    if "scrape_timeout" in glob and _seconds(str(glob["scrape_timeout"])) > interval:
        glob["scrape_timeout"] = glob["scrape_interval"]

    if rule_files is None:
        config["rule_files"] = [str((template.parent / f).resolve()) for f in config.get("rule_files") or []]
    else:
        config["rule_files"] = [str(Path(f).expanduser().resolve()) for f in rule_files]

    config.pop("alerting", None)  # the template's Alertmanager address may be another process's port
    if alertmanager_url is not None:
        address, scheme, path = _split_target(alertmanager_url)
        manager = {"static_configs": [{"targets": [address]}], "scheme": scheme or "http", "api_version": "v2"}
        if path and path != "/":
            manager["path_prefix"] = path
        config["alerting"] = {"alertmanagers": [manager]}

    if scrape_targets is not None:
        jobs = {job["job_name"]: job for job in config.get("scrape_configs") or []}
        out = []
        for name, targets in scrape_targets.items():
            job = dict(jobs.get(name) or {"job_name": name, "metrics_path": "/metrics"})
            if isinstance(targets, str):
                targets = [targets]
            addresses = []
            for target in targets:
                address, scheme, path = _split_target(target)
                addresses.append(address)
                if scheme:
                    job["scheme"] = scheme
                if path:
                    job["metrics_path"] = path
            if not addresses:
                raise UserInputError(f"scrape job '{name}' has no target")
            job["static_configs"] = [{"targets": addresses}]
            for key in ("scrape_interval", "scrape_timeout"):  # the global (fast) intervals apply
                job.pop(key, None)
            out.append(job)
        config["scrape_configs"] = out
    return config


# --------------------------------------------------------------------------------------------
# Prometheus


class LocalPrometheus(ConfiguredService):
    """A real ``prometheus`` process scraping ``scrape_targets``; a context manager, or start/stop.

    Arguments:
        scrape_targets: ``{job_name: "host:port" | URL | [targets]}``; None keeps the template's jobs.
        rule_files: rule files to load; None = the template's (``monitoring/prometheus/rules/*.yml``).
        scrape_interval, evaluation_interval: Prometheus durations ("1s", "15s", ...).
        port: the port to listen on (127.0.0.1 by default); None picks a free one.
        host: the listen address.
        config_template: the configuration to derive from (default ``monitoring/prometheus/prometheus.yml``).
        binary: the ``prometheus`` executable (default: ``$PROMETHEUS_BINARY`` or PATH).
        ready_timeout: seconds to wait for ``/-/ready``.
        alertmanager_url: the Alertmanager firing alerts go to (None: none).
        extra_args: more ``prometheus`` flags, passed last.
        keep_data: keep the temp dir (config, tsdb, log) after ``stop()``.
    """

    label = "prometheus"
    config_name = "prometheus.yml"
    stop_timeout = _STOP_TIMEOUT_S

    def __init__(
        self,
        scrape_targets: Mapping[str, str | Sequence[str]] | None = None,
        rule_files: Sequence[Path | str] | None = None,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        port: int | None = None,
        host: str = "127.0.0.1",
        config_template: Path | str = DEFAULT_CONFIG,
        binary: str | os.PathLike | None = None,
        ready_timeout: float = 30.0,
        extra_args: Sequence[str] = (),
        keep_data: bool = False,
        alertmanager_url: str | None = None,
    ):
        if ready_timeout <= 0:
            raise UserInputError(f"ready_timeout must be positive, got {ready_timeout}")
        super().__init__(host, ready_timeout, port, keep_data)
        self.scrape_targets = dict(scrape_targets) if scrape_targets is not None else None
        self.rule_files = list(rule_files) if rule_files is not None else None
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.config_template = Path(config_template)
        self.binary = binary
        self.extra_args = tuple(str(a) for a in extra_args)
        self.alertmanager_url = alertmanager_url
        self.config: dict[str, Any] | None = None

    # -- lifecycle: start() writes the config, starts Prometheus and returns once ``/-/ready``
    # answers 200; ``ServerError`` if the binary is missing, the config is rejected, the port stays
    # taken or readiness times out (quoting Prometheus' log); nothing is left running on error.
    # stop(): SIGTERM (SIGKILL after ``timeout`` s), then the temp dir goes unless ``keep_data``.

    def _prepare(self) -> None:
        self._binary = find_prometheus(self.binary)
        self.config = render_config(self.config_template, self.scrape_targets, self.rule_files,
                                    self.scrape_interval, self.evaluation_interval, self.alertmanager_url)
        self._make_workdir()
        self.config_path.write_text(
            "# written by builder.monitoring.prometheus from " + str(self.config_template) + "\n"
            + yaml.safe_dump(self.config, sort_keys=False))

    def _command(self) -> list[str]:
        data = self.workdir / "data"
        if data.exists():
            shutil.rmtree(data, ignore_errors=True)
        return [self._binary, f"--config.file={self.config_path}", f"--storage.tsdb.path={data}",
                "--storage.tsdb.retention.time=1d", f"--web.listen-address={self.host}:{self._port}",
                *self.extra_args]

    # -- HTTP API ----------------------------------------------------------------------------

    def api(self, path: str, params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
            timeout: float = 10.0) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; ``ServerError`` with Prometheus' error otherwise."""
        if self._proc is None:
            raise ServerError("prometheus was not started; call start() first")
        query = urllib.parse.urlencode(list(params.items()) if isinstance(params, Mapping) else list(params or []))
        url = f"{self.url}/api/v1/{path.lstrip('/')}" + (f"?{query}" if query else "")
        status, body = _http(url, timeout=timeout)
        if status is None:
            code = self._proc.poll()
            raise ServerError(f"prometheus at {self.url} did not answer {path}"
                              + (f" (it exited with code {code}; last log lines:\n{self.log_tail()})" if code is not None else ""))
        try:
            doc = json.loads(body.decode("utf-8"))
        except ValueError:
            raise ServerError(f"prometheus {path}: HTTP {status}, not JSON: {body[:200]!r}") from None
        if doc.get("status") != "success":
            raise ServerError(f"prometheus {path} {dict(params or {})!r}: {doc.get('errorType', status)}: "
                              f"{doc.get('error', body[:200])}")
        return doc.get("data")

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query: a list of ``{"metric": {...}, "value": [t, "v"]}`` (a scalar is one such item)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", params)
        if data.get("resultType") in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data.get("result") or [])

    def values(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """``query`` as ``{sorted label items: float value}``."""
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in self.query(expr)}

    def metric_names(self) -> set[str]:
        """Every metric name Prometheus has stored (``/api/v1/label/__name__/values``)."""
        return set(self.api("label/__name__/values") or [])

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        return list(self.api(f"label/{label}/values", [("match[]", match)] if match else None) or [])

    def targets(self) -> list[dict]:
        return list((self.api("targets") or {}).get("activeTargets") or [])

    def rules(self) -> list[dict]:
        """Every loaded rule (``/api/v1/rules``), each with ``health``, ``lastError`` and its ``group``."""
        out = []
        for group in (self.api("rules") or {}).get("groups") or []:
            for rule in group.get("rules") or []:
                out.append(dict(rule, group=group.get("name")))
        return out

    def alerts(self) -> list[dict]:
        """Active (pending and firing) alerts, each with ``labels``, ``state`` and ``value``."""
        return list((self.api("alerts") or {}).get("alerts") or [])

    def wait_for(self, condition: Callable[[], Any], timeout: float = 30.0, interval: float = 0.5,
                 what: str = "condition") -> Any:
        """Poll ``condition()`` until it returns something truthy; ``TimeoutError`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            result = condition()
            if result:
                return result
            if not self.is_running():
                raise ServerError(f"prometheus exited; last log lines:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not met within {timeout:g} s")
            time.sleep(interval)

    def wait_for_targets(self, timeout: float = 30.0) -> list[dict]:
        """Wait until every active target has been scraped successfully; returns the targets."""
        def all_up():
            targets = self.targets()
            return targets if targets and all(t.get("health") == "up" for t in targets) else None
        try:
            return self.wait_for(all_up, timeout, what="every scrape target up")
        except TimeoutError:
            bad = {t.get("scrapeUrl"): (t.get("health"), t.get("lastError")) for t in self.targets()}
            raise ServerError(f"prometheus targets not all up within {timeout:g} s: {bad}") from None


# --------------------------------------------------------------------------------------------
# python -m builder.monitoring.prometheus


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m builder.monitoring.prometheus",
        description="Run Prometheus (monitoring/prometheus: scrape config + rules) and the batch-size exporter "
                    "against a running Triton (e.g. `triton-builder serve`) until Ctrl-C. Data is kept in a "
                    "temp dir and removed on exit.")
    ap.add_argument("--triton-url", default="127.0.0.1:8000", help="Triton HTTP address (default: %(default)s)")
    ap.add_argument("--triton-metrics", default="127.0.0.1:8002",
                    help="Triton metrics address or URL (default: %(default)s)")
    ap.add_argument("--port", type=int, default=9090, help="Prometheus port on 127.0.0.1 (default: %(default)s)")
    ap.add_argument("--exporter-port", type=int, default=9102, help="exporter port (default: %(default)s)")
    ap.add_argument("--no-exporter", action="store_true", help="scrape Triton only")
    ap.add_argument("--interval", default="2s", help="scrape and rule evaluation interval (default: %(default)s)")
    args = ap.parse_args(argv)

    with stop_signals() as received:
        return _run_until_stopped(args, received)


def _run_until_stopped(args, received: list[int]) -> int:
    exporter = None if args.no_exporter else LocalExporter(args.triton_url, port=args.exporter_port)
    prometheus = None
    try:
        # both ports before starting either: a busy one is refused naming its flag (exit 2)
        refuse_taken_ports("127.0.0.1", [("--port", args.port)]
                           + ([] if exporter is None else [("--exporter-port", args.exporter_port)]))
        targets = {"triton": args.triton_metrics}
        if exporter is not None:
            exporter.port_option = "--exporter-port"
            exporter.start()
            targets["triton-builder-exporter"] = exporter.address
        prometheus = LocalPrometheus(targets, port=args.port, scrape_interval=args.interval,
                                     evaluation_interval=args.interval)
        prometheus.port_option = "--port"
        prometheus.start()
        print(f"Prometheus  {prometheus.url}   (pid {prometheus.pid}; alerts: {prometheus.url}/alerts)", flush=True)
        if exporter is not None:
            print(f"exporter    {exporter.metrics_url}   (pid {exporter.pid})", flush=True)
        print(f"scraping    triton {args.triton_metrics}; rules {', '.join(prometheus.config['rule_files'])}", flush=True)
        print("Stop with Ctrl-C.", flush=True)
        while not received:
            if not prometheus.is_running():
                print(f"prometheus exited on its own; last log lines:\n{prometheus.log_tail()}", file=sys.stderr)
                return 2
            if exporter is not None and not exporter.is_running():  # Prometheus would scrape nothing
                print(f"the exporter exited on its own (code {exporter.returncode}); last log lines:\n"
                      f"{exporter.log_tail()}", file=sys.stderr)
                return 2
            time.sleep(0.2)
        return 0
    except (ServerError, UserInputError) as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    finally:
        if prometheus is not None:
            prometheus.stop()
        if exporter is not None:
            exporter.stop()


if __name__ == "__main__":
    raise SystemExit(main())
