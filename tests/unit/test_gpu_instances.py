"""The GPU choices that CPU machines can check: deploy.instance_kind and the variants it allows, the FP16
TorchScript, where each variant is measured (availability injected: both outcomes) and how selection ranks
figures from two devices, and model.py refusing a CPU runtime on a KIND_GPU instance."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from builder.core.errors import UserInputError
from builder.pipeline import BuildOptions
from builder.spec.model import load_spec
from builder.stages import benchmark, select
from builder.stages.base import BuildContext, Variant
from builder.model.variants import resolve_variants
from tests.conftest import EXAMPLES, served_model_py

torch = pytest.importorskip("torch")


def _spec(instance_kind: str = "auto"):
    spec = load_spec(EXAMPLES / "digits" / "spec.yaml")
    spec.deploy.instance_kind = instance_kind
    return spec


def test_instance_kind_is_parsed_and_a_wrong_value_named(tmp_path):
    shutil.copytree(EXAMPLES / "digits", tmp_path / "digits")
    spec = tmp_path / "digits" / "spec.yaml"
    text = spec.read_text() + "deploy:\n  instance_kind: KIND\n"
    spec.write_text(text.replace("KIND", "gpu"))
    assert load_spec(spec).deploy.instance_kind == "gpu"
    spec.write_text(text.replace("KIND", "tpu"))
    with pytest.raises(UserInputError, match=r"instance_kind.*tpu.*auto, cpu, gpu"):
        load_spec(spec)


def test_gpu_instances_take_torchscript_only_and_pair_with_target_embedded():
    assert resolve_variants(None, "python", "gpu") == ["torchscript", "torchscript_fp16"]
    assert "torchscript_fp16" in resolve_variants(None, "gpu")
    assert "torchscript_fp16" not in resolve_variants(None, "python")
    with pytest.raises(UserInputError, match=r"variants onnx .*deploy.instance_kind gpu: the python backend runs only "
                                             r"TorchScript"):
        resolve_variants(["onnx", "torchscript"], "python", "gpu")
    with pytest.raises(UserInputError, match="deploy.instance_kind gpu with target cpu"):
        resolve_variants(None, "cpu", "gpu")
    with pytest.raises(UserInputError, match="deploy.instance_kind cpu with target gpu"):
        resolve_variants(None, "gpu", "cpu")


def test_config_of_a_gpu_instance_is_kind_gpu_and_not_sized_from_cpu_cores():
    from builder.repository.publish import config_for

    signature = {"logits": ("float32", [10])}
    gpu = config_for(_spec("gpu"), "torchscript", "python", "digits_cnn", signature, sizing=(2, 1),
                     queue_delay_us=500)
    assert [(g.kind, g.count) for g in gpu.instance_groups] == [("KIND_GPU", 1)]
    assert gpu.backend == "python" and gpu.parameters["runtime"] == "torchscript"
    assert gpu.dynamic_batching.max_queue_delay_microseconds == 0
    cpu = config_for(_spec(), "torchscript", "python", "digits_cnn", signature, sizing=(2, 1), queue_delay_us=500)
    assert [(g.kind, g.count) for g in cpu.instance_groups] == [("KIND_CPU", 2)]
    assert cpu.dynamic_batching.max_queue_delay_microseconds == 500


def test_half_torchscript_keeps_the_spec_dtypes_at_the_boundary():
    from builder.optimise.torch_fp16 import half_torchscript

    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.embed = torch.nn.Embedding(10, 4)

        def forward(self, image, ids):
            pooled = self.conv(image).mean((2, 3))
            return pooled + self.embed(ids).mean(1), ids.sum(1)

    model = TwoInputs().eval()
    torch.manual_seed(0)
    args = (torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2, 5)))
    with torch.inference_mode():
        expected = model(*args)
    half = half_torchscript(torch.jit.trace(model, args), args)
    features, count = half(*args)
    assert features.dtype == torch.float32 and count.dtype == torch.int64  # ids were never cast
    assert torch.equal(count, expected[1])
    assert float((features - expected[0]).norm() / expected[0].norm()) < 1e-2
    assert any(p.dtype == torch.float16 for p in half.parameters())


def test_torchscript_is_measured_on_the_gpu_only_where_the_version_serves_on_one_and_a_gpu_is_here():
    ts, onnx, plan = (Variant(n, f, "fp32", Path("/nonexistent")) for n, f in
                      (("torchscript", "torchscript"), ("onnx", "onnx"), ("tensorrt_fp16", "plan")))
    gpu_ctx = BuildContext(spec=_spec(), options=BuildOptions(repository=Path("/x"), target="gpu"), workdir=Path("/x"))
    cpu_ctx = BuildContext(spec=_spec(), options=BuildOptions(repository=Path("/x")), workdir=Path("/x"))
    gpu_instance_ctx = BuildContext(spec=_spec("gpu"), options=BuildOptions(repository=Path("/x")), workdir=Path("/x"))
    assert benchmark.measuring_device(gpu_ctx, ts, gpu_here=True) == "cuda"
    assert benchmark.measuring_device(gpu_instance_ctx, ts, gpu_here=True) == "cuda"
    assert benchmark.measuring_device(gpu_ctx, ts, gpu_here=False) == "cpu"
    assert benchmark.measuring_device(cpu_ctx, ts, gpu_here=True) == "cpu"
    assert benchmark.measuring_device(gpu_ctx, onnx, gpu_here=True) == "cpu"
    assert benchmark.measuring_device(gpu_ctx, plan, gpu_here=False) == "cuda"


def _measured(name, fmt, precision, ips, device):
    v = Variant(name, fmt, precision, Path(f"/nonexistent/{name}"), verified=True)
    v.accuracy = {"metric": "top1", "drop": 0.0}
    v.verification = {"metrics": {"logits": {"rel_l2": 1e-4, "max_abs": 0.0}}}
    v.benchmark = {"latency_ms_b1": {"p50": 0.1}, "best_throughput": ips, "best_batch": 64, "device": device}
    return v


@pytest.mark.parametrize("onnx_device, published", [("cpu", "torchscript_fp16"), ("cuda", "onnx")])
def test_selection_ranks_gpu_figures_apart_from_cpu_figures(onnx_device, published):
    ctx = BuildContext(spec=_spec(), options=BuildOptions(repository=Path("/x"), target="gpu"), workdir=Path("/x"))
    ctx.variants = [_measured("onnx", "onnx", "fp32", 300e3, onnx_device),
                    _measured("torchscript", "torchscript", "fp32", 120e3, "cuda"),
                    _measured("torchscript_fp16", "torchscript", "fp16", 200e3, "cuda")]
    select.run(ctx)
    assert ctx.selected.name == published
    if onnx_device == "cpu":
        assert ctx.variant("onnx").selection_reason == ("not ranked: measured on this machine's CPU, the others on "
                                                        "its GPU (300k inf/s at batch 64 on the CPU)")
        assert "the throughput of onnx" not in ctx.selected.selection_reason  # no GPU-vs-CPU ratio


def test_model_py_refuses_a_cpu_runtime_on_a_gpu_instance(tmp_path):
    from builder.repository import pb_utils_stand_in

    config = {"max_batch_size": 8, "input": [{"name": "image", "data_type": "TYPE_FP32", "dims": [1, 8, 8]}],
              "output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [10]}],
              "parameters": {"runtime": {"string_value": "onnxruntime"}, "model_file": {"string_value": "model.onnx"}}}
    (tmp_path / "1").mkdir()
    with served_model_py(pb_utils_stand_in, "served_model_py_gpu_kind") as module:
        with pytest.raises(pb_utils_stand_in.TritonModelException,
                           match=r"model.onnx: runtime onnxruntime runs on the CPU in the python backend, and this is "
                                 r"a KIND_GPU instance: publish a torchscript variant"):
            module.TritonPythonModel().initialize({
                "model_config": json.dumps(config), "model_name": "m", "model_version": "1",
                "model_repository": str(tmp_path), "model_instance_kind": "GPU", "model_instance_device_id": "0",
                "model_instance_name": "m_0_0"})



def test_a_torchscript_opened_on_the_gpu_runs_fp32_without_tf32(monkeypatch):
    """Seen on an H100: torch's default TF32 convolutions put convnet64 1.2e-4 off its reference (fp32 tolerance
    1e-5), so the served replay refused the FP32 TorchScript; FP32 on the GPU is full FP32, as verified."""
    from builder.model.runtime import open_runner

    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    loaded = []
    monkeypatch.setattr(torch.jit, "load", lambda path, map_location: loaded.append(map_location) or torch.nn.Identity())
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        open_runner("torchscript", Path("/nonexistent/model.pt"), ["y"], ["x"])  # the CPU leaves torch's settings alone
        assert torch.backends.cudnn.allow_tf32 is True and torch.backends.cuda.matmul.allow_tf32 is True
        open_runner("torchscript", Path("/nonexistent/model.pt"), ["y"], ["x"], device="cuda:0")
        assert loaded == ["cpu", "cuda:0"]
        assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cuda.matmul.allow_tf32 is False
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def test_the_shipped_trace_runs_convolutions_without_tf32(tmp_path):
    """The trace bakes allow_tf32 into each aten::_convolution; the global switch cannot undo it on the GPU."""
    from builder.stages import export_torchscript

    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True  # torch's default; an earlier GPU-runner test may have left it off
    try:
        with export_torchscript._full_fp32(torch):
            traced = torch.jit.trace(torch.nn.Conv2d(1, 2, 3).eval(), torch.randn(1, 1, 5, 5))
        assert torch.backends.cudnn.allow_tf32 is True  # restored after the trace
    finally:
        torch.backends.cudnn.allow_tf32 = before
    convolutions = [n for n in traced.graph.nodes() if n.kind() == "aten::_convolution"]
    assert convolutions and all(n.inputsAt(12).node().i("value") == 0 for n in convolutions)
