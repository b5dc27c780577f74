"""Monitoring end to end: a real Prometheus (monitoring/prometheus: config + rules) scraping the real
embedded Triton and the real batch-size exporter, after real traffic.

* Every PromQL expression of the Grafana dashboard (all panel targets, ``$model`` -> ``.*``) and of
  the rule files (recording and alerting rules) is run through Prometheus' HTTP API and must
  return data. Targets marked ``"triton_builder_requires": "gpu"`` are skipped on a machine
  without GPU metrics, and exactly those may be empty there.
* Every metric name referenced anywhere must be known to Prometheus (``/api/v1/label/__name__/values``).
* Drift: traffic drawn like the validation data keeps every PSI/JS score under the model's
  threshold; a different class mix and rescaled inputs push them over within the drift window,
  and ``ModelDriftPSIOverThreshold`` becomes pending/firing in ``/api/v1/alerts``; one window of
  in-distribution rows, sent from two clients to the model's two instances, brings every score back
  to what those rows scored before and the alert expression returns nothing (the instances share
  one window: tests/unit/test_drift_instances.py).

How alert expressions are checked: an alert expression such as ``a > 0.1`` only returns series
while it would fire, so "returns data" cannot be asked of it directly. Each comparison operator at
the top level of the expression (outside label matchers and strings) gets the ``bool`` modifier
(``a > bool 0.1``): the expression then returns a 0/1 sample for every series pair that its vector
matching (``on``/``group_left``/``and``) joins, i.e. exactly when the metrics it reads exist and
their labels line up, whether or not the alert would fire. The unmodified expression is also run
(it must evaluate without error), and ``/api/v1/rules`` must report every rule healthy.

One dedicated EmbeddedServer (``--metrics-config=summary_latencies=true``) serves a copy of the
session repository (bert_tiny; digits_cnn rebuilt with deploy.monitor) plus a tiny python model that always
raises (the failure counters), with digits_cnn's drift window made small (``drift_window`` 128 -- the alert
wants >= 100 rows -- and ``drift_publish_every`` 1) and 2 instances in the copy's config.pbtxt, so
drift shows within seconds. The exporter runs as ``python -m monitoring.exporter`` (a subprocess).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from builder.pipeline import build
from builder.serving.embedded import EmbeddedServer
from builder.spec.model import load_spec
from builder.monitoring.prometheus import LocalExporter, LocalPrometheus
from tests.conftest import EXAMPLES, ROOT, in_ci
from tests.unit.test_dashboard import metric_names
from tests.unit.test_monitoring_queries import (ALERTS, RECORDING, RULES, TARGETS, dashboard_variable_queries,
                                             with_bool)

pytestmark = pytest.mark.integration

DRIFT_WINDOW = 128  # >= 100: the drift alerts wait for 100 rows in the window
SETTLE_TIMEOUT_S = 45.0
FAILING_MODEL = "always_fails"
DIGITS_VAL = np.load(EXAMPLES / "digits" / "data" / "val.npz")
BERT_VAL = np.load(EXAMPLES / "bert_tiny" / "data" / "val.npz")


# --------------------------------------------------------------------------------------------
# the stack: Triton + exporter + Prometheus


def _set_parameter(config: str, key: str, value: str) -> str:
    """Set a config.pbtxt ``parameters`` entry (text edit of the test's own copy)."""
    block = re.compile(r'parameters\s*\{\s*key:\s*"' + re.escape(key) + r'"\s*value\s*\{\s*string_value:\s*"[^"]*"\s*\}\s*\}')
    entry = f'parameters {{\n  key: "{key}"\n  value {{ string_value: "{value}" }}\n}}'
    if block.search(config):
        return block.sub(entry, config)
    return config.rstrip("\n") + "\n" + entry + "\n"


@dataclass
class Stack:
    triton: EmbeddedServer
    exporter: LocalExporter
    prometheus: LocalPrometheus
    repository: Path
    notes: dict = field(default_factory=dict)

    def triton_metrics(self, name: str, **labels) -> dict[tuple, float]:
        """Current samples of one metric family straight from Triton's endpoint: {sorted labels: value}."""
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(self.triton.metrics_url, timeout=10) as r:
            text = r.read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                # the parser names counter samples <name>_total even where Triton writes <name>
                if sample.name in (name, name + "_total") and all(sample.labels.get(k) == v for k, v in labels.items()):
                    out[tuple(sorted(sample.labels.items()))] = sample.value
        return out


def _write_failing_model(folder: Path) -> None:
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        f'name: "{FAILING_MODEL}"\nbackend: "python"\nmax_batch_size: 8\n'
        'input { name: "x" data_type: TYPE_FP32 dims: [ 2 ] }\n'
        'output { name: "y" data_type: TYPE_FP32 dims: [ 2 ] }\n'
        'instance_group { kind: KIND_CPU count: 1 }\n')
    (folder / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        raise RuntimeError('this model fails on purpose (triton-builder monitoring test)')\n")


@pytest.fixture(scope="module")
def stack(built_repository, tmp_path_factory):
    if shutil.which("prometheus") is None:
        message = "prometheus not installed: run scripts/install-system-deps.sh (or `make setup`)"
        if in_ci():
            pytest.fail(message + " -- CI is set, so this is a failure")
        pytest.skip(message + "; set CI=true to make this a failure")
    repo = tmp_path_factory.mktemp("monitoring") / "model_repository"
    shutil.copytree(built_repository, repo, ignore=shutil.ignore_patterns(".triton-builder.lock", "__pycache__"))
    # digits_cnn monitored as deploy.monitor serves it on the stock image: the ensemble over the standard folder
    # digits_cnn__model and the python step digits_cnn__monitor, which publishes the drift and NaN/Inf series
    shutil.rmtree(repo / "digits_cnn")
    spec = load_spec(EXAMPLES / "digits" / "spec.yaml")
    spec.deploy.monitor = True
    build(spec, repo, variants=["onnx"], benchmark_seconds=0, progress=lambda m: None)
    monitor = repo / "digits_cnn__monitor" / "config.pbtxt"
    text = _set_parameter(monitor.read_text(), "drift_window", str(DRIFT_WINDOW))
    text = _set_parameter(text, "drift_publish_every", "1")
    # two stub processes: the drift gauges must describe both (one window shared by the instances)
    text, counts = re.subn(r"(instance_group \{[^}]*count: )\d+", r"\g<1>2", text)
    assert counts == 1, "digits_cnn__monitor's config has no instance_group count to set"
    monitor.write_text(text)
    config = repo / "digits_cnn__model" / "config.pbtxt"
    text = config.read_text()
    # concurrent requests meet in the queue on any host, however fast it executes: batches > 1 form
    text, delays = re.subn(r"max_queue_delay_microseconds: \d+", "max_queue_delay_microseconds: 20000", text)
    assert delays == 1, "digits_cnn__model's config has no dynamic_batching queue delay to set"
    # two model instances, as the build's sizing gives most hosts
    text, counts = re.subn(r"(instance_group \{[^}]*count: )\d+", r"\g<1>2", text)
    assert counts == 1, "digits_cnn__model's config has no instance_group count to set"
    config.write_text(text)
    _write_failing_model(repo / FAILING_MODEL)

    started = time.monotonic()
    triton = EmbeddedServer(repo, extra_args=["--metrics-config=summary_latencies=true"], ready_timeout=90)
    exporter = prometheus = None
    try:
        triton.start()
        exporter = LocalExporter(triton.http_url).start()  # `python -m monitoring.exporter`, a subprocess
        prometheus = LocalPrometheus({"triton": triton.metrics_url, "triton-builder-exporter": exporter.address},
                                     scrape_interval="1s", evaluation_interval="1s").start()
        prometheus.wait_for_targets(timeout=20)
        stack = Stack(triton, exporter, prometheus, repo)
        stack.notes["start_s"] = time.monotonic() - started
        yield stack
        print(f"\nmonitoring stack timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in stack.notes.items()))
    finally:
        pids = {"prometheus": prometheus and prometheus.pid, "exporter": exporter and exporter.pid,
                "tritonserver": triton.pid}
        for process in (prometheus, exporter, triton):
            if process is not None:
                process.stop()
    left = [f"{name} {pid}" for name, pid in pids.items() if pid is not None and _alive(pid)]
    assert not left, f"still running after stop(): {left}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not running; our Popen objects reap on wait(), so this is a live process
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


# --------------------------------------------------------------------------------------------
# traffic


def _digits_input(rows: np.ndarray):
    item = httpclient.InferInput("image", list(rows.shape), "FP32")
    item.set_data_from_numpy(np.ascontiguousarray(rows, dtype=np.float32))
    return [item]


def _bert_inputs(i: int):
    ids = BERT_VAL["input_ids"][i:i + 1]
    mask = BERT_VAL["attention_mask"][i:i + 1]
    items = []
    for name, value in (("input_ids", ids), ("attention_mask", mask)):
        item = httpclient.InferInput(name, list(value.shape), "INT64")
        item.set_data_from_numpy(np.ascontiguousarray(value))
        items.append(item)
    return items


def _send_concurrent(stack: Stack, digits_threads: int = 8, per_thread: int = 40, bert_requests: int = 12) -> None:
    """Single-row requests from many threads at once, so Triton's dynamic batcher forms batches > 1."""
    images = DIGITS_VAL["image"]

    def digits_worker(k: int) -> None:
        client = httpclient.InferenceServerClient(stack.triton.http_url)
        try:
            for j in range(per_thread):
                row = (k * per_thread + j) % len(images)
                client.infer("digits_cnn", _digits_input(images[row:row + 1]))
        finally:
            client.close()

    def bert_worker(k: int) -> None:
        client = httpclient.InferenceServerClient(stack.triton.http_url)
        try:
            for j in range(k, bert_requests, 2):
                client.infer("bert_tiny", _bert_inputs(j % len(BERT_VAL["input_ids"])))
        finally:
            client.close()

    with ThreadPoolExecutor(digits_threads + 2) as pool:
        futures = [pool.submit(digits_worker, k) for k in range(digits_threads)]
        futures += [pool.submit(bert_worker, k) for k in range(2)]
        for f in futures:
            f.result()


def _send_failing(stack: Stack, count: int = 5) -> None:
    """Requests whose model execution fails: nv_inference_request_failure{reason="BACKEND"}.

    Triton 2.51 counts neither requests it rejects before scheduling (wrong shape, batch too
    large) nor python-backend error *responses* (what the generated model.py returns when
    onnxruntime fails on one request) in nv_inference_request_failure; an ``execute()`` that
    raises is counted (reason BACKEND), so the test repository holds a model that always raises.
    """
    client = httpclient.InferenceServerClient(stack.triton.http_url)
    try:
        for _ in range(count):
            item = httpclient.InferInput("x", [1, 2], "FP32")
            item.set_data_from_numpy(np.zeros((1, 2), np.float32))
            with pytest.raises(InferenceServerException, match="fails on purpose"):
                client.infer(FAILING_MODEL, [item])
    finally:
        client.close()


def _failures(stack: Stack) -> float:
    return sum(stack.triton_metrics("nv_inference_request_failure").values())


@pytest.fixture(scope="module")
def traffic(stack):
    """Successful requests on both models (concurrent: batches > 1 form), a few failing ones, then wait
    until Prometheus has scraped them and the rules have been evaluated (bounded)."""
    started = time.monotonic()
    _send_concurrent(stack)
    _send_failing(stack)
    assert _failures(stack) > 0, "Triton counted no failed request"
    stack.notes["traffic_s"] = time.monotonic() - started

    prom = stack.prometheus
    gpu_host = "nv_gpu_utilization" in prom.metric_names()

    def pending() -> list[str]:
        left = [t.id for t in TARGETS if (gpu_host or not t.gpu) and not prom.query(t.expr)]
        left += [r.name for r in RECORDING if not prom.query(r.expr) or not prom.query(r.name)]
        left += [r.name for r in ALERTS if not prom.query(with_bool(r.expr))]
        if not prom.query("sum(nv_inference_request_failure) > 0"):
            left.append("failures scraped")
        return left

    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while pending() and time.monotonic() < deadline:
        time.sleep(1.0)
    time.sleep(1.5)  # one more scrape + evaluation of every group
    stack.notes["settle_s"] = time.monotonic() - started - stack.notes["traffic_s"]
    return {"gpu_host": gpu_host}


# --------------------------------------------------------------------------------------------
# dashboard and rules against real metrics


def test_traffic_reached_prometheus(stack, traffic):
    prom = stack.prometheus
    success = prom.values("sum by (model) (nv_inference_request_success)")
    assert {dict(k)["model"] for k, v in success.items() if v > 0} >= {"digits_cnn", "bert_tiny"}, success
    failed = prom.values("sum by (model, reason) (nv_inference_request_failure) > 0")
    assert {(dict(k)["model"], dict(k)["reason"]) for k in failed} == {(FAILING_MODEL, "BACKEND")}, failed
    ratio = prom.values(f'triton:request_failure_ratio:rate1m{{model="{FAILING_MODEL}"}}')
    assert list(ratio.values()) == [1.0], ratio
    # the batches form in the model step (an ensemble forms none)
    formed = prom.values('sum by (batch_size) (triton_builder_formed_batch_executions_total{model="digits_cnn__model"})')
    sizes = {int(dict(k)["batch_size"]): v for k, v in formed.items() if v > 0}
    assert sizes and max(sizes) > 1, f"the exporter saw no batch > 1 for digits_cnn: {sizes}"


def test_exporter_also_runs_in_process(stack, traffic):
    with LocalExporter(stack.triton.http_url, in_process=True) as exporter:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(exporter.metrics_url, timeout=10) as r:
            text = r.read().decode()
    assert "triton_builder_exporter_up 1.0" in text, text[:2000]
    assert 'triton_builder_model_ready{model="digits_cnn",version="1"} 1.0' in text, text[:2000]


@pytest.mark.parametrize("target", TARGETS, ids=[t.id for t in TARGETS])
def test_dashboard_target_returns_data(stack, traffic, target):
    if target.gpu and not traffic["gpu_host"]:
        pytest.skip(f"{target.id}: GPU-only target, no GPU metrics on this machine ({target.expr})")
    result = stack.prometheus.query(target.expr)
    assert result, f"dashboard panel {target.panel!r} target {target.ref}: no data for {target.expr}"


def test_only_the_gpu_targets_are_empty(stack, traffic):
    empty = [t.id for t in TARGETS if not stack.prometheus.query(t.expr)]
    gpu = [t.id for t in TARGETS if t.gpu]
    assert gpu, "the dashboard has no GPU-marked target"
    if traffic["gpu_host"]:
        assert empty == [], f"targets without data on a GPU host: {empty}"
    else:
        print("skipped (GPU-only, no GPU metrics here):", ", ".join(empty))
        assert empty == gpu, f"empty targets {empty} are not exactly the GPU-marked ones {gpu}"


@pytest.mark.parametrize("variable, selector, label", dashboard_variable_queries())
def test_dashboard_variable_lists_the_served_models(stack, traffic, variable, selector, label):
    values = stack.prometheus.label_values(label, match=selector)
    assert {"digits_cnn", "bert_tiny"} <= set(values), f"${variable} = label_values({selector}, {label}): {values}"


@pytest.mark.parametrize("rule", RECORDING, ids=[r.name for r in RECORDING])
def test_recording_rule_returns_data(stack, traffic, rule):
    prom = stack.prometheus
    assert prom.query(rule.expr), f"recording rule {rule.name}: its expression returns no data:\n{rule.expr}"
    assert prom.query(rule.name), f"recording rule {rule.name}: no recorded series in Prometheus"


@pytest.mark.parametrize("rule", ALERTS, ids=[r.name for r in ALERTS])
def test_alert_expression_returns_data_in_bool_form(stack, traffic, rule):
    prom = stack.prometheus
    prom.query(rule.expr)  # as written: must evaluate (ServerError on a PromQL error), data only when firing
    as_bool = with_bool(rule.expr)
    result = prom.query(as_bool)
    assert result, f"alert {rule.name}: no data even with `bool` comparisons (metrics missing or labels not matching):\n{as_bool}"
    assert all(r["value"][1] in ("0", "1") for r in result), result


def test_every_rule_is_healthy(stack, traffic):
    loaded = stack.prometheus.rules()
    names = {r["name"] for r in loaded}
    assert names == {r.name for r in RULES}, f"rules loaded by Prometheus differ from the rule files: {names ^ {r.name for r in RULES}}"
    bad = {r["name"]: (r.get("health"), r.get("lastError")) for r in loaded if r.get("health") != "ok" or r.get("lastError")}
    assert not bad, f"rules not healthy: {bad}"


def test_every_referenced_metric_name_exists(stack, traffic):
    known = stack.prometheus.metric_names()
    where: dict[str, set[str]] = {}
    for t in TARGETS:
        if t.gpu and not traffic["gpu_host"]:
            continue
        for name in metric_names(t.expr):
            where.setdefault(name, set()).add(f"dashboard {t.id}")
    for variable, selector, _ in dashboard_variable_queries():
        for name in metric_names(selector):
            where.setdefault(name, set()).add(f"dashboard variable ${variable}")
    for rule in RULES:
        for name in metric_names(rule.expr):
            where.setdefault(name, set()).add(f"{rule.kind} {rule.name}")
        if rule.kind == "record":
            where.setdefault(rule.name, set()).add(f"record {rule.name}")
    assert len(where) > 30, sorted(where)
    missing = {name: sorted(users) for name, users in where.items() if name not in known}
    assert not missing, "metric names Prometheus does not know (typo, or not published by Triton 2.51 / the " \
                        f"exporter / the drift hook): {json.dumps(missing, indent=1)}"


# --------------------------------------------------------------------------------------------
# drift, end to end


def _send_rows(stack: Stack, rows: np.ndarray, batch: int = 4, clients: int = 1) -> None:
    """Every row once, in requests of ``batch`` rows; ``clients`` > 1 send their shares at once, so
    Triton hands requests to both instances."""
    def send(share: np.ndarray) -> None:
        client = httpclient.InferenceServerClient(stack.triton.http_url)
        try:
            for start in range(0, len(share), batch):
                client.infer("digits_cnn", _digits_input(share[start:start + batch]))
        finally:
            client.close()

    with ThreadPoolExecutor(clients) as pool:
        for done in [pool.submit(send, share) for share in np.array_split(rows, clients)]:
            done.result()


def _scores(stack: Stack) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for metric in ("psi", "js"):
        for labels, value in stack.triton_metrics(f"triton_builder_drift_{metric}", model="digits_cnn").items():
            out.setdefault(dict(labels)["feature"], {})[metric] = value
    return out


def _thresholds(stack: Stack) -> dict[str, float]:
    return {dict(k)["metric"]: v for k, v in stack.triton_metrics("triton_builder_drift_threshold", model="digits_cnn").items()}


def _prometheus_caught_up(stack: Stack, scores: dict[str, dict[str, float]]) -> bool:
    seen = stack.prometheus.values('triton_builder_drift_psi{model="digits_cnn"}')
    current = {dict(k)["feature"]: v for k, v in seen.items()}
    return bool(current) and all(math.isclose(current.get(f, math.nan), s["psi"], rel_tol=1e-9, abs_tol=1e-12)
                                 for f, s in scores.items())


def _drift_alerts(stack: Stack) -> list[dict]:
    return [a for a in stack.prometheus.alerts()
            if a["labels"].get("alertname", "").startswith("ModelDrift") and a["labels"].get("model") == "digits_cnn"]


def test_drift_in_distribution_stays_quiet_and_shift_raises_the_alert(stack):
    prom = stack.prometheus
    images, labels = DIGITS_VAL["image"], DIGITS_VAL["labels"]
    psi_alert = next(r for r in ALERTS if r.name == "ModelDriftPSIOverThreshold")

    # 1. like the validation data: the whole set, in order (the window keeps its last 128 rows)
    _send_rows(stack, images)
    thresholds = _thresholds(stack)
    assert thresholds == {"psi": 0.25, "js": 0.2}, thresholds
    samples = stack.triton_metrics("triton_builder_drift_window_samples", model="digits_cnn")
    assert list(samples.values()) == [DRIFT_WINDOW], samples
    calm = _scores(stack)
    assert set(calm) == {"input:image[ch0]", "output:logits:class", "output:logits:score"}, calm
    over = {f: s for f, s in calm.items() if s["psi"] >= thresholds["psi"] or s["js"] >= thresholds["js"]}
    assert not over, f"validation-like traffic scored over the thresholds {thresholds}: {over}"
    # ... read back through Prometheus, and no drift alert once the rules saw it
    prom.wait_for(lambda: _prometheus_caught_up(stack, calm), timeout=15, what="Prometheus scraped the calm scores")
    prom.wait_for(lambda: not _drift_alerts(stack), timeout=15, what="no drift alert for calm traffic")
    assert not [r for r in prom.query(psi_alert.expr) if r["metric"].get("model") == "digits_cnn"]

    # 2. a different class mix: only images of the digit 0. The class mix (and the score) drift,
    #    the pooled pixel distribution hardly moves.
    zeros = images[labels == 0]
    _send_rows(stack, zeros[np.arange(DRIFT_WINDOW) % len(zeros)])
    mix = _scores(stack)
    assert mix["output:logits:class"]["psi"] > thresholds["psi"], mix
    assert mix["output:logits:class"]["js"] > thresholds["js"], mix
    assert mix["input:image[ch0]"]["psi"] < thresholds["psi"], mix

    # 3. rescaled inputs (x * 0.3 + 0.5): the input feature drifts far over the threshold
    _send_rows(stack, (images[:DRIFT_WINDOW] * 0.3 + 0.5).astype(np.float32))
    shifted = _scores(stack)
    assert shifted["input:image[ch0]"]["psi"] > thresholds["psi"], shifted
    assert shifted["input:image[ch0]"]["js"] > thresholds["js"], shifted

    # ... through Prometheus: the alert expression returns the drifting feature, and the alert is
    # pending (its `for:` is 1m) or firing in /api/v1/alerts
    prom.wait_for(lambda: _prometheus_caught_up(stack, shifted), timeout=15, what="Prometheus scraped the drift")
    drifting = prom.wait_for(
        lambda: [r["metric"]["feature"] for r in prom.query(psi_alert.expr) if r["metric"].get("model") == "digits_cnn"],
        timeout=15, what="the PSI alert expression returns digits_cnn")
    assert "input:image[ch0]" in drifting, drifting

    def psi_alert_active():
        return [a for a in _drift_alerts(stack) if a["labels"]["alertname"] == "ModelDriftPSIOverThreshold"
                and a["labels"].get("feature") == "input:image[ch0]" and a["state"] in ("pending", "firing")]

    print("\ndigits_cnn drift (psi, js): calm", {f: (round(v["psi"], 3), round(v["js"], 3)) for f, v in calm.items()},
          "| digit 0 only", {f: (round(v["psi"], 3), round(v["js"], 3)) for f, v in mix.items()},
          "| x*0.3+0.5", {f: (round(v["psi"], 3), round(v["js"], 3)) for f, v in shifted.items()})
    active = prom.wait_for(psi_alert_active, timeout=15, what="ModelDriftPSIOverThreshold pending or firing")
    assert float(active[0]["value"]) > thresholds["psi"], active
    assert prom.values('triton_builder:drift_psi:max{model="digits_cnn"}')

    # 4. back to normal: the 128 rows that scored `calm` in step 1, from two clients at once. The window
    #    is the last 128 rows whichever instance served them, so it holds exactly those rows again
    #    (windows of their own kept half of the shifted rows each, and scored far over the threshold)
    _send_rows(stack, images[-DRIFT_WINDOW:], clients=2)
    again = _scores(stack)
    assert again == {f: pytest.approx(s, rel=1e-9) for f, s in calm.items()}, (again, calm)
    samples = stack.triton_metrics("triton_builder_drift_window_samples", model="digits_cnn")
    assert list(samples.values()) == [DRIFT_WINDOW], samples
    prom.wait_for(lambda: _prometheus_caught_up(stack, again), timeout=15, what="Prometheus scraped the calm scores")
    assert not [r for r in prom.query(psi_alert.expr) if r["metric"].get("model") == "digits_cnn"]
    prom.wait_for(lambda: [v for v in prom.values('triton_builder:drift_psi:max{model="digits_cnn"}').values()
                           if v < thresholds["psi"]],
                  timeout=15, what="the recorded worst PSI of digits_cnn back under the threshold")
