"""Batch-size exporter: Triton statistics API -> Prometheus metrics.

Triton's own metrics endpoint reports request and execution *counts* but not
which batch sizes the dynamic batcher actually formed. Triton's statistics API
(``GET /v2/models/stats``) does, per batch size (``batch_stats``). This
exporter reads it, together with the repository index
(``POST /v2/repository/index``) and each model version's ready state
(``GET /v2/models/<m>/versions/<v>/ready``), on every scrape and publishes:

``triton_builder_formed_batch_executions_total{model,version,batch_size}``
    counter: executions Triton ran at that batch size (``compute_infer.count``).
``triton_builder_formed_batch_size_average{model,version}``
    gauge: mean formed batch size over the executions since the previous
    scrape of this exporter (the first scrape: since Triton started; NaN when
    there were no executions in between). With one Prometheus scraping, the
    interval is the scrape interval. For an average that does not depend on
    who scrapes, use the recording rule ``triton:formed_batch_size:avg_rate1m``
    (``nv_inference_count`` / ``nv_inference_exec_count`` rates).
``triton_builder_exporter_up``
    1 when the last scrape of Triton (stats and repository index) succeeded.
``triton_builder_model_ready{model,version}``
    1/0 from Triton's ready API, for every model version in the repository
    index (a model that failed before any version loaded is reported with
    ``version=""``). Entries Triton lists as UNAVAILABLE with reason
    "unloaded" (unloaded on purpose, or an old version retired by the
    version policy) are left out, so they do not raise TritonModelNotReady.

The repository index is one of the control APIs a triton-builder server restricts: the exporter sends
the header ``triton-builder-control-key`` with ``$TRITON_BUILDER_CONTROL_KEY`` (or ``control_key=``)
when it has one (builder/serving/control_key.py; never on the command line, never logged).

Run::

    TRITON_BUILDER_CONTROL_KEY=... python -m monitoring.exporter --triton-url 127.0.0.1:8000 --port 9102
    curl -s 127.0.0.1:9102/metrics | grep triton_builder_

Importing this module has no side effects; only ``main()`` starts a server.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Iterable, List, Optional, Tuple

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["BatchStatsCollector", "normalize_url", "build_arg_parser", "serve", "main"]

log = logging.getLogger("triton_builder.exporter")

EXECUTIONS = "triton_builder_formed_batch_executions"  # exposed with the _total suffix
AVERAGE = "triton_builder_formed_batch_size_average"
UP = "triton_builder_exporter_up"
READY = "triton_builder_model_ready"


def normalize_url(url: str) -> str:
    """``127.0.0.1:8000`` -> ``http://127.0.0.1:8000`` (no trailing slash)."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


CONTROL_KEY_ENV = "TRITON_BUILDER_CONTROL_KEY"
CONTROL_HEADER = "triton-builder-control-key"


class TritonUnavailable(Exception):
    """Triton could not be reached or answered something unusable."""


class BatchStatsCollector(Collector):
    """prometheus_client custom collector reading Triton's statistics API.

    ``BatchStatsCollector("127.0.0.1:8000")`` creates a fresh
    ``CollectorRegistry`` (available as ``.registry``) and registers itself
    there; pass ``registry=`` to use another one (never the global default
    unless you pass it explicitly). Triton is queried at collect time, never
    at construction or registration.
    """

    def __init__(self, triton_url: str = "127.0.0.1:8000",
                 registry: Optional[CollectorRegistry] = None,
                 timeout: float = 3.0, control_key: Optional[str] = None) -> None:
        self.triton_url = normalize_url(triton_url)
        self.timeout = float(timeout)
        # the repository index is restricted on our servers (builder/serving/control_key.py: HEADER, ENV)
        self._control_key = control_key or os.environ.get(CONTROL_KEY_ENV, "").strip() or None
        self._lock = threading.Lock()
        # (model, version) -> {batch_size: executions} at the previous collect
        self._previous: Dict[Tuple[str, str], Dict[int, int]] = {}
        self.registry = registry if registry is not None else CollectorRegistry()
        self.registry.register(self)

    # -- HTTP -------------------------------------------------------------- #
    def _request(self, path: str, body: Optional[bytes] = None) -> Tuple[int, bytes]:
        req = urllib.request.Request(self.triton_url + path, data=body, method="POST" if body is not None else "GET")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if self._control_key and path.startswith("/v2/repository/"):
            req.add_header(CONTROL_HEADER, self._control_key)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read() if exc.fp is not None else b""

    def _json(self, path: str, body: Optional[bytes] = None) -> Any:
        try:
            status, data = self._request(path, body)
        except (urllib.error.URLError, OSError) as exc:
            raise TritonUnavailable(f"{self.triton_url}{path}: {exc}") from exc
        if status != 200:
            raise TritonUnavailable(f"{self.triton_url}{path}: HTTP {status}: {data[:200]!r}")
        try:
            return json.loads(data.decode("utf-8"))
        except ValueError as exc:
            raise TritonUnavailable(f"{self.triton_url}{path}: bad JSON: {exc}") from exc

    def fetch_stats(self) -> List[Dict[str, Any]]:
        doc = self._json("/v2/models/stats")
        stats = doc.get("model_stats") if isinstance(doc, dict) else None
        if not isinstance(stats, list):
            raise TritonUnavailable("/v2/models/stats: no model_stats list")
        return stats

    def fetch_index(self) -> List[Dict[str, Any]]:
        doc = self._json("/v2/repository/index", body=b"{}")
        if not isinstance(doc, list):
            raise TritonUnavailable("/v2/repository/index: not a list")
        return doc

    def is_ready(self, model: str, version: str) -> bool:
        path = "/v2/models/" + urllib.parse.quote(model, safe="")
        if version:
            path += "/versions/" + urllib.parse.quote(version, safe="")
        try:
            status, _ = self._request(path + "/ready")
        except (urllib.error.URLError, OSError):
            return False
        return status == 200

    # -- collector --------------------------------------------------------- #
    @staticmethod
    def _families() -> Tuple[CounterMetricFamily, GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            CounterMetricFamily(EXECUTIONS, "Model executions Triton ran at this formed batch size "
                                "(statistics API batch_stats compute_infer count).",
                                labels=["model", "version", "batch_size"]),
            GaugeMetricFamily(AVERAGE, "Mean formed batch size over the executions since this "
                              "exporter's previous scrape (NaN: no executions).",
                              labels=["model", "version"]),
            GaugeMetricFamily(UP, "1 when the last scrape of Triton's statistics and repository APIs succeeded."),
            GaugeMetricFamily(READY, "1 when Triton reports the model version ready, else 0.",
                              labels=["model", "version"]),
        )

    def describe(self) -> Iterable:
        return self._families()

    def collect(self) -> Iterable:
        executions, average, up, ready = self._families()
        with self._lock:
            try:
                stats = self.fetch_stats()
                index = self.fetch_index()
            except TritonUnavailable as exc:
                log.warning("scrape of Triton failed: %s", exc)
                up.add_metric([], 0.0)
                yield up
                return

            current: Dict[Tuple[str, str], Dict[int, int]] = {}
            for ms in stats:
                if not isinstance(ms, dict) or "name" not in ms:
                    continue
                key = (str(ms["name"]), str(ms.get("version", "")))
                per_bs = current.setdefault(key, {})
                for bstat in ms.get("batch_stats") or []:
                    try:
                        bs = int(bstat["batch_size"])
                        n = int((bstat.get("compute_infer") or {}).get("count", 0))
                    except (KeyError, TypeError, ValueError):
                        continue
                    per_bs[bs] = per_bs.get(bs, 0) + n

            for (model, version), per_bs in sorted(current.items()):
                for bs, n in sorted(per_bs.items()):
                    executions.add_metric([model, version, str(bs)], float(n))
                prev = self._previous.get((model, version), {})
                delta = {bs: n - prev.get(bs, 0) for bs, n in per_bs.items()}
                if any(d < 0 for d in delta.values()) or any(bs not in per_bs for bs in prev):
                    delta = dict(per_bs)  # Triton restarted / model reloaded: counters reset
                total = sum(delta.values())
                avg = sum(bs * d for bs, d in delta.items()) / total if total > 0 else math.nan
                average.add_metric([model, version], avg)
            self._previous = current

            seen = set()
            for entry in index:
                if not isinstance(entry, dict) or "name" not in entry:
                    continue
                model, version = str(entry["name"]), str(entry.get("version", ""))
                if (model, version) in seen:
                    continue
                if entry.get("state") == "UNAVAILABLE" and entry.get("reason") == "unloaded":
                    continue  # deliberately unloaded (explicit control, or an old version retired)
                seen.add((model, version))
                ok = bool(version) and entry.get("state", "READY") == "READY" and self.is_ready(model, version)
                ready.add_metric([model, version], 1.0 if ok else 0.0)

            up.add_metric([], 1.0)
        yield executions
        yield average
        yield up
        yield ready


# --------------------------------------------------------------------------- #
def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m monitoring.exporter",
        description="Export Triton's formed batch sizes and model readiness as Prometheus metrics.")
    ap.add_argument("--triton-url", default="127.0.0.1:8000",
                    help="Triton HTTP endpoint, host:port or URL (default: %(default)s)")
    ap.add_argument("--port", type=int, default=9102, help="port to serve /metrics on (default: %(default)s)")
    ap.add_argument("--address", default="127.0.0.1",
                    help="address to bind (default: %(default)s; use 0.0.0.0 inside a container)")
    ap.add_argument("--timeout", type=float, default=3.0,
                    help="seconds per Triton HTTP call (default: %(default)s)")
    ap.add_argument("--log-level", default="INFO")
    return ap


def serve(args: argparse.Namespace, control_key: Optional[str] = None):
    """Start the /metrics server in a daemon thread; returns (collector, httpd, thread)."""
    collector = BatchStatsCollector(args.triton_url, timeout=args.timeout, control_key=control_key)
    httpd, thread = start_http_server(args.port, addr=args.address, registry=collector.registry)
    return collector, httpd, thread


def main(argv: Optional[List[str]] = None) -> int:
    args = build_arg_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    collector, httpd, _ = serve(args)
    host, port = httpd.server_address[:2]
    log.info("serving http://%s:%s/metrics for Triton at %s", host, port, collector.triton_url)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(3600):
        pass
    httpd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
