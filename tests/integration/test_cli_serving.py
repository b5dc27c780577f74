"""`triton-builder check --json` against the real embedded server: one JSON object for CI pipelines."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.integration


def test_check_json(served, built_repository):
    proc = run_cli("check", "digits_cnn", "--repository", str(built_repository), "--url", served.http_url,
                   "--grpc-url", served.grpc_url, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["model"] == "digits_cnn" and report["version"] == 1
    assert set(report["metrics"]) == {"http", "grpc"} and report["failures"] == []
    assert report["lines"][0] == f"digits_cnn version 1: OK ({report['cases']} cases per protocol)"
