"""monitoring/alertmanager/alertmanager.yml checked offline with amtool, its rendering for the local runner,
and Prometheus' `alerting:` block (shipped and as LocalPrometheus writes it).

amtool comes from Debian's `prometheus-alertmanager` package (scripts/install-system-deps.sh): without it
the amtool checks are skipped locally, and FAIL under CI.
"""

from __future__ import annotations

import shutil

import pytest
import yaml

from builder.core.errors import ServerError, UserInputError
from builder.monitoring import alertmanager
from builder.monitoring.prometheus import render_config as prometheus_config
from tests.conftest import ROOT, in_ci

SHIPPED = ROOT / "monitoring" / "alertmanager" / "alertmanager.yml"
ALERTS = ROOT / "monitoring" / "prometheus" / "rules" / "alerts.yml"


def _amtool() -> None:
    if shutil.which("amtool") is None:
        message = "amtool is not installed (Debian package `prometheus-alertmanager`; run scripts/install-system-deps.sh)"
        if in_ci():
            pytest.fail(message + " -- CI is set, so this is a failure")
        pytest.skip(message)


def test_shipped_config_passes_amtool():
    _amtool()
    assert alertmanager.check_config(SHIPPED) == []


def test_amtool_complaint_names_the_file(tmp_path):
    _amtool()
    bad = tmp_path / "alertmanager.yml"
    bad.write_text("route:\n  receiver: webhook\nreceivers:\n  - name: webhook\n    webhook_configs:\n"
                   "      - url_file: /run/secrets/url\n")
    problems = alertmanager.check_config(bad)
    assert len(problems) == 1 and problems[0].startswith(f"{bad}: ")
    assert "field url_file not found" in problems[0]


def test_shipped_route_sends_every_alert_to_the_webhook():
    config = yaml.safe_load(SHIPPED.read_text())
    receivers = {r["name"]: r for r in config["receivers"]}
    route = config["route"]
    assert route["receiver"] in receivers
    assert all(child["receiver"] in receivers for child in route.get("routes", []))
    assert [w["send_resolved"] for w in receivers[route["receiver"]]["webhook_configs"]] == [True]
    # every label the alert rules group by exists on the alerts (model/version or absent)
    severities = {r["labels"]["severity"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    assert severities <= {"critical", "warning"}


def test_render_replaces_the_webhook_url_and_timings():
    config = alertmanager.render_config(SHIPPED, "http://127.0.0.1:5001/hook", group_wait="1s",
                                        group_interval="2s", repeat_interval="1m")
    hooks = [w["url"] for r in config["receivers"] for w in r["webhook_configs"]]
    assert hooks == ["http://127.0.0.1:5001/hook"]
    assert (config["route"]["group_wait"], config["route"]["group_interval"], config["route"]["repeat_interval"]) \
        == ("1s", "2s", "1m")
    child = config["route"]["routes"][0]
    assert child["group_wait"] == "1s" and child["repeat_interval"] == "1m" and "group_interval" not in child
    kept = alertmanager.render_config(SHIPPED)
    assert kept == yaml.safe_load(SHIPPED.read_text())


def test_render_errors_name_the_fix(tmp_path):
    with pytest.raises(UserInputError, match=r"webhook_url 'ftp://x': must be an http:// or https:// URL"):
        alertmanager.render_config(SHIPPED, "ftp://x")
    no_hook = tmp_path / "am.yml"
    no_hook.write_text("route:\n  receiver: null\nreceivers:\n  - name: 'null'\n")
    with pytest.raises(UserInputError, match=r"am\.yml has no receiver with webhook_configs .* add one"):
        alertmanager.render_config(no_hook, "http://127.0.0.1:1/")
    with pytest.raises(UserInputError, match=r"cannot read the Alertmanager config .*missing\.yml"):
        alertmanager.render_config(tmp_path / "missing.yml")


def test_missing_binary_is_a_clear_error(tmp_path):
    with pytest.raises(ServerError, match=r"alertmanager binary .*not found.*install-system-deps\.sh"):
        alertmanager.LocalAlertmanager(binary=str(tmp_path / "none")).start()


def test_prometheus_alerting_block():
    shipped = yaml.safe_load((ROOT / "monitoring" / "prometheus" / "prometheus.yml").read_text())
    assert shipped["alerting"]["alertmanagers"] == [
        {"api_version": "v2", "static_configs": [{"targets": ["127.0.0.1:9093"]}]}]
    local = prometheus_config(scrape_targets={"triton": "127.0.0.1:1"}, rule_files=[])
    assert "alerting" not in local  # no Alertmanager named: nothing is sent to a default port
    local = prometheus_config(scrape_targets={"triton": "127.0.0.1:1"}, rule_files=[],
                              alertmanager_url="http://127.0.0.1:9999")
    assert local["alerting"] == {"alertmanagers": [
        {"static_configs": [{"targets": ["127.0.0.1:9999"]}], "scheme": "http", "api_version": "v2"}]}


def test_missing_binaries_say_what_was_looked_for_and_how_to_install(monkeypatch, tmp_path):
    from builder.core.errors import ServerError
    from builder.monitoring.alertmanager import find_alertmanager
    from builder.monitoring.prometheus import find_prometheus

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("PROMETHEUS_BINARY", raising=False)
    monkeypatch.delenv("ALERTMANAGER_BINARY", raising=False)
    with pytest.raises(ServerError, match=r"^prometheus is not installed \(no `prometheus` on PATH\); run "
                                          r"scripts/install-system-deps.sh"):
        find_prometheus()
    with pytest.raises(ServerError, match=r"^alertmanager is not installed \(no `prometheus-alertmanager` or "
                                          r"`alertmanager` on PATH\); run scripts/install-system-deps.sh"):
        find_alertmanager()
    monkeypatch.setenv("PROMETHEUS_BINARY", "nope")
    with pytest.raises(ServerError, match=r"^prometheus binary nope not found or not executable; run "):
        find_prometheus()
