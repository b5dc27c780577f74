"""Static checks of the Grafana dashboard and provisioning in monitoring/grafana/.

Every metric name a panel query uses must be a Triton metric, one of
triton-builder's own metrics, Prometheus' `up`, or a recording rule defined in
monitoring/prometheus/rules/recording.yml. (The PromQL syntax of every query is
checked with promtool in test_promtool.py; running them against a real
Prometheus is the integration test's job.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MON = ROOT / "monitoring"
DASHBOARD = MON / "grafana" / "dashboards" / "triton.json"
DATASOURCE = MON / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = MON / "grafana" / "provisioning" / "dashboards" / "dashboards.yml"
RECORDING = MON / "prometheus" / "rules" / "recording.yml"

_PHASES = ("request", "queue", "compute_input", "compute_infer", "compute_output")
TRITON_METRICS = {
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_pending_request_count",
    *(f"nv_inference_{p}_duration_us" for p in _PHASES),
    *(f"nv_inference_{p}_summary_us{suffix}" for p in _PHASES for suffix in ("", "_sum", "_count")),
    "nv_cpu_utilization",
    "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes",
    "nv_pinned_memory_pool_total_bytes",
    "nv_pinned_memory_pool_used_bytes",
}
TRITON_GPU_METRICS = {
    "nv_gpu_utilization",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage",
    "nv_energy_consumption",
}
OUR_METRICS = {
    "triton_builder_drift_psi",
    "triton_builder_drift_js",
    "triton_builder_drift_threshold",
    "triton_builder_drift_window_samples",
    "triton_builder_formed_batch_executions_total",
    "triton_builder_formed_batch_size_average",
    "triton_builder_exporter_up",
    "triton_builder_model_ready",
    "triton_builder_nonfinite_inputs_total",
}
PROMETHEUS_METRICS = {"up"}

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
             "group_left", "group_right", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression (regex-based, good enough for our queries)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # string literals
    s = re.sub(r"\$\{[^}]*\}|\$\w+", " ", s)  # Grafana variables
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range / subquery selectors
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)  # label lists
    names = set()
    for m in re.finditer(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", s):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def recording_rule_names() -> set[str]:
    doc = yaml.safe_load(RECORDING.read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


@pytest.fixture(scope="module")
def dashboard():
    return json.loads(DASHBOARD.read_text())


def _panels(dashboard):
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows, if any are ever added
    return out


def test_metric_name_parser():
    assert metric_names('sum by (model, version) (rate(nv_inference_count{model=~"$model"}[1m]))') == {
        "nv_inference_count"}
    assert metric_names('a:b:c / on (model) group_left () x_total{q="0.99"} > bool 1 and up') == {
        "a:b:c", "x_total", "up"}
    assert metric_names('label_replace(foo, "quantile", "$1", "q", "(0\\\\.[0-9]*)")') == {"foo"}
    assert metric_names("histogram_quantile(0.99, rate(h_bucket[5m])) * 1e3") == {"h_bucket"}


def test_dashboard_loads_and_is_well_formed(dashboard):
    assert dashboard["uid"] and dashboard["title"]
    panels = _panels(dashboard)
    assert len(panels) >= 15
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in panels:
        if p.get("type") == "row":
            continue
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]), p["title"]
        targets = [t for t in p.get("targets", []) if t.get("expr", "").strip()]
        assert targets, f"panel {p['title']!r} has no target with an expr"
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]


def test_every_metric_name_is_known(dashboard):
    known = TRITON_METRICS | TRITON_GPU_METRICS | OUR_METRICS | PROMETHEUS_METRICS | recording_rule_names()
    unknown = {}
    for p in _panels(dashboard):
        for t in p.get("targets", []):
            for name in metric_names(t.get("expr", "")) - known:
                unknown.setdefault(name, []).append(p["title"])
    assert not unknown, f"unknown metric names in dashboard exprs: {unknown}"


def test_gpu_targets_are_marked(dashboard):
    """Targets that can only have data on a GPU host carry "triton_builder_requires": "gpu"."""
    gpu_seen = False
    for p in _panels(dashboard):
        for t in p.get("targets", []):
            uses_gpu = bool(metric_names(t["expr"]) & TRITON_GPU_METRICS)
            marked = t.get("triton_builder_requires") == "gpu"
            assert uses_gpu == marked, (p["title"], t["expr"], t.get("triton_builder_requires"))
            assert t.get("triton_builder_requires") in (None, "gpu")
            gpu_seen |= marked
    assert gpu_seen


def test_required_panels_present(dashboard):
    exprs = " ".join(t["expr"] for p in _panels(dashboard) for t in p.get("targets", []))
    for needle in [
        "triton:requests:rate1m",  # throughput
        "triton:request_failure_by_reason:rate1m",  # failures by reason
        "triton:request_latency_seconds:avg1m",  # average latency
        "triton:queue_latency_seconds:avg1m",
        "triton:compute_input_latency_seconds:avg1m",
        "triton:compute_infer_latency_seconds:avg1m",
        "triton:compute_output_latency_seconds:avg1m",
        "triton:request_latency_seconds:quantile",  # p50/p95/p99
        "triton:formed_batch_size:avg_rate1m",
        "triton_builder_formed_batch_size_average",
        "triton_builder:formed_batch_executions:ratio1m",  # distribution
        "triton:pending_requests:sum",
        "nv_cpu_utilization",
        "nv_cpu_memory_used_bytes",
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
        "triton_builder_drift_psi",
        "triton_builder_drift_js",
        'triton_builder_drift_threshold{model=~"$model", metric="psi"}',
        'triton_builder_drift_threshold{model=~"$model", metric="js"}',
        "triton_builder_nonfinite_inputs_total",
    ]:
        assert needle in exprs, needle


def test_model_variable(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "model" in variables
    v = variables["model"]
    q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
    assert q.startswith("label_values(") and ", model)" in q
    assert metric_names(q[len("label_values("):-len(", model)")]) <= TRITON_METRICS
    assert v["includeAll"] and v["allValue"] == ".*"
    # $model is only ever used as a regex matcher, so substituting ".*" keeps queries valid
    for p in _panels(dashboard):
        for t in p.get("targets", []):
            for m in re.finditer(r'(\w+)\s*(=~|!~|=|!=)\s*"[^"]*\$\{?model', t["expr"]):
                assert m.group(2) == "=~", (p["title"], t["expr"])


def test_datasource_is_a_template_variable_defaulting_to_the_provisioned_one(dashboard):
    """Every panel, target and query variable uses ``${datasource}`` (so the dashboard works on an existing
    Grafana, e.g. kube-prometheus-stack's sidecar); the variable defaults to compose's provisioned uid."""
    ds = yaml.safe_load(DATASOURCE.read_text())["datasources"]
    assert len(ds) == 1
    assert ds[0]["url"] == "http://prometheus:9090" and ds[0]["type"] == "prometheus"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    variable = variables["datasource"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    assert variable["current"]["value"] == ds[0]["uid"]
    assert dashboard["templating"]["list"][0] is variable  # defined before the variables that use it
    wanted = {"type": "prometheus", "uid": "${datasource}"}
    for p in _panels(dashboard):
        if "datasource" in p:
            assert p["datasource"] == wanted, p["title"]
        for t in p.get("targets", []):
            assert t["datasource"] == wanted, p["title"]
    for v in dashboard["templating"]["list"]:
        if v["type"] != "datasource":
            assert v["datasource"] == wanted, v["name"]
    text = DASHBOARD.read_text()
    assert ds[0]["uid"] not in text.replace(f'"value": "{ds[0]["uid"]}"', ""), "a hard-coded datasource uid is left"
    providers = yaml.safe_load(PROVIDERS.read_text())["providers"]
    assert providers[0]["type"] == "file" and providers[0]["options"]["path"]
