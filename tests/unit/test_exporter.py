"""Unit tests for monitoring/exporter.py against a FAKE Triton.

FakeTritonStatsServer below is a stand-in that serves only the three Triton
HTTP endpoints the exporter reads, with canned JSON in the statistics-extension
format. It is NOT Triton; the real-Triton integration test lives elsewhere.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitoring import exporter

ROOT = Path(__file__).resolve().parents[2]


def _batch_stat(bs: int, count: int) -> dict:
    d = {"count": count, "ns": count * 1000}
    return {"batch_size": bs, "compute_input": d, "compute_infer": d, "compute_output": d}


class FakeTritonStatsServer:
    """FAKE Triton: /v2/models/stats, /v2/repository/index (POST) and /ready only."""

    def __init__(self):
        self.batches = {("digits", "1"): {1: 10, 4: 5}, ("convnet64", "2"): {}}
        self.index = [
            {"name": "digits", "version": "1", "state": "READY"},
            {"name": "convnet64", "version": "2", "state": "READY"},
            {"name": "broken", "version": "1", "state": "UNAVAILABLE", "reason": "load failed"},
            {"name": "badconfig", "state": "UNAVAILABLE", "reason": "invalid config"},
            {"name": "digits", "version": "0", "state": "UNAVAILABLE", "reason": "unloaded"},
            {"name": "retired", "state": "UNAVAILABLE", "reason": "unloaded"},
        ]
        self.not_ready = {("convnet64", "2")}  # index says READY, ready API says no
        self.requests = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                fake.requests.append(("GET", self.path))
                if self.path == "/v2/models/stats":
                    stats = []
                    for (name, version), per_bs in fake.batches.items():
                        stats.append({
                            "name": name,
                            "version": version,
                            "last_inference": 0,
                            "inference_count": sum(b * n for b, n in per_bs.items()),
                            "execution_count": sum(per_bs.values()),
                            "inference_stats": {},
                            "batch_stats": [_batch_stat(b, n) for b, n in per_bs.items()],
                        })
                    return self._send(200, {"model_stats": stats})
                parts = self.path.strip("/").split("/")
                # v2/models/<m>/versions/<v>/ready
                if len(parts) == 6 and parts[:2] == ["v2", "models"] and parts[5] == "ready":
                    key = (parts[2], parts[4])
                    ready = any(e["name"] == key[0] and e.get("version") == key[1] and e["state"] == "READY"
                                for e in fake.index) and key not in fake.not_ready
                    return self._send(200 if ready else 400, {} if ready else {"error": "not ready"})
                return self._send(404, {"error": "not found"})

            def do_POST(self):
                fake.requests.append(("POST", self.path))
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                if self.path == "/v2/repository/index":
                    return self._send(200, fake.index)
                return self._send(404, {"error": "not found"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_triton():
    with FakeTritonStatsServer() as fake:
        yield fake


def _samples(registry):
    text = generate_latest(registry).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, out


def _get(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_text(fake_triton):
    c = exporter.BatchStatsCollector(fake_triton.url)
    text, s = _samples(c.registry)
    assert 'triton_builder_formed_batch_executions_total{batch_size="1",model="digits",version="1"} 10.0' in text
    assert 'triton_builder_formed_batch_executions_total{batch_size="4",model="digits",version="1"} 5.0' in text
    assert "# TYPE triton_builder_formed_batch_executions_total counter" in text
    assert "# TYPE triton_builder_formed_batch_size_average gauge" in text
    assert "triton_builder_exporter_up 1.0" in text
    # first scrape: average since Triton started = (1*10 + 4*5) / 15
    assert _get(s, "triton_builder_formed_batch_size_average", model="digits", version="1") == pytest.approx(2.0)
    # a loaded model without executions has no average yet
    assert math.isnan(_get(s, "triton_builder_formed_batch_size_average", model="convnet64", version="2"))
    assert _get(s, "triton_builder_model_ready", model="digits", version="1") == 1.0
    assert _get(s, "triton_builder_model_ready", model="convnet64", version="2") == 0.0
    assert _get(s, "triton_builder_model_ready", model="broken", version="1") == 0.0
    assert _get(s, "triton_builder_model_ready", model="badconfig", version="") == 0.0
    # deliberately unloaded entries (old versions, explicit unloads) are not reported
    assert 'model="retired"' not in text and 'version="0"' not in text
    # the index was POSTed, ready was asked per listed READY version only
    assert ("POST", "/v2/repository/index") in fake_triton.requests
    assert ("GET", "/v2/models/digits/versions/1/ready") in fake_triton.requests
    assert not any("broken" in p for _, p in fake_triton.requests)


def test_average_is_over_the_interval_between_scrapes(fake_triton):
    c = exporter.BatchStatsCollector(fake_triton.url)
    _samples(c.registry)
    fake_triton.batches[("digits", "1")] = {1: 10, 4: 5, 8: 3}  # +3 executions of 8
    _, s = _samples(c.registry)
    assert _get(s, "triton_builder_formed_batch_size_average", model="digits", version="1") == pytest.approx(8.0)
    assert _get(s, "triton_builder_formed_batch_executions_total", model="digits", version="1",
                batch_size="8") == 3.0
    fake_triton.batches[("digits", "1")] = {1: 12, 4: 7, 8: 3}  # +2 of 1, +2 of 4
    _, s = _samples(c.registry)
    assert _get(s, "triton_builder_formed_batch_size_average", model="digits", version="1") == pytest.approx(2.5)
    # nothing executed since the previous scrape: NaN, not a stale number
    _, s = _samples(c.registry)
    assert math.isnan(_get(s, "triton_builder_formed_batch_size_average", model="digits", version="1"))
    # Triton restarted: counters went down -> average over the new totals
    fake_triton.batches[("digits", "1")] = {2: 4}
    _, s = _samples(c.registry)
    assert _get(s, "triton_builder_formed_batch_size_average", model="digits", version="1") == pytest.approx(2.0)


def test_triton_down_reports_up_zero_only():
    with FakeTritonStatsServer() as fake:
        url = fake.url
    c = exporter.BatchStatsCollector(url, timeout=1.0)  # nothing listens there any more
    text, s = _samples(c.registry)
    assert s == {("triton_builder_exporter_up", ()): 0.0}
    assert "triton_builder_model_ready{" not in text


def test_registry_is_fresh_and_injectable(fake_triton):
    before = set(REGISTRY._names_to_collectors)
    a = exporter.BatchStatsCollector(fake_triton.url)
    b = exporter.BatchStatsCollector(fake_triton.url)  # no duplicate-timeseries error
    assert a.registry is not b.registry
    assert set(REGISTRY._names_to_collectors) == before
    reg = CollectorRegistry()
    c = exporter.BatchStatsCollector("http://" + fake_triton.url + "/", registry=reg)
    assert c.registry is reg and c.triton_url == "http://" + fake_triton.url
    assert fake_triton.requests == []  # constructing/registering did not call Triton
    _, s = _samples(reg)
    assert _get(s, "triton_builder_exporter_up") == 1.0


def test_normalize_url():
    assert exporter.normalize_url("127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert exporter.normalize_url("https://triton:8000/") == "https://triton:8000"


def test_cli_defaults_and_serve(fake_triton):
    args = exporter.build_arg_parser().parse_args([])
    assert (args.triton_url, args.port, args.address) == ("127.0.0.1:8000", 9102, "127.0.0.1")
    args = exporter.build_arg_parser().parse_args(["--triton-url", fake_triton.url, "--port", "0"])
    collector, httpd, _ = exporter.serve(args)
    try:
        host, port = httpd.server_address[:2]
        assert host == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "triton_builder_exporter_up 1.0" in body
        assert 'triton_builder_model_ready{model="digits",version="1"} 1.0' in body
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_import_has_no_side_effects():
    code = (
        "import threading, monitoring.exporter as e; "
        "from prometheus_client import REGISTRY; "
        "assert threading.active_count() == 1, threading.enumerate(); "
        "assert not any(n.startswith('triton_builder') for n in REGISTRY._names_to_collectors); "
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    help_out = subprocess.run([sys.executable, "-m", "monitoring.exporter", "--help"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    assert help_out.returncode == 0 and "--triton-url" in help_out.stdout
