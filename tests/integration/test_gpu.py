"""GPU checks: the FP16 path through torch/CUDA, and (with the tensorrt package) the TensorRT plan
built, verified, recorded and checked for compatibility on this GPU. Marked `gpu`; every test skips
with the reason when torch sees no CUDA GPU (CI never has one)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits" / "spec.yaml"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here (torch.cuda.is_available() is False)"),
]


def _local_cc() -> str:
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}"


def test_fp16_path_through_torch_cuda(tmp_path):
    """The eager model in FP16 on the GPU stays within the FP16 tolerance of the FP32 CPU reference."""
    from builder.spec import load_spec
    from builder.stages import load
    from builder.stages.base import BuildContext, BuildOptions
    from builder.tensors import compare_outputs, merge_case_metrics, tolerance_failures

    spec = load_spec(DIGITS)
    ctx = BuildContext(spec=spec, options=BuildOptions(repository=tmp_path / "repo", target="gpu"), workdir=tmp_path,
                       progress=lambda m: None)
    assert load.run(ctx).status.value == "OK"
    model = ctx.model.half().cuda().eval()
    per_case = []
    for case, reference in zip(ctx.reference.cases, ctx.reference.outputs):
        args = [torch.from_numpy(np.ascontiguousarray(case["inputs"][t.name])).cuda().half() for t in spec.inputs]
        with torch.inference_mode():
            out = model(*args)
        got = {spec.outputs[0].name: out.float().cpu().numpy()}
        per_case.append(compare_outputs(reference, got))
    metrics = merge_case_metrics(per_case)
    assert not tolerance_failures(metrics, spec.verify.tolerance("fp16")), metrics


def test_local_gpu_detection_matches_torch():
    from builder.tensorrt.compatibility import query_gpus

    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on PATH")
    gpus, why = query_gpus()
    assert gpus, why
    assert gpus[0]["compute_capability"] == _local_cc()


def test_tensorrt_plan_build_verify_record_and_compatibility(tmp_path):
    trt = pytest.importorskip("tensorrt", reason="the tensorrt Python package is not installed (pip install -e '.[gpu]')")
    from builder.pipeline import build
    from builder.repository.metadata import read_metadata

    repo = tmp_path / "repo"
    result = build(DIGITS, repo, target="gpu", variants=["onnx", "tensorrt_fp16"], publish_variants=True,
                   benchmark_seconds=0, progress=lambda m: None)
    stage = next(r for r in result.results if r.stage == "tensorrt")
    assert stage.status.value == "OK", stage.reason
    plan = result.context.variant("tensorrt_fp16")
    assert plan.verified, plan.rejected
    published = {p["name"]: p for p in result.published}
    plan_model = "digits_cnn" if plan.selected else "digits_cnn__tensorrt_fp16"
    assert published[plan_model]["backend"] == "tensorrt_plan"
    meta = read_metadata(repo / plan_model / str(published[plan_model]["version"]) / "metadata.yaml")
    record = meta["tensorrt"]
    assert record["compute_capability"] == _local_cc() and record["tensorrt_version"] == trt.__version__
    assert record["precision"] == "fp16" and record["profiles"]["image"]["max"] == [64, 1, 8, 8]
    assert not (repo / "digits_cnn" / "1" / "plan_recipe.json").exists()  # built here: nothing deferred

    def validate(*args):
        return subprocess.run([sys.executable, "-m", "builder", "validate", str(repo / plan_model), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    same = validate("--gpu", _local_cc(), "--tensorrt-version", trt.__version__)
    assert same.returncode == 0, same.stdout + same.stderr
    other = "8.0" if _local_cc() != "8.0" else "9.0"
    refused = validate("--gpu", other, "--tensorrt-version", trt.__version__)
    assert refused.returncode == 1 and f"target GPU has compute capability {other}" in refused.stdout
    if shutil.which("nvidia-smi"):
        here = validate()  # this machine is the target: the plan's outputs are re-run against reference.npz
        assert here.returncode == 0 and "hashes match" in here.stdout, here.stdout + here.stderr
