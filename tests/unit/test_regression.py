"""Regression per version (builder/repository/regression.py): validate compares a version with the one
before it on its stored reference inputs; --max-regression gates it (exit 1), a bad limit is exit 2."""

from __future__ import annotations

import json

import pytest

from builder.errors import UserInputError
from builder.repository.regression import RegressionCheck, _gate, parse_limits
from tests.conftest import EXAMPLES, run_cli


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory):
    """digits twice: version 1 TorchScript, version 2 ONNX (no benchmark) - real, slightly different outputs."""
    from builder.pipeline import build

    repo = tmp_path_factory.mktemp("regression") / "model_repository"
    for variant in ("torchscript", "onnx"):
        build(EXAMPLES / "digits/spec.yaml", repo, variants=[variant], benchmark_seconds=0, progress=lambda m: None)
    return repo / "digits_cnn"


def test_validate_shows_the_difference_with_the_previous_version(two_versions):
    proc = run_cli("validate", str(two_versions))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "regression: version 2 vs version 1:" in proc.stdout
    assert "  outputs  logits: rel L2 " in proc.stdout
    assert "  accuracy top1: 99.33 -> 99.33 (+0.00 pp)" in proc.stdout
    assert "  latency  p50 " in proc.stdout and "this host)" in proc.stdout
    proc = run_cli("validate", str(two_versions), "--json")
    regression = json.loads(proc.stdout)["regression"]
    assert regression["version"] == 2 and regression["previous"] == 1
    assert regression["latency_ms"]["new"] > 0 and regression["outputs"]["logits"]["rel_l2"] < 1e-4


def test_max_regression_gates_with_exit_codes(two_versions):
    proc = run_cli("validate", str(two_versions), "--max-regression", "rel_l2=1e-12")
    assert proc.returncode == 1
    assert "- REGRESSION outputs logits: rel L2 " in proc.stdout and "from version 1 > rel_l2=1e-12" in proc.stdout
    proc = run_cli("validate", str(two_versions), "--max-regression", "accuracy=0,rel_l2=1e-3,latency=100000")
    assert proc.returncode == 0, proc.stdout
    proc = run_cli("validate", str(two_versions), "--max-regression", "speed=3")
    assert proc.returncode == 2 and "--max-regression: 'speed=3' is not KEY=NUMBER" in proc.stderr


def test_the_first_version_has_nothing_to_compare(two_versions):
    proc = run_cli("validate", str(two_versions), "--version", "1", "--max-regression", "latency=0")
    assert proc.returncode == 0 and "regression:" not in proc.stdout


def test_limits_and_gate_lines():
    assert parse_limits("latency=20%, accuracy=0.5,rel_l2=1e-3") == {"latency": 20.0, "accuracy": 0.5, "rel_l2": 1e-3}
    with pytest.raises(UserInputError, match="not KEY=NUMBER"):
        parse_limits("latency=-1")
    for off_switch in ("rel_l2=nan", "latency=inf", "accuracy=-inf"):  # nan/inf would pass every comparison
        with pytest.raises(UserInputError, match="finite"):
            parse_limits(off_switch)
    check = RegressionCheck(3, 2, outputs={"y": {"rel_l2": 0.0}}, latency_ms={"previous": 1.0, "new": 1.5,
                                                                               "change_pct": 50.0},
                            accuracy={"metric": "top1", "previous": 98.0, "new": 96.5, "change_pp": -1.5})
    _gate(check, {"latency": 20, "accuracy": 1.0, "rel_l2": 1e-3})
    assert check.failures == [
        "accuracy top1: -1.50 pp vs version 2 (lost more than accuracy=1 pp)",
        "latency p50 1.500 ms vs 1.000 ms in version 2: +50.0 % > latency=20 % on this host"]
