"""Objective tradeoff: J = alpha*accuracy - beta*latency - gamma*memory on hand-made measurements."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.core.errors import UserInputError
from builder.report.build_report import report_files
from builder.spec.model import load_spec
from builder.stages import select
from builder.stages.base import BuildContext, BuildOptions, Status, Variant
from tests.conftest import EXAMPLES, edit_spec


def _variant(name, p50, top1, memory, precision="fp32"):
    v = Variant(name, "onnx", precision, Path(f"/nonexistent/{name}.onnx"), verified=True)
    v.accuracy = {"metric": "top1", "reference": 98.0, "variant": top1, "drop": 98.0 - top1}
    v.benchmark = {"latency_ms_b1": {"p50": p50}, "best_throughput": 1000 / p50, "best_batch": 1,
                   "throughput_by_batch": {1: 1000 / p50}, "peak_memory_mb": memory}
    return v


def _context(weights) -> BuildContext:
    spec = load_spec(EXAMPLES / "digits" / "spec.yaml")
    spec.objective, spec.tradeoff = "tradeoff", weights
    ctx = BuildContext(spec=spec, options=BuildOptions(repository=Path("/nonexistent")), workdir=Path("/nonexistent"))
    ctx.variants = [_variant("onnx", 0.40, 98.0, 20.0), _variant("onnx_int8_static", 0.10, 97.5, 8.0, "int8")]
    return ctx


def test_latency_weight_picks_the_faster_int8():
    ctx = _context({"alpha": 1.0, "beta": 10.0, "gamma": 0.0})
    assert select.run(ctx).status is Status.OK
    assert ctx.selected.name == "onnx_int8_static"  # 97.5 - 1.0 = 96.5 > 98 - 4 = 94
    assert ctx.selected.selection_reason == ("selected: highest J (J 96.500 = 1*97.50 accuracy - 10*0.100 ms - "
                                             "0*8.0 MB)")
    assert ctx.variant("onnx").selection_reason.startswith("rejected: J 94.000 < 96.500 of onnx_int8_static")


def test_accuracy_weight_picks_the_more_accurate_fp32():
    ctx = _context({"alpha": 10.0, "beta": 1.0, "gamma": 0.0})
    select.run(ctx)
    assert ctx.selected.name == "onnx"  # 980 - 0.4 > 975 - 0.1
    assert ctx.variant("onnx").benchmark["tradeoff"]["J"] == pytest.approx(979.6)


def test_memory_weight_counts():
    ctx = _context({"alpha": 1.0, "beta": 0.0, "gamma": 1.0})
    select.run(ctx)
    assert ctx.selected.name == "onnx_int8_static"  # 97.5 - 8 > 98 - 20


def test_the_report_shows_j_per_variant():
    ctx = _context({"alpha": 1.0, "beta": 10.0, "gamma": 0.0})
    select.run(ctx)
    md = report_files(ctx)["build_report.md"].decode()
    assert "## Objective J = 1*accuracy - 10*p50 ms - 0*memory MB" in md
    assert "| onnx_int8_static | 96.500 | 97.50 | 0.100 | 8.0 |" in md and "| onnx | 94.000 | 98.00 | 0.400 | 20.0 |" in md


def test_without_labels_accuracy_is_the_lowest_cosine():
    v = _variant("onnx", 0.5, 0.0, 1.0)
    v.accuracy = {"cosine_vs_reference": {"logits": 0.99, "aux": 0.98}}
    assert select.tradeoff(v, {"alpha": 1.0, "beta": 0.0, "gamma": 0.0})["accuracy"] == pytest.approx(98.0)


def test_objective_spec_forms_are_validated(digits_copy):
    spec = load_spec(edit_spec(digits_copy, objective={"alpha": 2, "beta": 0.5}))
    assert spec.objective == "tradeoff" and spec.tradeoff == {"alpha": 2.0, "beta": 0.5, "gamma": 0.0}
    assert load_spec(edit_spec(digits_copy, objective="tradeoff")).tradeoff == {"alpha": 1.0, "beta": 1.0,
                                                                                "gamma": 0.0}
    with pytest.raises(UserInputError, match=r"field 'objective.beta': must be a finite number >= 0 \(J = alpha\*accuracy "
                                             r"- beta\*latency_ms - gamma\*memory_mb\), got -1"):
        load_spec(edit_spec(digits_copy, objective={"beta": -1}))
    with pytest.raises(UserInputError, match=r"field 'objective': unknown key\(s\) 'delta'; known keys: alpha, beta, "
                                             r"gamma"):
        load_spec(edit_spec(digits_copy, objective={"delta": 1}))
    with pytest.raises(UserInputError, match=r"field 'objective': 'speed' is not supported; use one of: throughput, "
                                             r"latency, tradeoff"):
        load_spec(edit_spec(digits_copy, objective="speed"))
