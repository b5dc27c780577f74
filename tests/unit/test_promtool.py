"""Prometheus config, rules and rule unit tests, checked with promtool (offline).

promtool comes from Debian's `prometheus` package (scripts/install-system-deps.sh).
Without it these tests are skipped locally, but FAIL when the CI environment
variable is set: CI installs it, so a missing promtool there is a real error.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.conftest import require_command

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "monitoring" / "prometheus"
CONFIG = PROM / "prometheus.yml"
RULES = sorted((PROM / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROM / "tests").glob("*.yml"))
DASHBOARD = ROOT / "monitoring" / "grafana" / "dashboards" / "triton.json"


def _promtool() -> str:
    return require_command("promtool", "prometheus")


def _run(cmd, cwd=PROM):
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    return out.returncode, out.stdout + out.stderr


def test_files_exist():
    assert CONFIG.is_file()
    assert {p.name for p in RULES} >= {"recording.yml", "alerts.yml"}
    assert RULE_TESTS, "no promtool rule tests in monitoring/prometheus/tests/"


def test_config_scrape_jobs_and_rule_files():
    cfg = yaml.safe_load(CONFIG.read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert jobs["triton"]["static_configs"][0]["targets"] == ["127.0.0.1:8002"]
    assert jobs["triton-builder-exporter"]["static_configs"][0]["targets"] == ["127.0.0.1:9102"]
    assert cfg["rule_files"] == ["rules/*.yml"]
    assert cfg["global"]["scrape_interval"] in ("2s", "3s", "4s", "5s")


def test_check_config():
    promtool = _promtool()  # in the test body: under CI a missing promtool is a FAILED test
    rc, out = _run([promtool, "check", "config", str(CONFIG)])
    assert rc == 0, out
    for rule_file in RULES:  # the config's rule_files glob picked them all up
        assert rule_file.name in out, out


def test_check_rules():
    promtool = _promtool()  # in the test body: under CI a missing promtool is a FAILED test
    rc, out = _run([promtool, "check", "rules", *map(str, RULES)])
    assert rc == 0, out


def test_rule_unit_tests():
    promtool = _promtool()  # in the test body: under CI a missing promtool is a FAILED test
    rc, out = _run([promtool, "test", "rules", *(p.name for p in RULE_TESTS)], cwd=PROM / "tests")
    assert rc == 0, out
    assert out.count("SUCCESS") == len(RULE_TESTS), out


def test_every_alert_has_a_firing_and_a_quiet_case():
    alerts = {r["alert"] for f in RULES for g in yaml.safe_load(f.read_text())["groups"]
              for r in g["rules"] if "alert" in r}
    assert len(alerts) >= 6
    fires, quiet = set(), set()
    for f in RULE_TESTS:
        for group in yaml.safe_load(f.read_text()).get("tests", []):
            for case in group.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert alerts - fires == set(), f"alerts never shown to fire: {alerts - fires}"
    assert alerts - quiet == set(), f"alerts never shown to stay quiet: {alerts - quiet}"


def test_dashboard_queries_are_valid_promql(tmp_path):
    promtool = _promtool()  # in the test body: under CI a missing promtool is a FAILED test
    """Every dashboard expr, with $model substituted by .*, parses (as a recording rule)."""
    dash = json.loads(DASHBOARD.read_text())
    rules = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            expr = t["expr"].replace("${model}", ".*").replace("$model", ".*")
            assert "$" not in expr.replace('"$1"', ""), f"unsubstituted variable in {expr!r}"
            rules.append({"record": f"dashboard_panel_{p['id']}_{t['refId']}", "expr": expr})
    path = tmp_path / "dashboard_exprs.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    rc, out = _run([promtool, "check", "rules", str(path)], cwd=tmp_path)
    assert rc == 0, out
