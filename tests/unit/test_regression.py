"""Regression per version (builder/repository/regression.py): validate compares a version with the one
before it on its stored reference inputs; --max-regression gates it (exit 1), a bad limit is exit 2."""

from __future__ import annotations

import json

import pytest

from builder.core.errors import UserInputError
from builder.repository.regression import RegressionCheck, _gate, parse_limits
from tests.conftest import EXAMPLES, run_cli


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory):
    """digits twice: version 1 TorchScript, version 2 ONNX (no benchmark) - real, slightly different outputs. Target
    python: its model.py serves versions of different formats under one config (a standard folder's versions share
    one backend, and validate fails a version the config cannot serve: tests/unit/test_interface_change.py)."""
    from builder.pipeline import build

    repo = tmp_path_factory.mktemp("regression") / "model_repository"
    for variant in ("torchscript", "onnx"):
        build(EXAMPLES / "digits/spec.yaml", repo, variants=[variant], target="python", benchmark_seconds=0,
              progress=lambda m: None)
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
    # not a failure (a first version cannot regress), but a CI gate that compared nothing says so
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (f"regression: version 1: not compared (no version before 1 in {two_versions}: the --max-regression "
            "limits were not applied)") in proc.stdout
    proc = run_cli("validate", str(two_versions), "--version", "1", "--json", "--max-regression", "latency=0")
    assert json.loads(proc.stdout)["regression"]["skipped"].startswith("no version before 1 in ")
    proc = run_cli("validate", str(two_versions), "--version", "1")  # no limits asked: nothing to say
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


class _Clock:
    """A fake clock that only the fake runners move: the figures do not depend on this host's speed."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _timed_runners(monkeypatch, clock, seconds_per_call: dict[str, float], slow_format: str, slow_calls: int):
    """open_runner whose runners really run, but take ``seconds_per_call[format]`` on the fake clock, and
    ``slow_calls`` first calls of 0.13 s for ``slow_format`` (a TorchScript module's profiling executor: the
    probe read ~390 ms per round of the three reference cases for ~6 rounds, then ~2 ms)."""
    import builder.model.runtime
    import builder.repository.regression

    real = builder.model.runtime.open_runner

    def open_runner(fmt, path, *args, **kwargs):
        run, calls = real(fmt, path, *args, **kwargs), [0]

        def timed(inputs):
            calls[0] += 1
            clock.now += 0.13 if fmt == slow_format and calls[0] <= slow_calls else seconds_per_call[fmt]
            return run(inputs)
        return timed
    monkeypatch.setattr(builder.repository.regression, "open_runner", open_runner)


# version 1 is TorchScript, version 2 ONNX; 18 slow calls = 6 rounds over the 3 stored cases
@pytest.mark.parametrize("slow_format, torchscript_s, onnx_s, fails", [
    ("torchscript", 0.001, 0.0015, True),    # the previous version's slow start no longer waves a slower new one through
    ("onnx", 0.001, 0.001, False),           # the new version's slow start no longer fails it against an equal one
])
def test_latency_leaves_out_a_slow_start(two_versions, monkeypatch, slow_format, torchscript_s, onnx_s, fails):
    from builder.repository.regression import compare_with_previous

    clock = _Clock()
    _timed_runners(monkeypatch, clock, {"torchscript": torchscript_s, "onnx": onnx_s}, slow_format, 18)
    check = compare_with_previous(two_versions, 2, {"latency": 20.0}, seconds=1.0, clock=clock)
    assert check.latency_ms["previous"] == pytest.approx(torchscript_s * 1e3)
    assert check.latency_ms["new"] == pytest.approx(onnx_s * 1e3)
    assert bool(check.failures) is fails
    if fails:
        assert check.failures == ["latency p50 1.500 ms vs 1.000 ms in version 1: +50.0 % > latency=20 % on this host"]


def test_both_versions_run_on_the_same_thread_count(two_versions, monkeypatch):
    """The regression check times ONNX on 1 intra-op thread; the TorchScript version ran on torch's
    whole pool, so a TorchScript -> ONNX change read as a regression that was only the thread count."""
    import torch

    import builder.model.runtime
    from builder.repository.regression import compare_with_previous

    seen, real = [], builder.model.runtime.torch_runner

    def recording_runner(module, outputs, inputs=None, threads=None, device="cpu"):
        run = real(module, outputs, inputs, threads, device)

        def recorded(feed):
            result = run(feed)
            seen.append(threads)
            return result
        return recorded
    monkeypatch.setattr(builder.model.runtime, "torch_runner", recording_runner)
    before = torch.get_num_threads()
    compare_with_previous(two_versions, 2, seconds=0.2)
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == before


def test_torch_runner_runs_on_its_threads_and_restores_the_pool():
    import torch

    from builder.model.runtime import torch_runner

    class ThreadCount(torch.nn.Module):
        def forward(self, x):
            return x * 0 + torch.get_num_threads()

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        import numpy as np
        feed = {"x": np.zeros((1, 2), np.float32)}
        assert torch_runner(ThreadCount(), ["y"], ["x"], threads=1)(feed)["y"][0, 0] == 1
        assert torch.get_num_threads() == 3
        assert torch_runner(ThreadCount(), ["y"], ["x"])(feed)["y"][0, 0] == 3
    finally:
        torch.set_num_threads(before)
