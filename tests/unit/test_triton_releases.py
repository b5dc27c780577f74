"""The Triton release table (builder/repository/triton_releases.py): complete for every listed release, the
newest is the default, limits per release, `triton-builder releases`, and `serve`'s warning for a
repository built for another release than the embedded server's."""

from __future__ import annotations

import re

import pytest
from onnx import TensorProto, helper

from builder.core.errors import UserInputError
from builder.repository import triton_releases as tr
from builder.repository.runtime_gate import limit_failures
from builder.serving.serve import served_release_warnings
from tests.conftest import run_cli

LISTED = ("24.10", "24.11", "26.05", "26.06", "26.07", "26.08")


@pytest.mark.parametrize("name", LISTED)
def test_every_listed_release_is_complete(name):
    release = tr.triton_release(f"{name}-py3")
    assert release.release == name and re.fullmatch(r"2\.\d+\.\d+", release.triton)
    assert release.onnxruntime in tr.ONNXRUNTIME_LIMITS and release.openvino in tr.OPENVINO_MAX_OPSET
    assert release.max_ir_version >= 10 and release.max_opset >= 21 and release.libtorch >= (2, 5)
    assert release.python in ("3.10", "3.12") and release.image == f"nvcr.io/nvidia/tritonserver:{name}-py3"
    assert release.stub_numpy2 == (name != "24.10")  # pybind11 2.10 in 24.10's stub (issue 5009)


def test_the_versions_the_sources_give():
    assert [(r.triton, r.onnxruntime, r.openvino, r.pytorch.split("+")[0]) for r in map(tr.triton_release, LISTED)] == [
        ("2.51.0", "1.19.2", "2024.4.0", "2.5.0a0"), ("2.52.0", "1.19.2", "2024.4.0", "2.6.0a0"),
        ("2.69.0", "1.24.4", "2026.1.0", "2.12.0a0"), ("2.70.0", "1.24.4", "2026.2.0", "2.12.0a0"),
        ("2.71.0", "1.27.0", "2026.2.0", "2.13.0a0"), ("2.72.0", "1.28.0", "2026.3.0", "2.14.0a0")]
    assert tr.triton_release("24.10").tensorrt == "10.5.0.18" and tr.triton_release("26.08").tensorrt is None


def test_the_newest_is_the_default_and_the_embedded_server_is_24_10():
    assert tr.DEFAULT_RELEASE == tr.COMPOSE_RELEASE == "26.08" and tr.EMBEDDED_RELEASE == "24.10"
    with pytest.raises(UserInputError, match=r"--triton-release 25.01: not in triton-builder's runtime table \(known: "
                                             r"24.10, 24.11, 26.05, 26.06, 26.07, 26.08\); add its row to "
                                             r"builder/repository/triton_releases.py"):
        tr.triton_release("25.01")


def _edge_model(path, ir: int, opset: int):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("ir, opset, refused_by_24_10, refused_by_26_07", [
    (10, 21, False, False),  # 24.10's edge
    (11, 21, True, False),  # one IR version past 24.10's onnxruntime 1.19.2
    (10, 22, True, False),  # one opset past it
    (13, 26, True, False),  # 26.07's edge (onnxruntime 1.27.0)
    (14, 26, True, True),
    (13, 27, True, True),
])
def test_onnx_limits_follow_the_release(tmp_path, ir, opset, refused_by_24_10, refused_by_26_07):
    model = _edge_model(tmp_path / "model.onnx", ir, opset)
    for release, refused in (("24.10", refused_by_24_10), ("26.07", refused_by_26_07)):
        failures = limit_failures(model, tr.onnx_runtime_for(tr.triton_release(release), "onnxruntime"))
        assert bool(failures) == refused, (release, failures)


def test_torchscript_from_a_newer_torch_is_refused_with_the_release_that_loads_it():
    assert tr.libtorch_failure("2.13.0+cpu", tr.triton_release("26.07")) is None
    assert tr.libtorch_failure("2.12.1", tr.triton_release("26.05")) is None
    said = tr.libtorch_failure("2.13.0+cpu", tr.triton_release("24.10"))
    assert said.startswith("TorchScript saved by torch 2.13.0+cpu is newer than Triton 24.10's libtorch 2.5.0a0")
    assert "build for --triton-release 26.07 or newer (libtorch 2.13.0a0)" in said
    assert "no release in the table ships a libtorch that new" in tr.libtorch_failure("2.99.0", tr.triton_release("26.08"))


def test_the_python_backend_image_runs_the_releases_onnxruntime_except_24_10():
    assert tr.python_backend_onnxruntime(tr.triton_release("24.10")) == "1.20.1"  # 24.10's Python 3.10 image
    assert tr.python_backend_onnxruntime(tr.triton_release("26.07")) == "1.27.0"


def test_releases_verb_prints_the_table():
    proc = run_cli("releases")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["release", "triton", "onnxruntime"]
    assert lines[2].startswith("26.08 (default)") and "1.28.0 (13, 26)" in lines[2] and "2026.3.0 (opset16)" in lines[2]
    assert any(line.startswith("24.10 (embedded)") and "10.5.0.18" in line for line in lines)
    assert all(any(line.startswith(name) for line in lines) for name in LISTED)
    assert "nvcr.io/nvidia/tritonserver:26.08-py3 by default" in proc.stdout


def test_serve_warns_for_a_repository_built_for_another_release(tmp_path):
    import yaml

    for name, release in (("new", "26.08"), ("old", "24.10"), ("unrecorded", None)):
        version = tmp_path / name / "1"
        version.mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\n')
        artifact = {"format": "onnx", **({"triton_release": release} if release else {})}
        (version / "metadata.yaml").write_text(yaml.safe_dump({"artifact": artifact}))
    warnings = served_release_warnings(tmp_path, ["new", "old", "unrecorded"])
    assert warnings == [f"new: built for Triton 26.08; this embedded server is Triton 24.10 with this environment's "
                        f"runtimes. `triton-builder validate REPO/new --triton-release 26.08` replays it under 26.08's "
                        "own runtimes; serve it on that release's image (docker compose)"]
