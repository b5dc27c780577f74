"""OpenVINO variants on a tiny conv net: conversion to IR, the in-process runtime (latency hint, FP32
precision, threads = usable cores), NNCF INT8, verification (a pass and a forced failure),
publishing for the embedded target (python backend running the IR) and for target cpu (Triton's
openvino backend), validate's replay of a published IR, and NNCF's telemetry switched off."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from builder.core.host import usable_cores
from builder.optimise.openvino_tools import count_ops, ir_opsets, openvino_runner
from builder.pipeline import build
from builder.repository.config import parse_config
from builder.repository.runtime_gate import ir_failures, runtime_gate
from builder.repository.triton_releases import triton_release
from builder.repository.validate import validate_model
from builder.stages import verify
from builder.stages.base import Status
from builder.model.variants import registered, resolve_variants

MODEL = '''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 8, 3, padding=1); self.fc = torch.nn.Linear(8 * 6 * 6, 5)
    def forward(self, image):
        return self.fc(torch.relu(self.conv(image)).flatten(1))

def build():
    return M().eval()
'''
VARIANTS = ["onnx", "openvino", "openvino_int8"]


def tiny_spec(root, **changes):
    folder = root / "tiny"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL)
    (folder / "data").mkdir(exist_ok=True)
    rng = np.random.default_rng(1)  # labelled validation data: top-1 and its drop are measured
    np.savez(folder / "data" / "val.npz", image=rng.random((64, 1, 6, 6), dtype=np.float32),
             labels=rng.integers(0, 5, 64))
    data = {"name": "tiny", "source": {"module": "model:build"}, "data": {"validation": "data/val.npz"},
            "inputs": [{"name": "image", "dtype": "float32", "shape": [1, 6, 6], "value_range": [0.0, 1.0]}],
            "outputs": [{"name": "logits"}], "max_batch_size": 8, "quantization": {"calibration_samples": 32}}
    data.update(changes)
    (folder / "spec.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "spec.yaml"


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("openvino")
    repo = root / "repo"
    result = build(tiny_spec(root), repo, variants=VARIANTS, benchmark_seconds=0, publish_variants=True,
                   target="python", progress=lambda m: None)
    return result, repo


def test_openvino_variants_are_tried_by_default_on_the_cpu_targets_only():
    assert {"openvino", "openvino_int8"} <= set(registered())
    for target in ("python", "cpu"):
        assert {"openvino", "openvino_int8"} <= set(resolve_variants(None, target)), target
    assert not {"openvino", "openvino_int8"} & set(resolve_variants(None, "gpu"))


@pytest.mark.slow(reason="builds a model")
def test_without_a_cpu_plugin_the_openvino_variants_are_skipped_with_the_reason(tmp_path, monkeypatch):
    from builder.optimise import openvino_tools
    from builder.stages import quantize

    for module in (openvino_tools, quantize):  # stage quantize binds it by name
        monkeypatch.setattr(module, "cpu_plugin_problem",
                            lambda: "OpenVINO's CPU plugin does not run on this host (devices: none)")
    result = build(tiny_spec(tmp_path), tmp_path / "repo", variants=VARIANTS, benchmark_seconds=0,
                   progress=lambda m: None)
    ctx = result.context
    assert ctx.variant("openvino") is None and ctx.variant("openvino_int8") is None
    assert ctx.not_made["openvino"] == ("skipped", "OpenVINO's CPU plugin does not run on this host (devices: none)")
    assert result.context.selected.name == "onnx"


def test_an_ir_for_the_python_backend_runs_in_f32_and_one_for_triton_at_the_plugins_default(tiny_build, tmp_path):
    """What each server runs: model.py runs the marked IR in f32; Triton's openvino backend cannot force f32, so
    an unmarked IR runs at the CPU plugin's default here too (bf16 on CPUs with bfloat16)."""
    from builder.optimise import openvino_tools

    _, repo = tiny_build
    marked = repo / "tiny__openvino" / "1" / "model.xml"
    assert openvino_tools.marked_f32(openvino_tools.import_openvino().Core().read_model(str(marked)))
    plain = openvino_tools.to_ir(repo / "tiny" / "1" / "model.onnx", tmp_path / "plain")
    default = openvino_tools.import_openvino().Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
    assert openvino_runner(plain, ["logits"]).compiled.get_property("INFERENCE_PRECISION_HINT") == default
    assert openvino_tools.plugin_precision() == default.to_string()


@pytest.mark.slow(reason="builds a model")
@pytest.mark.parametrize("plugin", ["bf16", "f32"])
def test_for_tritons_backend_an_fp32_ir_is_judged_at_the_precision_the_plugin_computes_in(tmp_path, monkeypatch,
                                                                                          plugin):
    from builder.optimise import openvino_tools

    monkeypatch.setattr(openvino_tools, "plugin_precision", lambda: plugin)
    if plugin == "f32":  # a CPU without bfloat16: the plugin's default is f32 (on this host too, whatever its own)
        monkeypatch.setattr(openvino_tools, "marked_f32", lambda model: True)
    result = build(tiny_spec(tmp_path), tmp_path / "repo", variants=["onnx", "openvino"], target="cpu",
                   benchmark_seconds=0, progress=lambda m: None)
    variant = result.context.variant("openvino")
    assert variant.verified is True, variant.rejected
    assert f"inference precision: the CPU plugin's default ({plugin} on this CPU)" in variant.passes[0]
    if plugin == "bf16":
        assert variant.computes_in == "bf16" and variant.verification["tolerance_precision"] == "fp16"
        assert "the CPU plugin computes it in bf16 on this CPU" in variant.verification["tolerance_reason"]
        assert any(n.startswith("Triton's openvino backend cannot force f32") for n in variant.notes)
    else:
        assert variant.computes_in is None and variant.verification["tolerance"]["rel_l2"] == 1e-5


def test_onnx_becomes_an_fp32_ir_that_verifies_at_the_fp32_tolerance(tiny_build):
    result, _ = tiny_build
    variant = result.context.variant("openvino")
    assert variant.format == "openvino" and variant.precision == "fp32"
    assert variant.path.name == "model.xml"  # model.bin beside it travels along (published below)
    assert variant.verified is True, variant.rejected
    assert variant.verification["tolerance"]["rel_l2"] == 1e-5
    assert variant.verification["metrics"]["logits"]["rel_l2"] < 1e-5
    assert "Core.read_model (ONNX frontend)" in variant.passes[0] and "f32" in variant.passes[0]
    assert any(n.startswith("OpenVINO IR version 11, opsets opset") for n in variant.notes)


def test_nncf_int8_is_quantised_on_the_calibration_data_and_judged_by_the_int8_tolerance(tiny_build):
    result, _ = tiny_build
    variant = result.context.variant("openvino_int8")
    assert variant.precision == "int8" and variant.verification["tolerance"]["rel_l2"] == 0.1
    made = next(r for r in result.context.results if r.stage == "openvino").outputs["made"]
    assert int(made["openvino_int8"].split()[0]) > 0 and "FakeQuantize ops" in made["openvino_int8"]
    assert variant.passes[-1].startswith("nncf 3.4.0 quantize (default preset, 2 calibration batches)")
    assert variant.notes[0] == ("calibrated on the validation inputs (data.validation; no data.calibration given), "
                                "32 samples")
    assert variant.accuracy["metric"] == "top1" and "drop" in variant.accuracy
    rel_l2 = variant.verification["metrics"]["logits"]["rel_l2"]
    assert variant.verified is (rel_l2 <= 0.1), (rel_l2, variant.rejected)


def test_the_runtime_runs_the_ir_with_the_settings_it_was_verified_with(tiny_build):
    _, repo = tiny_build
    ir = repo / "tiny__openvino" / "1" / "model.xml"
    assert count_ops(ir, "Convolution") == 1 and ir_opsets(ir)
    run = openvino_runner(ir, ["logits"])
    compiled = run.compiled
    assert str(compiled.get_property("PERFORMANCE_HINT")) == "LATENCY"
    assert str(compiled.get_property("INFERENCE_PRECISION_HINT")) == "<Type: 'float32'>"
    assert compiled.get_property("INFERENCE_NUM_THREADS") == usable_cores()
    x = np.random.default_rng(0).random((3, 1, 6, 6), dtype=np.float32)
    assert run({"image": x})["logits"].shape == (3, 5)
    assert openvino_runner(ir, ["logits"], threads=1).compiled.get_property("INFERENCE_NUM_THREADS") == 1
    with pytest.raises(ValueError, match=r"model.xml has no output 'probs' \(it has logits\)"):
        openvino_runner(ir, ["probs"])


def test_published_for_target_python_the_python_backend_runs_the_ir(tiny_build, tmp_path):
    result, repo = tiny_build
    folder = repo / "tiny__openvino" / "1"
    assert {"model.xml", "model.bin", "model.py"} <= {p.name for p in folder.iterdir()}
    config = parse_config((repo / "tiny__openvino" / "config.pbtxt").read_text())
    assert config.backend == "python" and config.parameters["runtime"].string_value == "openvino"
    meta = yaml.safe_load((folder / "metadata.yaml").read_text())
    assert meta["artifact"]["file"] == "model.xml" and meta["artifact"]["format"] == "openvino"
    assert {"model.xml", "model.bin"} <= set(meta["files_sha256"])
    report = validate_model(repo / "tiny__openvino")  # hashes + the IR replayed against reference.npz
    assert report.ok, report.failures
    _, notes = runtime_gate(folder, meta, "24.10")
    assert notes[0].startswith("Triton 24.10: the python backend runs model.xml with the openvino that docker/triton "
                               f"installs (--build-arg OPENVINO_VERSION={meta['versions']['openvino']})")
    copy = tmp_path / "tiny__openvino"
    shutil.copytree(repo / "tiny__openvino", copy)
    (copy / "1" / "model.bin").write_bytes(b"\0" + (copy / "1" / "model.bin").read_bytes()[1:])
    tampered = validate_model(copy)
    assert not tampered.ok
    assert "model.bin: sha256 differs from metadata.yaml (file changed after the build)" in tampered.versions[-1].failures


def test_a_forced_failure_is_rejected_with_its_numbers(tiny_build):
    # the published FP32 IR verified again, in a copy of the build's context, against a tolerance no
    # FP32 runtime meets (rel L2 1e-12): stage verify's real check must fail it with the numbers
    result, repo = tiny_build
    ctx = copy.deepcopy(result.context)
    ctx.spec.verify.tolerances = {"fp32": {"rel_l2": 1e-12}}
    variant = dataclasses.replace(ctx.variant("openvino"), path=repo / "tiny__openvino" / "1" / "model.xml",
                                  verified=None, verification=None)
    ctx.variants = [variant]
    assert verify.run(ctx).status is Status.FAIL
    assert variant.verified is False
    assert re.match(r"failed verification:\n- logits: rel L2 \d\.\de-\d\d > 1e-12", variant.rejected), variant.rejected
    good = dataclasses.replace(variant, verified=None, rejected="")
    ctx.spec.verify.tolerances = {}
    ctx.variants = [good]
    assert verify.run(ctx).status is Status.OK and good.verified is True


def test_target_cpu_publishes_the_ir_for_tritons_openvino_backend(tmp_path):
    repo = tmp_path / "repo"
    build(tiny_spec(tmp_path, variants=["openvino"]), repo, target="cpu", benchmark_seconds=0,
          progress=lambda m: None)
    assert sorted(p.name for p in (repo / "tiny" / "1").glob("model.*")) == ["model.bin", "model.xml"]
    config = parse_config((repo / "tiny" / "config.pbtxt").read_text())
    assert config.backend == "openvino" and config.default_model_filename == "model.xml"
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["PERFORMANCE_HINT"] == "LATENCY" and params["NUM_STREAMS"] == "1"
    assert int(params["INFERENCE_NUM_THREADS"]) >= 1
    # the gate's static part: Triton 24.10's openvino backend (OpenVINO 2024.4: opsets up to 14) reads this IR
    # (the replay under a release's own OpenVINO: tests/integration/test_runtime_gate.py)
    version = repo / "tiny" / "1"
    assert ir_failures(version / "model.xml", triton_release("24.10")) == []
    newer = tmp_path / "newer.xml"  # the same IR with one layer from an opset 2024.4 does not know
    newer.write_text(re.sub(r'(<layer [^>]*type="Convolution" )version="opset\d+"', r'\1version="opset15"',
                            (version / "model.xml").read_text()))
    assert ir_failures(newer, triton_release("24.10")) == [
        "newer.xml: uses OpenVINO opset15 > opset14, the newest OpenVINO 2024.4.0 (Triton 24.10's openvino backend) "
        "reads: serve it on target python (the python backend, with the builder's openvino in docker/triton: "
        "--build-arg OPENVINO_VERSION) or publish the onnx variant"]


def test_openvino_and_nncf_are_imported_with_their_telemetry_declined(tmp_path):
    # a fresh interpreter without pytest (NNCF turns telemetry off under pytest by itself), a fresh home
    # without a consent file (which openvino_telemetry treats as consent) and no CI variable
    code = ("import os; from builder.optimise.openvino_tools import import_nncf, to_ir; import_nncf(); "
            "from nncf.telemetry import wrapper; from openvino_telemetry import Telemetry; "
            "print(type(wrapper.telemetry).__name__, Telemetry().consent, os.environ.get('CI'))")
    env = {k: v for k, v in os.environ.items() if k not in ("NNCF_CI", "NNCF_DEV", "CI", "TF_BUILD", "JENKINS_URL")}
    env["HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    # NNCF's stub is a MagicMock; ovc's import-time telemetry (openvino/tools/ovc/__init__.py) declined;
    # CI restored (unset) right after the import
    assert done.stdout.strip().splitlines()[-1] == "MagicMock False None"
    assert not (tmp_path / "intel").exists()  # no client id, no usage counter


def test_over_the_accuracy_budget_nncf_runs_its_accuracy_aware_quantisation(tiny_build, tmp_path, monkeypatch):
    # injected: the plain nncf.quantize result is 5 points over budget (a verdict, not this host's figure);
    # the maker then runs nncf.quantize_with_accuracy_control with the spec's budget, for real
    from builder.stages import openvino as stage

    result, repo = tiny_build
    ctx = copy.deepcopy(result.context)
    ctx.workdir = tmp_path
    ctx.add_variant(dataclasses.replace(ctx.variant("onnx"), path=repo / "tiny" / "1" / "model.onnx"))
    real, drops = stage._top1_drop, []

    def top1_drop(context, ir):
        drops.append(5.0 if not drops else real(context, ir))
        return drops[-1]

    monkeypatch.setattr(stage, "_top1_drop", top1_drop)
    said = stage.make_openvino_int8(ctx)
    variant = ctx.variant("openvino_int8")
    assert variant.passes[-1] == "nncf quantize_with_accuracy_control(max_drop=1.0 points, absolute)"
    assert "plain nncf.quantize: top-1 drop 5.00 points > 1.0 allowed: ran nncf.quantize_with_accuracy_control" \
        in variant.notes
    assert len(drops) == 2 and f"top-1 drop {drops[1]:+.2f} points" in said
    assert (tmp_path / "openvino_int8" / "model.xml").is_file() and (tmp_path / "openvino_int8" / "model.bin").is_file()


def test_select_on_another_host_can_publish_the_openvino_ir_with_its_weights(tiny_build, tmp_path):
    # injected: OpenVINO measures fastest on "this" host; select republishes the IR (model.xml + model.bin)
    # as a new version of tiny, sized with the openvino parameters, and validate replays it
    from builder.repository.reselect import select_for_host

    _, built = tiny_build
    repo = tmp_path / "repo"
    shutil.copytree(built, repo)

    def measure(label, runner, inputs, threads):
        assert runner(inputs)
        return {"throughput": 5000.0 if label == "tiny__openvino/1" else 1000.0, "p50_ms": 0.2}

    host = {"cpu_model": "elsewhere", "isa_flags": ["avx2"], "isa_class": "avx2", "usable_cores": 2}
    report = select_for_host(repo, "tiny", measure=measure, current_host=host)
    assert report.winner.variant == "openvino" and report.published["version"] == 2
    version = repo / "tiny" / "2"
    assert {"model.xml", "model.bin", "model.py"} <= {p.name for p in version.iterdir()}
    assert validate_model(repo / "tiny", 2).ok
