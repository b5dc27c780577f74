"""The PromQL the monitoring stack ships, read offline: every Grafana dashboard target and every rule
(recording and alerting) of monitoring/prometheus/rules, and ``with_bool``, which turns an alert
expression into one that returns a 0/1 sample per joined series (see tests/integration/test_monitoring.py,
which runs all of them against a live Prometheus). Also the Prometheus config rendering and its
missing-binary error, which need no running service."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from builder.core.errors import ServerError
from builder.monitoring.prometheus import LocalPrometheus, render_config
from tests.conftest import ROOT

MONITORING = ROOT / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "triton.json"
RULE_FILES = sorted((MONITORING / "prometheus" / "rules").glob("*.yml"))


# --------------------------------------------------------------------------------------------
# the expressions under test


def _panels(dashboard):
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _substitute(expr: str) -> str:
    return expr.replace("${model}", ".*").replace("$model", ".*")


@dataclass(frozen=True)
class Target:
    panel: str
    ref: str
    expr: str
    gpu: bool

    @property
    def id(self) -> str:
        return f"{self.panel}/{self.ref}"


@dataclass(frozen=True)
class Rule:
    kind: str  # "record" | "alert"
    name: str
    expr: str


def dashboard_targets() -> list[Target]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [Target(p["title"], t["refId"], _substitute(t["expr"]), t.get("triton_builder_requires") == "gpu")
            for p in _panels(dashboard) for t in p.get("targets", []) if t.get("expr", "").strip()]


def dashboard_variable_queries() -> list[tuple[str, str, str]]:
    """(variable, metric selector, label) of every ``label_values(selector, label)`` variable."""
    out = []
    for var in json.loads(DASHBOARD.read_text())["templating"]["list"]:
        if var["type"] == "datasource":  # picks the Prometheus datasource (${datasource}), queries nothing
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        found = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", query)
        assert found, f"variable {var['name']}: only label_values(selector, label) is supported here: {query}"
        out.append((var["name"], found.group(1), found.group(2)))
    return out


def rules() -> list[Rule]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                kind = "record" if "record" in rule else "alert"
                out.append(Rule(kind, rule[kind], rule["expr"]))
    return out


TARGETS = dashboard_targets()
RULES = rules()
RECORDING = [r for r in RULES if r.kind == "record"]
ALERTS = [r for r in RULES if r.kind == "alert"]

_COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")


def with_bool(expr: str) -> str:
    """Add the ``bool`` modifier to every comparison operator outside label matchers and strings."""
    out, i, braces, quote = [], 0, 0, None
    while i < len(expr):
        ch = expr[i]
        if quote:
            out.append(ch)
            if ch == "\\" and i + 1 < len(expr):
                out.append(expr[i + 1])
                i += 2
                continue
            if ch == quote:
                quote = None
            i += 1
            continue
        if ch in "\"'`":
            quote = ch
        elif ch == "{":
            braces += 1
        elif ch == "}":
            braces -= 1
        elif braces == 0:
            op = next((o for o in _COMPARISONS if expr.startswith(o, i)), None)
            if op is not None:
                rest = expr[i + len(op):]
                out.append(op if re.match(r"\s*bool\b", rest) else op + " bool")
                i += len(op)
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def test_with_bool_rewrites_only_comparisons():
    assert with_bool('up{job=~"a|b", x!="y"} == 0') == 'up{job=~"a|b", x!="y"} == bool 0'
    assert with_bool("a > on (m) group_left () b and on (m) c >= 100") == \
        "a > bool on (m) group_left () b and on (m) c >= bool 100"
    assert with_bool('a > bool 1 and label_replace(b, "q", "$1", "q", "(>=)")') == \
        'a > bool 1 and label_replace(b, "q", "$1", "q", "(>=)")'


def test_render_config_rewrites_targets_intervals_and_rule_paths():
    config = render_config(scrape_targets={"triton": "http://127.0.0.1:1234/metrics",
                                           "triton-builder-exporter": "127.0.0.1:5678"})
    assert config["global"]["scrape_interval"] == config["global"]["evaluation_interval"] == "1s"
    assert config["global"]["scrape_timeout"] == "1s"  # capped at the interval
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["triton"]["static_configs"] == [{"targets": ["127.0.0.1:1234"]}]
    assert jobs["triton"]["metrics_path"] == "/metrics"
    assert jobs["triton-builder-exporter"]["static_configs"] == [{"targets": ["127.0.0.1:5678"]}]
    assert [Path(f) for f in config["rule_files"]] == [MONITORING / "prometheus" / "rules" / "*.yml"]
    only_triton = render_config(scrape_targets={"triton": "127.0.0.1:1"}, rule_files=[])
    assert [j["job_name"] for j in only_triton["scrape_configs"]] == ["triton"] and only_triton["rule_files"] == []


def test_missing_prometheus_binary_is_a_clear_error(tmp_path):
    with pytest.raises(ServerError, match=r"install-system-deps\.sh.*make setup"):
        LocalPrometheus({"triton": "127.0.0.1:1"}, binary=str(tmp_path / "no-prometheus")).start()
