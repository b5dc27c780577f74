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
    from builder.spec.model import load_spec
    from builder.stages import load
    from builder.stages.base import BuildContext, BuildOptions
    from builder.accuracy.tensors import compare_outputs, merge_case_metrics, tolerance_failures

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


def test_torchscript_variants_measured_on_the_gpu_and_ranked_among_themselves(tmp_path):
    """Target gpu on a GPU host: the TorchScript variants are measured on the GPU, ONNX (onnxruntime's CPU
    provider) on the CPU; selection ranks the GPU figures and says why ONNX was not ranked."""
    from builder.pipeline import build

    result = build(DIGITS, tmp_path / "repo", target="gpu", variants=["onnx", "torchscript", "torchscript_fp16"],
                   benchmark_seconds=1, progress=lambda m: None)
    ctx = result.context
    devices = {v.name: v.benchmark["device"] for v in ctx.variants if v.benchmark}
    assert devices == {"onnx": "cpu", "torchscript": "cuda", "torchscript_fp16": "cuda"}, devices
    assert torch.cuda.get_device_name(0) in ctx.variant("torchscript_fp16").benchmark["runtime"]
    assert ctx.selected.name in ("torchscript", "torchscript_fp16")
    assert ctx.variant("onnx").selection_reason.startswith("not ranked: measured on this machine's CPU")
    assert ctx.variant("torchscript_fp16").verified, ctx.variant("torchscript_fp16").rejected


def _gpu_processes() -> set[int]:
    done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                          text=True, timeout=30)
    return {int(p) for p in done.stdout.split() if p.strip().isdigit()}


@pytest.mark.xfail(strict=False, reason="on the lent H100 host (Python 3.12, nvidia-pytriton 0.7) every python-backend "
                   "answer came back empty, ONNX and TorchScript, KIND_GPU and KIND_CPU alike (docs/known-issues.md)")
def test_embedded_server_serves_torchscript_fp16_on_a_gpu_instance(tmp_path):
    """deploy.instance_kind gpu: the python backend's KIND_GPU instance runs the FP16 TorchScript on the GPU
    (a process other than this one holds GPU memory), and its answers pass the served accuracy gate."""
    from builder.pipeline import build
    from builder.serving.check import check_served
    from builder.serving.embedded import EmbeddedServer
    from builder.spec.model import load_spec

    spec = load_spec(DIGITS)
    spec.deploy.instance_kind = "gpu"
    repo = tmp_path / "repo"
    result = build(spec, repo, variants=["torchscript_fp16"], benchmark_seconds=1, progress=lambda m: None)
    assert result.context.selected.name == "torchscript_fp16"
    assert "kind: KIND_GPU" in (repo / "digits_cnn" / "config.pbtxt").read_text()
    before = _gpu_processes()
    server = EmbeddedServer(repo, ready_timeout=120)
    server.start()
    try:
        report = check_served("digits_cnn", repository=repo, url=server.http_url, grpc_url=server.grpc_url)
        assert report.ok, "\n".join(report.lines())
        if shutil.which("nvidia-smi"):
            holders = _gpu_processes() - before - {__import__("os").getpid()}
            assert holders, "no tritonserver stub holds GPU memory: the model did not run on the GPU"
    finally:
        server.stop()
