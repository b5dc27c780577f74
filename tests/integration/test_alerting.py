"""Alerts reach a receiver: a real Prometheus evaluates a rule on a real (down) scrape target, sends the
firing alert to a real Alertmanager configured from monitoring/alertmanager/alertmanager.yml, and
Alertmanager delivers it to a webhook HTTP server this test runs on 127.0.0.1.

Prometheus and Alertmanager come from Debian's `prometheus` and `prometheus-alertmanager` packages
(scripts/install-system-deps.sh): without them the test is skipped locally, and FAILS under CI.
"""

from __future__ import annotations

import json
import queue
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from builder.core.errors import ServerError
from builder.monitoring.alertmanager import LocalAlertmanager
from builder.monitoring.prometheus import LocalPrometheus
from builder.core.processes import free_port
from tests.conftest import in_ci

RULES = """groups:
  - name: alerting-pipeline-test
    rules:
      - alert: AlertingPipelineTest
        expr: up{job="triton"} == 0
        for: 0s
        labels:
          severity: critical
          model: digits_cnn
          version: "1"
        annotations:
          summary: "Prometheus cannot scrape {{ $labels.instance }}"
"""


def _require(command: str, package: str) -> None:
    if shutil.which(command) is None:
        message = f"{command} is not installed (Debian package `{package}`; run scripts/install-system-deps.sh)"
        if in_ci():
            pytest.fail(message + " -- CI is set, so this is a failure")
        pytest.skip(message)


class _Webhook:
    """A tiny HTTP server on 127.0.0.1 recording every JSON body POSTed to it."""

    def __init__(self):
        received = self.received = queue.Queue()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.put((self.path, json.loads(body.decode("utf-8"))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def wait_for_alert(self, name: str, timeout: float) -> tuple[str, dict]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                path, payload = self.received.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no webhook call for alert {name} within {timeout:g} s") from None
            if any(a["labels"].get("alertname") == name for a in payload.get("alerts", [])):
                return path, payload


def test_a_firing_alert_reaches_the_webhook(tmp_path):
    _require("prometheus", "prometheus")
    _require("prometheus-alertmanager", "prometheus-alertmanager")
    rules = tmp_path / "pipeline.yml"
    rules.write_text(RULES)
    down = f"127.0.0.1:{free_port()}"  # nothing listens there: up{job="triton"} == 0 from the first scrape

    started = time.monotonic()
    with _Webhook() as webhook, \
            LocalAlertmanager(webhook.url, group_wait="1s", group_interval="1s") as alertmanager, \
            LocalPrometheus({"triton": down}, rule_files=[rules], alertmanager_url=alertmanager.url) as prometheus:
        assert prometheus.config["alerting"]["alertmanagers"][0]["static_configs"] == [
            {"targets": [alertmanager.url.removeprefix("http://")]}]
        path, payload = webhook.wait_for_alert("AlertingPipelineTest", timeout=60)
        elapsed = time.monotonic() - started
        held = alertmanager.alerts()

    assert path == "/alerts"
    assert payload["status"] == "firing" and payload["receiver"] == "webhook"
    alert = next(a for a in payload["alerts"] if a["labels"]["alertname"] == "AlertingPipelineTest")
    assert alert["status"] == "firing"
    assert alert["labels"]["job"] == "triton" and alert["labels"]["instance"] == down
    assert alert["labels"]["severity"] == "critical"
    assert (alert["labels"]["model"], alert["labels"]["version"]) == ("digits_cnn", "1")
    assert alert["labels"]["deployment"] == "triton-builder"  # prometheus.yml's external label
    assert alert["annotations"]["summary"] == f"Prometheus cannot scrape {down}"
    # grouped as the shipped route says
    assert payload["groupLabels"] == {"alertname": "AlertingPipelineTest", "model": "digits_cnn", "version": "1"}
    assert any(a["labels"]["alertname"] == "AlertingPipelineTest" for a in held)
    assert elapsed < 60


def test_alertmanager_refuses_a_bad_config_with_its_own_words(tmp_path):
    _require("prometheus-alertmanager", "prometheus-alertmanager")
    bad = tmp_path / "alertmanager.yml"
    bad.write_text("route:\n  receiver: nowhere\nreceivers:\n  - name: webhook\n    webhook_configs:\n"
                   "      - url: http://127.0.0.1:1/\n")
    with pytest.raises(ServerError) as err:
        LocalAlertmanager(config_template=bad, ready_timeout=20).start()
    assert "alertmanager exited with code" in str(err.value)
    assert 'undefined receiver \\"nowhere\\" used in route' in str(err.value)  # Alertmanager's logfmt line
    assert f"from {bad}" in str(err.value)  # names the file to fix
