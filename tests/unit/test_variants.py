"""Optimised variants (onnx_opt, INT8), measured and selected by numbers.

The digits CNN is built once per module with every default variant and a small measuring cap; the
other tests edit a copy of the spec. Selection logic is also tested on hand-made measurements,
which makes it deterministic on a busy machine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from builder.optimise import quant_search
from builder.core.errors import UserInputError, VerificationError
from builder.model.measure import cpu_cores, human
from builder.model.objective import prefer_accurate
from builder.pipeline import build
from builder.spec.model import load_spec
from builder.stages import select
from builder.stages.base import Status
from tests.conftest import EXAMPLES, edit_spec

CAP = 0.4  # seconds of measuring per variant: enough to rank, small enough to keep the tests fast
DEFAULTS = ["onnx", "torchscript", "openvino", "openvino_int8", "onnx_opt", "onnx_int8_static", "onnx_int8_dynamic",
            "torchscript_int8_dynamic"]


@pytest.fixture(scope="module")
def digits_build(tmp_path_factory):
    repo = tmp_path_factory.mktemp("variants") / "repo"
    # named, so that the dynamic INT8 variants are made too: unnamed, a CNN skips them (its dense layers are 0.4 %
    # of the multiply-adds; test_a_default_build_of_a_cnn_skips_dynamic_int8 below)
    return build(EXAMPLES / "digits" / "spec.yaml", repo, variants=DEFAULTS, benchmark_seconds=CAP,
                 progress=lambda m: None)


# ------------------------------------------------------------------------------------------------
# the full default build


@pytest.mark.slow
def test_default_variants_on_cpu_targets(digits_build):
    ctx = digits_build.context
    assert ctx.requested_variants == DEFAULTS
    assert [v.name for v in ctx.variants] == ["torchscript", "onnx", "onnx_opt", "onnx_int8_static",
                                              "onnx_int8_dynamic", "torchscript_int8_dynamic", "openvino",
                                              "openvino_int8"]
    assert ctx.base_only == {}


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["onnx_int8_dynamic", "torchscript_int8_dynamic"])
def test_a_default_build_of_a_cnn_skips_dynamic_int8(digits_build, variant, tmp_path):
    import copy

    import torch

    from builder.stages import quantize

    ctx = copy.deepcopy(digits_build.context)
    ctx.options.variants = None  # the default variants: nothing named
    onnx_variant = ctx.variant("onnx")  # the build's work folder is gone: the same export again
    onnx_variant.path = tmp_path / "model.onnx"
    torch.onnx.export(ctx.model.eval(), torch.zeros(1, 1, 8, 8), str(onnx_variant.path), dynamo=False,
                      input_names=["image"], dynamic_axes={"image": {0: "batch"}})
    with pytest.raises(quantize.NotApplicable, match=r"hold 0\.4% of the multiply-adds, the convolutions 99\.6%: "
                                                     r"dynamic INT8 quantizes only the former"):
        quantize.MAKERS[variant](ctx)


@pytest.mark.slow
def test_static_int8_is_built_with_its_recipe_and_judged_by_the_int8_tolerance(digits_build):
    # Whether INT8 verifies depends on the CPU (without VNNI the u8 x s8 dot product can saturate):
    # what must hold on every host is that the gate's verdict follows the recorded numbers.
    static = digits_build.context.variant("onnx_int8_static")
    assert static.precision == "int8"
    assert static.verification["tolerance"]["rel_l2"] == 0.1
    assert static.accuracy["metric"] == "top1"
    assert any("quant_pre_process" in p for p in static.passes)
    # auto: the default recipe (the spec's minmax calibration) unless it fails verification or is stably slower
    # than FP32 here (quant_search.stably_slower); then the search's winner, named in full in the passes
    table = static.search
    if table[0]["verdict"] == "pass" and all(r["verdict"] == quant_search.NOT_NEEDED for r in table[1:]):
        assert static.passes[-1] == ("quantize_static(QDQ, per_channel=True, activations QInt8, weights QInt8, "
                                     "calibration minmax)"), static.passes
    else:
        chosen = next(n for n in static.notes if n.startswith("search: "))
        assert re.fullmatch(r"quantize_static\((QDQ|QOperator), per_channel=(True|False), activations Q(U?)Int8, "
                            r"weights Q(U?)Int8, calibration (minmax|entropy|percentile).*\)", static.passes[-1])
        assert chosen.startswith("search: none") or " chosen of " in chosen, chosen
    assert any("calibrated on data.calibration (calib.npz), 128 samples" in n for n in static.notes)
    rel_l2 = static.verification["metrics"]["logits"]["rel_l2"]
    within = rel_l2 <= 0.1 and static.accuracy["drop"] <= 1.0
    assert static.verified is within, (rel_l2, static.accuracy, static.rejected)
    if not within:
        assert static.rejected.startswith("failed verification:") and static.benchmark is None


@pytest.mark.slow(reason="builds digits with its variants")
def test_static_int8_verifies_and_can_be_published_when_within_its_tolerance(digits_copy, tmp_path, quiet):
    # a tolerance no INT8 error on any CPU reaches: the variant must pass, be measured and be publishable
    spec = edit_spec(digits_copy, verify={"tolerances": {"int8": {"rel_l2": 10.0}}, "max_accuracy_drop": 100.0})
    result = build(spec, tmp_path / "repo", variants=["onnx", "onnx_int8_static"], benchmark_seconds=CAP,
                   publish_variants=True, progress=quiet)
    static = result.context.variant("onnx_int8_static")
    assert static.verified is True and static.eligible, static.rejected
    assert static.verification["tolerance"]["rel_l2"] == 10.0
    assert static.accuracy["metric"] == "top1" and static.accuracy["drop"] <= 100.0
    assert static.benchmark["best_throughput"] > 0
    names = sorted(p["name"] for p in result.published)
    assert names == ["digits_cnn", "digits_cnn__" + ("onnx" if static.selected else "onnx_int8_static")]


@pytest.mark.slow
def test_onnx_opt_records_its_passes(digits_build):
    opt = digits_build.context.variant("onnx_opt")
    assert opt.verified is True
    assert opt.passes[0].startswith("onnxoptimizer:") and "fuse_bn_into_conv" in opt.passes[0]
    assert opt.passes[1] == "onnxslim"
    assert "ORT_ENABLE_EXTENDED" in opt.passes[-1]
    assert any("onnxruntime-only ops (FusedConv" in n for n in opt.notes)


@pytest.mark.slow
def test_every_verified_variant_is_measured_and_no_rejected_one_is(digits_build):
    variants = digits_build.context.variants
    assert {v.name for v in variants if v.verified} >= {"onnx", "torchscript", "onnx_opt"}  # FP32 on any CPU
    for v in variants:
        if not v.verified:
            assert v.benchmark is None and v.rejected.startswith("failed verification:"), v.name
            continue
        bench = v.benchmark
        assert set(bench["latency_ms_b1"]) >= {"p50", "p95", "p99"}
        assert bench["latency_ms_b1"]["p50"] <= bench["latency_ms_b1"]["p95"] <= bench["latency_ms_b1"]["p99"]
        # a variant far behind the leader at batch 1 and 64 is not measured between (benchmark.far_behind)
        skipped = (bench.get("not_measured") or {}).get("batches", [])
        assert sorted(bench["throughput_by_batch"]) == ([1, 64] if skipped else [1, 2, 4, 8, 16, 32, 64])
        assert skipped in ([], [2, 4, 8, 16, 32]) and (not skipped or v is not digits_build.context.selected)
        # after a close call the best comes from the confirmation round's batch sizes alone (one round)
        ranked = (bench.get("confirmed") or {}).get("batches") or list(bench["throughput_by_batch"])
        assert bench["best_throughput"] == max(bench["throughput_by_batch"][b] for b in ranked)
        assert bench["throughput_by_batch"][bench["best_batch"]] == bench["best_throughput"]
        assert bench["threads"] == cpu_cores()
        # RSS growth while loading and running, in MB (never negative; a bytes count would be huge)
        assert isinstance(bench["peak_memory_mb"], float) and 0 <= bench["peak_memory_mb"] < 4096
        assert all(n >= 1 for n in bench["windows"].values())
        # the cap bounds the repeats; warm-up and the one window every batch size gets come on top
        assert bench["seconds"] < CAP + 10, bench["seconds"]


@pytest.mark.slow
def test_selection_goes_by_measured_throughput_with_reasons(digits_build):
    ctx = digits_build.context
    winner = ctx.selected
    assert winner.selected and winner.published_as == "digits_cnn"
    choice = _expected_choice(ctx.variants)  # the highest throughput, or the tie rule's pick (host-dependent)
    assert winner.name == choice.name
    if choice.why is None:
        best = max(v.benchmark["best_throughput"] for v in ctx.variants if v.eligible)
        assert winner.benchmark["best_throughput"] == best
        assert winner.selection_reason.startswith("selected: highest throughput")
    else:
        assert winner.selection_reason.startswith(f"selected: {choice.why}")
    for v in ctx.variants:
        if v is winner:
            continue
        assert not v.published_as  # only the winner is published without --publish-variants
        if not v.eligible:
            assert v.selection_reason == "rejected: failed verification", v.selection_reason
            continue
        if v.name == choice.fastest:
            assert v.selection_reason.startswith(f"rejected: only "), v.selection_reason
            continue
        assert re.fullmatch(rf"rejected: [\d.]+x slower than {winner.name} \(measured [\d.]+[kM]? vs "
                            rf"[\d.]+[kM]? inf/s\)", v.selection_reason), v.selection_reason


def _expected_choice(variants):
    """What stage select must publish from these eligible variants' figures (builder/model/objective.py)."""
    eligible = [v for v in variants if v.eligible]
    return prefer_accurate({v.name: v.benchmark["best_throughput"] for v in eligible},
                           {v.name: select.worst_rel_l2(v) for v in eligible})


@pytest.mark.slow
@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_dynamic_int8_is_selected_or_rejected_by_its_measurement(digits_build, factor):
    # the real build's measurements, with dynamic INT8's throughput set to half / double the best
    # other variant's: both outcomes of the same selection, on any CPU
    import copy
    ctx = copy.deepcopy(digits_build.context)
    for v in ctx.variants:
        v.selected, v.selection_reason, v.published_as = False, "", ""
    dynamic = ctx.variant("onnx_int8_dynamic")
    dynamic.verified, dynamic.rejected = True, ""
    dynamic.accuracy = {"metric": "top1", "drop": 0.0}
    dynamic.benchmark = dict(dynamic.benchmark or ctx.variant("onnx").benchmark)
    others = max(v.benchmark["best_throughput"] for v in ctx.variants if v.eligible and v is not dynamic)
    dynamic.benchmark["best_throughput"] = factor * others
    assert select.run(ctx).status is Status.OK
    if factor > 1:
        assert ctx.selected is dynamic
        assert dynamic.selection_reason.startswith(f"selected: highest throughput ({human(factor * others)} inf/s")
        return
    assert ctx.selected is not dynamic
    choice = _expected_choice([v for v in ctx.variants if v is not dynamic])
    assert ctx.selected.name == choice.name
    selected = ctx.selected.benchmark["best_throughput"]
    assert dynamic.selection_reason == (f"rejected: {select._times(selected / (factor * others))} slower than "
                                        f"{ctx.selected.name} (measured {human(factor * others)} vs {human(selected)} inf/s)")


@pytest.mark.slow
def test_report_table_json_and_plot(digits_build):
    rows = digits_build.rows
    from builder.report.build_report import format_table
    table = format_table(rows)
    assert "x onnx" in table.splitlines()[0] and "acc drop" in table.splitlines()[0]
    onnx_row = next(r for r in rows if r["variant"] == "onnx")
    assert onnx_row["x onnx"] == pytest.approx(1.0)
    assert [r["variant"] for r in rows] == [v.name for v in digits_build.context.variants]  # every variant
    for row in rows:
        measured = digits_build.context.variant(row["variant"]).benchmark is not None
        assert (row["p50 ms (b=1)"] is not None and bool(row["throughput"])) is measured, row
        assert row["acc drop"] is not None, row
    folder = Path(digits_build.published[0]["path"])
    png = folder / "build_report.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (folder / "build_report.md").read_text()
    assert "![build_report](build_report.png)" in markdown
    assert "## Measurements" in markdown and "b=64 inf/s" in markdown
    data = json.loads((folder / "build_report.json").read_text())
    assert data["variants"][0]["throughput_by_batch"]
    # where the build's time went, variant by variant (the stages that make several: optimize, quantize, openvino)
    made = data["variant_seconds"]
    assert {"onnx_opt", "onnx_int8_static", "onnx_int8_dynamic", "openvino", "openvino_int8"} <= set(made), made
    assert all(seconds >= 0 for seconds in made.values())
    assert "Variants made (seconds, within their stage): " in markdown and f"onnx_int8_static {made['onnx_int8_static']:.1f}" in markdown


# ------------------------------------------------------------------------------------------------
# builds of edited specs


@pytest.mark.slow(reason="builds digits with its variants")
def test_tolerance_failure_is_never_published_and_lists_numbers(digits_copy, tmp_path, quiet):
    spec = edit_spec(digits_copy, verify={"tolerances": {"int8": {"rel_l2": 1e-6}}})
    result = build(spec, tmp_path / "repo", variants=["onnx", "onnx_int8_static"], benchmark_seconds=CAP,
                   publish_variants=True, progress=quiet)
    static = result.context.variant("onnx_int8_static")
    assert static.verified is False and not static.eligible
    assert re.search(r"- logits: rel L2 [\d.e+-]+ > 1e-06 \(max abs [\d.e+-]+, max rel [\d.e+-]+, rel L2 [\d.e+-]+, "
                     r"cosine [\d.]+\)", static.rejected), static.rejected
    assert static.benchmark is None  # failed variants are not even measured
    assert not static.published_as and not (tmp_path / "repo" / "digits_cnn__onnx_int8_static").exists()
    assert result.context.selected.name == "onnx"
    row = next(r for r in result.rows if r["variant"] == "onnx_int8_static")
    assert row["status"] == "rejected: failed verification"


@pytest.mark.slow(reason="builds digits with its variants")
def test_failed_derived_variant_never_falls_back_to_its_unrequested_base(digits_copy, tmp_path, quiet):
    spec = edit_spec(digits_copy, variants=["onnx_int8_static"], verify={"tolerances": {"int8": {"rel_l2": 1e-6}}})
    repo = tmp_path / "repo"
    with pytest.raises(VerificationError) as info:
        build(spec, repo, benchmark_seconds=CAP, progress=quiet)
    text = str(info.value)
    assert "no variant is eligible" in text and "nothing was published" in text
    assert "- onnx_int8_static: failed verification:" in text and "- logits: rel L2" in text and "> 1e-06" in text
    assert "- onnx: not requested; base for onnx_int8_static" in text
    assert not (repo / "digits_cnn").exists()


@pytest.mark.slow(reason="builds digits with its variants")
def test_derived_only_request_builds_base_but_never_publishes_it(digits_copy, tmp_path, quiet):
    # a tolerance INT8 meets on any CPU: the base must stay unpublished even when it is faster
    spec = edit_spec(digits_copy, variants=["onnx_int8_static"],
                     verify={"tolerances": {"int8": {"rel_l2": 10.0}}, "max_accuracy_drop": 100.0})
    result = build(spec, tmp_path / "repo", benchmark_seconds=CAP, publish_variants=True, progress=quiet)
    ctx = result.context
    assert ctx.requested_variants == ["onnx", "onnx_int8_static"]
    base = ctx.variant("onnx")
    assert base.verified is True and base.benchmark is not None  # verified and measured for comparison
    assert base.rejected == "not requested; base for onnx_int8_static"
    assert base.selection_reason.startswith("rejected: not requested; base for onnx_int8_static (measured ")
    assert ctx.selected.name == "onnx_int8_static"
    assert [p["name"] for p in result.published] == ["digits_cnn"]


@pytest.mark.slow(reason="builds digits with its variants")
def test_latency_objective_picks_lowest_p50_and_calibration_choices(digits_copy, tmp_path, quiet):
    (digits_copy / "data" / "calib.npz").unlink()
    data = yaml.safe_load((digits_copy / "spec.yaml").read_text())
    data["data"].pop("calibration")
    # search off: this test is about the spec's calibration choices reaching the recipe, and the auto
    # search (run when the default measures slower than FP32 - noise on a busy host) may pick another method
    data.update(objective="latency", quantization={"calibration_method": "percentile", "calibration_samples": 64,
                                                   "search": False})
    (digits_copy / "spec.yaml").write_text(yaml.safe_dump(data))
    result = build(digits_copy / "spec.yaml", tmp_path / "repo", variants=["onnx", "onnx_opt", "onnx_int8_static"],
                   benchmark_seconds=CAP, progress=quiet)
    ctx = result.context
    eligible = [v for v in ctx.variants if v.eligible]
    # the lowest p50 wins unless it is INT8 inside the noise of an FP32 variant (the tie rule, both outcomes
    # in tests/unit/test_select_noise.py): which applies depends on this host's figures
    choice = prefer_accurate({v.name: 1.0 / v.benchmark["latency_ms_b1"]["p50"] for v in eligible},
                             {v.name: select.worst_rel_l2(v) for v in eligible})
    assert ctx.selected.name == choice.name
    if choice.why is None:
        fastest = min(v.benchmark["latency_ms_b1"]["p50"] for v in eligible)
        assert ctx.selected.benchmark["latency_ms_b1"]["p50"] == fastest
        assert ctx.selected.selection_reason.startswith("selected: lowest p50 latency (p50 ")
    else:
        assert ctx.selected.selection_reason.startswith(f"selected: {choice.why}; measured (p50 ")
    for v in eligible:
        if not v.selected:
            assert re.search(r"(slower|faster) than \w+ \(p50 [\d.]+ vs [\d.]+ ms at batch 1\)", v.selection_reason)
    static = ctx.variant("onnx_int8_static")
    note = next(n for n in static.notes if n.startswith("calibrated on"))
    assert "validation inputs" in note and "64 samples" in note and "method percentile" in note
    assert "calibration percentile" in static.passes[-1]


@pytest.mark.slow(reason="builds digits with its variants")
def test_benchmark_seconds_zero_skips_measuring(digits_copy, tmp_path, quiet):
    result = build(digits_copy / "spec.yaml", tmp_path / "repo", variants=["onnx", "onnx_int8_dynamic"],
                   benchmark_seconds=0, progress=quiet)
    stage = next(r for r in result.results if r.stage == "benchmark")
    assert stage.status is Status.SKIPPED and "--benchmark-seconds 0" in stage.reason
    assert all(v.benchmark is None for v in result.context.variants)
    assert "nothing was measured" in result.context.selected.selection_reason
    assert not (Path(result.published[0]["path"]) / "build_report.png").exists()


def test_negative_benchmark_seconds_is_a_user_error(digits_copy, tmp_path, quiet):
    with pytest.raises(UserInputError, match="--benchmark-seconds: -1"):
        build(digits_copy / "spec.yaml", tmp_path / "repo", benchmark_seconds=-1, progress=quiet)


CONV_ONLY = '''
import torch
from torch import nn


class ConvOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 10, kernel_size=3, padding=1)

    def forward(self, image):
        return self.conv(image).mean(dim=(2, 3))


def build():
    torch.manual_seed(0)
    return ConvOnly().eval()
'''


def test_int8_dynamic_variants_skip_models_without_linear_layers(tmp_path, quiet):
    folder = tmp_path / "convonly"
    folder.mkdir()
    (folder / "model.py").write_text(CONV_ONLY)
    (folder / "spec.yaml").write_text(yaml.safe_dump({
        "name": "convonly", "source": {"module": "model:build"}, "max_batch_size": 4,
        "inputs": [{"name": "image", "dtype": "float32", "shape": [1, 8, 8]}], "outputs": [{"name": "logits"}],
        "variants": ["onnx", "torchscript", "onnx_int8_dynamic", "torchscript_int8_dynamic", "onnx_int8_static"]}))
    result = build(folder / "spec.yaml", tmp_path / "repo", benchmark_seconds=0, progress=quiet)
    ctx = result.context
    stage = next(r for r in result.results if r.stage == "quantize")
    assert stage.status is Status.OK
    assert "no MatMul/Gemm" in stage.outputs["skipped"]["onnx_int8_dynamic"]
    assert "no nn.Linear layers" in stage.outputs["skipped"]["torchscript_int8_dynamic"]
    assert ctx.variant("onnx_int8_dynamic") is None and ctx.variant("torchscript_int8_dynamic") is None
    static = ctx.variant("onnx_int8_static")
    assert static is not None and any("generated samples" in n for n in static.notes)


def test_calibration_batches_are_equal_sized():
    from builder.optimise.onnx_quantize import feeds
    samples = {"image": np.zeros((50, 1, 8, 8), np.float32)}
    assert [len(f["image"]) for f in feeds(samples, 16)] == [10] * 5  # entropy/percentile stack batches
    assert [len(f["image"]) for f in feeds({"image": np.zeros((64, 1))}, 16)] == [16] * 4
    assert [len(f["image"]) for f in feeds({"image": np.zeros((3, 1))}, 16)] == [3]


def test_quantization_spec_keys_are_validated(digits_copy):
    spec = edit_spec(digits_copy, quantization={"calibration_method": "kl"})
    with pytest.raises(UserInputError, match=r"field 'quantization.calibration_method': 'kl' is not supported; "
                                             r"use one of: minmax, entropy, percentile"):
        load_spec(spec)
    spec = edit_spec(digits_copy, quantization={"calibration_samples": 0})
    with pytest.raises(UserInputError, match=r"'quantization.calibration_samples': must be >= 1"):
        load_spec(spec)
    spec = edit_spec(digits_copy, quantization={"method": "minmax"})
    with pytest.raises(UserInputError, match=r"field 'quantization': unknown key\(s\) 'method'; known keys: "
                                             r"calibration_method, calibration_samples"):
        load_spec(spec)
    spec = edit_spec(digits_copy, quantization={"calibration_method": "entropy", "calibration_samples": 8})
    assert load_spec(spec).quantization.calibration_method == "entropy"
