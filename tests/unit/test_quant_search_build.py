"""The quantisation search inside a real digits build (stage quantize), with injected verdicts where
the outcome depends on the host's ISA: the default recipe's failure on an AVX2-only CPU is simulated,
never assumed. No measurement (--benchmark-seconds 0): speed is not what these tests decide."""

from __future__ import annotations

import json

import pytest

from builder import quant_search
from builder.errors import UserInputError
from builder.pipeline import build
from builder.spec import load_spec
from builder.stages import quantize
from tests.conftest import edit_spec

VARIANTS = ["onnx", "onnx_int8_static"]


@pytest.fixture
def avx2(monkeypatch):
    """The AVX2-only outcome: the default recipe (S8S8, no reduce_range) saturates and fails with the
    figures seen on the EPYC host; every other recipe is judged by its real numbers."""
    last = {}
    real_quantize, real_evaluate = quantize._quantize_static, quantize._evaluate_model

    def quantize_static(prepared, target, cand, *args, **kwargs):
        last["candidate"] = cand
        return real_quantize(prepared, target, cand, *args, **kwargs)

    def evaluate(ctx, run, fp32):
        cand = last["candidate"]
        if cand.types == "S8S8" and not cand.reduce_range and not cand.exclude:
            return quant_search.Result(False, 0.15, 0.0, None, ["logits: rel L2 1.5e-01 > 0.1"])
        return real_evaluate(ctx, run, fp32)

    monkeypatch.setattr(quantize, "_quantize_static", quantize_static)
    monkeypatch.setattr(quantize, "_evaluate_model", evaluate)


def _build(spec, tmp_path, quiet):
    return build(spec, tmp_path / "repo", variants=VARIANTS, benchmark_seconds=0, progress=quiet)


def test_avx2_default_recipe_fails_and_the_search_finds_a_passing_static_int8(avx2, digits_copy, tmp_path, quiet):
    result = _build(digits_copy / "spec.yaml", tmp_path, quiet)
    static = result.context.variant("onnx_int8_static")
    table = static.search
    assert table[0]["changed"] == "default recipe" and table[0]["verdict"] == "FAIL: logits: rel L2 1.5e-01 > 0.1"
    assert len(table) == len(quant_search.default_candidates())  # auto: the default failed, so all were tried
    assert static.verified is True and static.eligible, static.rejected
    winner = next(r for r in table if r["candidate"] in static.notes[1])
    assert winner["verdict"] == "pass" and winner["changed"] != "default recipe"
    assert any(n.startswith("quantisation search (this host):\n#   candidate") for n in static.notes)
    published = json.loads(next((tmp_path / "repo").rglob("build_report.json")).read_text())
    row = next(v for v in published["variants"] if v["variant"] == "onnx_int8_static")
    assert any("quantisation search" in n for n in row["notes"])
    md = next((tmp_path / "repo").rglob("build_report.md")).read_text()
    assert "## Quantisation search: onnx_int8_static" in md and "| 1 | QDQ, S8S8, per-channel, minmax |" in md


def test_default_recipe_passing_stops_the_auto_search_after_one_candidate(digits_copy, tmp_path, quiet, monkeypatch):
    monkeypatch.setattr(quantize, "_evaluate_model",  # the VNNI outcome, injected
                        lambda ctx, run, fp32: quant_search.Result(True, 0.02, 0.0, 2.57))
    static = _build(digits_copy / "spec.yaml", tmp_path, quiet).context.variant("onnx_int8_static")
    assert [r["verdict"] for r in static.search] == ["pass"] + [quant_search.NOT_NEEDED] * 11
    assert static.passes[-1] == ("quantize_static(QDQ, per_channel=True, activations QInt8, weights QInt8, "
                                 "calibration minmax)")


@pytest.mark.parametrize("remeasured, searched", [([0.5, 0.55, 0.52], True), ([1.02], False)])
def test_auto_searches_a_passing_default_only_when_its_slowdown_is_stable(digits_copy, tmp_path, quiet, monkeypatch,
                                                                          remeasured, searched):
    # injected: the default recipe passes but measures 0.5x FP32 once; the side-by-side re-measurements
    # either confirm it (every round below 0.87x: search) or show the first figure was noise (stop)
    monkeypatch.setattr(quantize, "_evaluate_model", lambda ctx, run, fp32: quant_search.Result(True, 0.02, 0.0, 0.5))
    queue = list(remeasured)
    monkeypatch.setattr(quantize, "_remeasurer", lambda *args: lambda cands: [queue.pop(0) if queue else 0.5] * len(cands))
    static = _build(digits_copy / "spec.yaml", tmp_path, quiet).context.variant("onnx_int8_static")
    verdicts = [r["verdict"] for r in static.search]
    assert static.search[0]["remeasured"] is True
    assert queue == []  # every injected re-measurement was asked for: 3 rounds, resp. 1 that ended it
    if searched:
        assert verdicts == ["pass"] * len(quant_search.default_candidates())
    else:
        assert static.search[0]["speed_vs_fp32"] == 1.02
        assert verdicts == ["pass"] + [quant_search.NOT_NEEDED] * 11
        assert static.passes[-1] == ("quantize_static(QDQ, per_channel=True, activations QInt8, weights QInt8, "
                                     "calibration minmax)")


def test_per_node_fallback_keeps_the_most_sensitive_node_in_fp32(digits_copy, tmp_path, quiet, monkeypatch):
    last = {}
    real_quantize = quantize._quantize_static

    def quantize_static(prepared, target, cand, samples, batch, large, only=None):
        last["cand"], last["only"] = cand, only
        return real_quantize(prepared, target, cand, samples, batch, large, only)

    seen = []  # nodes in the order their sensitivity was asked for (graph order)

    def evaluate(ctx, run, fp32):  # injected: the 2nd node is the sensitive one; keeping it FP32 passes
        only, cand = last["only"], last["cand"]
        if only is not None:
            seen.append(only[0])
            return quant_search.Result(False, 0.3 if len(seen) == 2 else 0.01, failures=["x"])
        ok = len(seen) > 1 and seen[1] in cand.exclude
        return quant_search.Result(ok, 0.05 if ok else 0.2, failures=[] if ok else ["logits: rel L2 0.2 > 0.1"])

    monkeypatch.setattr(quantize, "_quantize_static", quantize_static)
    monkeypatch.setattr(quantize, "_evaluate_model", evaluate)
    spec = edit_spec(digits_copy, quantization={"search": True, "search_seconds": 600})
    static = _build(spec, tmp_path, quiet).context.variant("onnx_int8_static")
    fallback = [r for r in static.search if r["stage"] == "fallback"]
    assert len(seen) >= 3 and len(fallback) == 1  # the most sensitive node first: one step is enough
    assert fallback[0]["changed"].endswith(f"FP32 kept for {seen[1]}") and fallback[0]["verdict"] == "pass"
    assert static.passes[-1].endswith(f"FP32 nodes {seen[1]})")
    assert static.verified is True


def test_nothing_passes_the_report_shows_the_search_and_why(digits_copy, tmp_path, quiet):
    # no INT8 recipe reaches rel L2 1e-7 on any CPU: every candidate fails for real
    spec = edit_spec(digits_copy, verify={"tolerances": {"int8": {"rel_l2": 1e-7}}},
                     quantization={"search": True, "search_seconds": 3})
    result = _build(spec, tmp_path, quiet)
    static = result.context.variant("onnx_int8_static")
    assert static.verified is False and static.rejected.startswith("failed verification:")
    assert all(r["verdict"].startswith(("FAIL", "not tried")) for r in static.search)
    summary = next(n for n in static.notes if n.startswith("search:"))
    assert summary.startswith("search: none of ") and "keep FP32, or relax verify.tolerance" in summary
    assert result.context.selected.name == "onnx"


def test_search_off_builds_the_default_recipe_without_a_table(digits_copy, tmp_path, quiet):
    spec = edit_spec(digits_copy, quantization={"search": False, "calibration_method": "entropy"})
    static = _build(spec, tmp_path, quiet).context.variant("onnx_int8_static")
    assert static.search is None
    assert static.passes[-1] == ("quantize_static(QDQ, per_channel=True, activations QInt8, weights QInt8, "
                                 "calibration entropy)")


def test_search_spec_keys_are_validated(digits_copy):
    spec = edit_spec(digits_copy, quantization={"search": "always"})
    with pytest.raises(UserInputError, match=r"field 'quantization.search': 'always' is not supported; use auto "
                                             r"\(search only when the default recipe fails verification or is stably "
                                             r"slower than FP32\), true \(always search\) or false \(default recipe "
                                             r"only\)"):
        load_spec(spec)
    spec = edit_spec(digits_copy, quantization={"search_seconds": 0})
    with pytest.raises(UserInputError, match=r"field 'quantization.search_seconds': must be a finite number of seconds > 0 "
                                             r"\(the search's time budget, e.g. 120\), got 0"):
        load_spec(spec)
    spec = edit_spec(digits_copy, quantization={"search": True, "search_seconds": 30.5})
    q = load_spec(spec).quantization
    assert (q.search, q.search_seconds) == ("on", 30.5)
    assert load_spec(edit_spec(digits_copy, quantization=None)).quantization.search == "auto"


def test_dynamic_int8_runs_its_own_search_where_it_applies(digits_copy, tmp_path, quiet, monkeypatch):
    # injected: the default dynamic recipe fails, reduce_range passes (a verdict, not this host's figures)
    last = {}
    real = quantize._quantize_dynamic

    def quantize_dynamic(prepared, target, cand, large, only=None):
        last["cand"] = cand
        return real(prepared, target, cand, large, only)

    def evaluate(ctx, run, fp32):
        ok = last["cand"].reduce_range
        return quant_search.Result(ok, 0.02 if ok else 0.2, failures=[] if ok else ["logits: rel L2 0.2 > 0.1"])

    monkeypatch.setattr(quantize, "_quantize_dynamic", quantize_dynamic)
    monkeypatch.setattr(quantize, "_evaluate_model", evaluate)
    result = build(digits_copy / "spec.yaml", tmp_path / "repo", variants=["onnx", "onnx_int8_dynamic"],
                   benchmark_seconds=0, progress=quiet)
    dynamic = result.context.variant("onnx_int8_dynamic")
    assert [r["candidate"] for r in dynamic.search] == [c.label() for c in quant_search.dynamic_candidates()]
    assert dynamic.search[0]["verdict"] == "FAIL: logits: rel L2 0.2 > 0.1"
    assert dynamic.passes[-1] == "quantize_dynamic(op_types MatMul, Gemm, weights QInt8, reduce_range=True)"
    assert dynamic.verified is True
