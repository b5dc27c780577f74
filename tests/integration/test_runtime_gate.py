"""The runtime-compatibility gate (validate --triton-release) with the REAL onnxruntime / OpenVINO that a
Triton release ships, installed from PyPI into cached side virtualenvs (first run: ~30 s each): 24.10's
(the limits the embedded server's release has), the default (newest, docker-compose.yml's) and 26.07's."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from builder.repository import runtime_gate
from builder.repository.metadata import read_metadata
from builder.repository.triton_releases import (COMPOSE_RELEASE, onnx_runtime_for, python_backend_onnxruntime,
                                               triton_release)
from tests.conftest import ROOT, in_ci, run_cli

pytestmark = [pytest.mark.slow]


OLD = "24.10"  # the embedded server's release: IR 10 / opset 21 limits
PYTHON_ORT = python_backend_onnxruntime(triton_release(OLD))  # docker/triton's for 24.10, python-backend models
BACKEND_ORT = triton_release(OLD).onnxruntime  # Triton 24.10's onnxruntime backend's
DEFAULT_PYTHON_ORT = python_backend_onnxruntime(triton_release(COMPOSE_RELEASE))


@pytest.fixture(scope="module")
def side(tmp_path_factory):
    try:
        return [runtime_gate.side_python(version) for version in (PYTHON_ORT, BACKEND_ORT, DEFAULT_PYTHON_ORT)]
    except Exception as err:  # noqa: BLE001 - no PyPI here
        if in_ci():
            raise
        pytest.skip(f"cannot install the release's onnxruntime here: {err}")


@pytest.mark.parametrize("model", ["digits_cnn", "bert_tiny"])
def test_every_example_passes_the_compose_release(built_repository, side, model):
    proc = run_cli("validate", str(built_repository / model), "--triton-release", COMPOSE_RELEASE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    backend_ort = triton_release(COMPOSE_RELEASE).onnxruntime  # a standard folder: the release's onnxruntime backend
    assert f"Triton {COMPOSE_RELEASE}: loads on onnxruntime {backend_ort} (Triton {COMPOSE_RELEASE}, onnxruntime_onnx " \
        "backend" in proc.stdout


def _copy_version(built_repository: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "1"
    shutil.copytree(built_repository / "digits_cnn" / "1", folder)
    return folder


def test_a_model_the_release_cannot_load_is_refused_with_the_fix(built_repository, side, tmp_path, monkeypatch):
    folder = _copy_version(built_repository, tmp_path)
    model = onnx.load(str(folder / "model.onnx"))
    model.ir_version = 11
    onnx.save(model, str(folder / "model.onnx"))
    meta = read_metadata(folder / "metadata.yaml")
    failures, _ = runtime_gate.runtime_gate(folder, meta, OLD)
    assert failures == [f"model.onnx: ONNX IR version 11 > 10, the newest onnxruntime {BACKEND_ORT} (Triton 24.10, "
                        "onnxruntime_onnx backend) loads: export with IR version <= 10 (the spec's "
                        "onnx.opset at most 21, or onnx.version_converter and model.ir_version = 10)"]
    # past the static check, the real onnxruntimes refuse it too (the python backend's, and - as an
    # onnxruntime_onnx model - Triton 24.10's own 1.19.2), and the message keeps the fix
    monkeypatch.setattr(runtime_gate, "limit_failures", lambda *a: [])
    for backend, version in (("python", PYTHON_ORT), ("onnxruntime", BACKEND_ORT)):
        meta["artifact"]["backend"] = backend
        failures, _ = runtime_gate.runtime_gate(folder, meta, OLD)
        assert len(failures) == 1 and f"onnxruntime {version} (Triton 24.10, {backend} backend" in failures[0]
        assert f"refuses it: IR version 11 is newer than onnxruntime {version} loads (max 10): export with IR " \
               "version <= 10" in failures[0], failures[0]


def test_opset_is_named_and_contrib_ops_left_to_the_real_runtime(built_repository, tmp_path):
    folder = _copy_version(built_repository, tmp_path)
    model = onnx.load(str(folder / "model.onnx"))
    model.opset_import[0].version = 23
    model.graph.node[0].domain = "com.microsoft"
    onnx.save(model, str(folder / "model.onnx"))
    failures = runtime_gate.limit_failures(folder / "model.onnx",
                                           onnx_runtime_for(triton_release(OLD), "onnxruntime"))
    assert len(failures) == 1 and "opset 23 > 21" in failures[0] and "set onnx.opset: 21" in failures[0], failures
    assert runtime_gate.contrib_ops(folder / "model.onnx") == [f"com.microsoft::{model.graph.node[0].op_type}"]


@pytest.fixture(scope="module")
def convnet64_variants(tmp_path_factory):
    """convnet64 with each ONNX variant published (onnx_opt carries onnxruntime's FusedConv contrib op)."""
    from builder.pipeline import build

    repo = tmp_path_factory.mktemp("convnet64") / "model_repository"
    build(ROOT / "examples" / "convnet64" / "spec.yaml", repo, variants=["onnx", "onnx_opt", "onnx_int8_static"],
          publish_variants=True, benchmark_seconds=0, progress=lambda m: None)
    return repo


def test_every_published_convnet64_variant_passes_the_default_release(convnet64_variants, side):
    variant_of = {p.name: read_metadata(p / "1" / "metadata.yaml")["artifact"]["variant"]
                  for p in convnet64_variants.iterdir() if (p / "config.pbtxt").is_file()}
    # onnx and onnx_opt always verify; the static INT8 variant only where it verifies on this CPU
    assert {"onnx", "onnx_opt"} <= set(variant_of.values()), variant_of
    for model, variant in variant_of.items():
        proc = run_cli("validate", str(convnet64_variants / model), "--triton-release", COMPOSE_RELEASE)
        assert proc.returncode == 0, model + proc.stdout + proc.stderr
        assert f"Triton {COMPOSE_RELEASE}: loads on onnxruntime {DEFAULT_PYTHON_ORT}" in proc.stdout
        if variant == "onnx_opt":  # onnxruntime's FusedConv: the release's real onnxruntime loads it
            assert "its onnxruntime contrib ops (com.microsoft::FusedConv) load and match on that release" \
                in proc.stdout


def test_answers_that_no_longer_match_are_refused(built_repository, side, tmp_path):
    folder = _copy_version(built_repository, tmp_path)
    with np.load(folder / "reference.npz") as archive:
        arrays = {k: archive[k] + (0.5 if k.startswith("output/") else 0) for k in archive.files}
    np.savez_compressed(folder / "reference.npz", **arrays)
    meta = read_metadata(folder / "metadata.yaml")
    meta["artifact"]["backend"] = "onnxruntime"  # as served by Triton 24.10's own onnxruntime backend
    failures, notes = runtime_gate.runtime_gate(folder, meta, OLD)
    assert failures and all(f"onnxruntime {BACKEND_ORT} (Triton 24.10, onnxruntime backend): " in f
                            and "no longer matches" in f for f in failures), failures


def test_an_unknown_release_names_the_table(built_repository):
    proc = run_cli("validate", str(built_repository / "digits_cnn"), "--triton-release", "19.01")
    assert proc.returncode == 2
    assert "--triton-release 19.01: not in triton-builder's runtime table (known: 24.10, 24.11, 26.05" in proc.stderr


@pytest.fixture(scope="module")
def digits_for_26_07(tmp_path_factory):
    """digits built for Triton 26.07's own backends (target cpu): onnxruntime_onnx, openvino, pytorch_libtorch."""
    from builder.pipeline import build

    repo = tmp_path_factory.mktemp("digits2607") / "model_repository"
    build(ROOT / "examples" / "digits" / "spec.yaml", repo, variants=["onnx", "openvino", "torchscript"], target="cpu",
          publish_variants=True, benchmark_seconds=0, triton_release="26.07", progress=lambda m: None)
    return repo


def test_a_26_07_build_replays_under_26_07s_onnxruntime_openvino_and_torch(digits_for_26_07):
    release = triton_release("26.07")
    formats = {p.name: read_metadata(p / "1" / "metadata.yaml")["artifact"]
               for p in digits_for_26_07.iterdir() if (p / "config.pbtxt").is_file()}
    assert {a["format"] for a in formats.values()} == {"onnx", "openvino", "torchscript"}, formats
    assert {a["triton_release"] for a in formats.values()} == {"26.07"}
    expected = {"onnx": f"Triton 26.07: loads on onnxruntime {release.onnxruntime} (Triton 26.07, onnxruntime_onnx backend)",
                "openvino": f"Triton 26.07: loads on OpenVINO {release.openvino} (Triton 26.07, openvino backend)",
                "torchscript": "Triton 26.07: replayed with torch 2.13"}
    for model, artifact in formats.items():
        proc = run_cli("validate", str(digits_for_26_07 / model), "--triton-release", "26.07")
        assert proc.returncode == 0, model + proc.stdout + proc.stderr
        assert expected[artifact["format"]] in proc.stdout, proc.stdout
    # the same TorchScript against 24.10's libtorch 2.5: refused, naming the release that loads it
    torchscript = next(m for m, a in formats.items() if a["format"] == "torchscript")
    proc = run_cli("validate", str(digits_for_26_07 / torchscript), "--triton-release", "24.10")
    assert proc.returncode == 1 and "is newer than Triton 24.10's libtorch 2.5.0a0" in proc.stdout, proc.stdout
