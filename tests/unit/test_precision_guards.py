"""Models that do not compute in float32: an INT8 variant that quantized nothing is not made (it would
be the FP32 graph under an INT8 name), torch dynamic INT8 skips non-float32 Linear layers, OpenVINO
refuses float64 up front, a variant whose runtime cannot load it is rejected alone, and an export of
a float16/bfloat16 model is judged at the fp16 tolerance (its own rounding), with the reason recorded."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from builder.accuracy import verification
from builder.pipeline import build
from builder.optimise import onnx_quantize
from builder.stages import verify
from builder.stages.base import Status, Variant

HALF = '''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0)
        self.l1 = torch.nn.Linear(16, 32); self.ln = torch.nn.LayerNorm(32); self.l2 = torch.nn.Linear(32, 4)
    def forward(self, x):
        return self.l2(torch.relu(self.ln(self.l1(x))))
def build():
    return M().half().eval()
'''

DOUBLE = '''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.l = torch.nn.Linear(10, 4).double()
    def forward(self, x):
        return torch.exp(self.l(x)) * 1e-3
def build():
    return M().eval()
'''

NO_QUANTIZABLE_OP = '''
import torch
class M(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(torch.relu(x), -1) * 2 + 1
def build():
    return M().eval()
'''


def _spec(root: Path, name: str, source: str, dtype: str, size: int, variants: list[str], **extra) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(source)
    spec = {"name": name, "source": {"module": "model:build"}, "max_batch_size": 4,
            "inputs": [{"name": "x", "dtype": dtype, "shape": [size]}], "outputs": [{"name": "y"}],
            "variants": variants, **extra}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    return folder / "spec.yaml"


def _build(root: Path, *args, **extra):
    return build(_spec(root, *args, **extra), root / "repo", benchmark_seconds=0, progress=lambda m: None)


@pytest.fixture(scope="module")
def half_build(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("half"), "half", HALF, "float16", 16,
                  ["onnx", "openvino", "onnx_int8_dynamic", "torchscript_int8_dynamic"])


@pytest.fixture(scope="module")
def double_build(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("double"), "double", DOUBLE, "float64", 10,
                  ["onnx", "onnx_int8_static", "onnx_int8_dynamic", "openvino", "openvino_int8"],
                  quantization={"search": "off"})


def test_fp32_exports_of_a_half_model_are_judged_at_the_fp16_tolerance_with_the_reason(half_build):
    ctx = half_build.context
    for name in ("onnx", "openvino"):
        variant = ctx.variant(name)
        assert variant.precision == "fp32" and variant.verified is True, (name, variant.rejected)
        assert variant.verification["tolerance"]["rel_l2"] == 1e-2
        assert variant.verification["tolerance_precision"] == "fp16"
        assert variant.verification["tolerance_reason"] in variant.notes
        assert "parameters float16, output y float16" in variant.verification["tolerance_reason"]


def test_dynamic_int8_that_quantized_nothing_is_not_made(half_build):
    ctx = half_build.context
    stage = next(r for r in half_build.results if r.stage == "quantize")
    skipped = stage.outputs["skipped"]
    assert ctx.variant("onnx_int8_dynamic") is None and ctx.variant("torchscript_int8_dynamic") is None
    assert ctx.not_made["onnx_int8_dynamic"][0] == "skipped"
    assert skipped["onnx_int8_dynamic"].startswith("nothing was quantized (would equal onnx): quantize_dynamic")
    assert "weights are float16 and onnxruntime's quantize_dynamic quantizes float32" in skipped["onnx_int8_dynamic"]
    assert skipped["torchscript_int8_dynamic"].startswith("the model's nn.Linear layers are float16, not float32")


def test_float64_models_get_no_fake_int8_and_no_openvino(double_build):
    ctx = double_build.context
    assert ctx.variant("onnx").verified is True
    assert "tolerance_precision" not in ctx.variant("onnx").verification  # float64 is no looser than fp32
    for name in ("onnx_int8_static", "onnx_int8_dynamic", "openvino", "openvino_int8"):
        assert ctx.variant(name) is None and ctx.not_made[name][0] == "skipped", name
    assert "weights are float64" in ctx.not_made["onnx_int8_static"][1]
    openvino = next(r for r in double_build.results if r.stage == "openvino")
    assert openvino.status is Status.SKIPPED
    assert re.match(r"OpenVINO's CPU plugin has no f64 and this is a float64 model \(input x, output y, \d+ "
                    r"float64 weight\(s\)\): it would compute in f32 or fail to compile; serve the onnx",
                    ctx.not_made["openvino_int8"][1])


def test_a_variant_its_runtime_cannot_load_is_rejected_alone(double_build, tmp_path):
    ctx = copy.deepcopy(double_build.context)
    broken = tmp_path / "model.xml"
    broken.write_text("<net>not an IR</net>")
    published = Path(ctx.published[0]["path"]) / "model.onnx"  # the build's work folder is gone
    onnx = dataclasses.replace(ctx.variant("onnx"), path=published, verified=None, rejected="")
    ctx.variants = [onnx, Variant("openvino", "openvino", "fp32", broken)]
    result = verify.run(ctx)
    assert result.status is Status.OK and onnx.verified is True
    assert ctx.variants[1].verified is False
    assert ctx.variants[1].rejected.startswith("failed verification:\n- the variant could not be loaded to run: ")


def test_openvino_int8_with_no_fake_quantize_is_not_made(tmp_path):
    result = _build(tmp_path, "noquant", NO_QUANTIZABLE_OP, "float32", 8, ["onnx", "openvino_int8"])
    ctx = result.context
    assert ctx.variant("openvino_int8") is None and ctx.not_made["openvino_int8"][0] == "skipped"
    assert ctx.not_made["openvino_int8"][1].startswith(
        "nothing was quantized (would equal openvino): NNCF inserted no FakeQuantize")
    assert not (ctx.workdir / "openvino_int8").exists()


def _ctx(params=None, outputs=None, kind="module"):
    model = torch.nn.Linear(2, 2).to(params) if params else None
    return SimpleNamespace(model=model, spec=SimpleNamespace(source=SimpleNamespace(kind=kind)),
                           reference=SimpleNamespace(output_dtypes=outputs or {"y": "float32"}))


@pytest.mark.parametrize("params, outputs, precision, expected, why", [
    (torch.float32, None, "fp32", "fp32", ""),
    (torch.bfloat16, {"y": "float32"}, "fp32", "fp16", "parameters bfloat16"),
    (torch.float32, {"y": "float16", "z": "float32"}, "fp32", "fp16", "output y float16"),
    (torch.float16, None, "int8", "int8", ""),  # INT8 is looser already
    (torch.float16, None, "fp16", "fp16", ""),
    (torch.float64, {"y": "float64"}, "fp32", "fp32", ""),
])
def test_the_judged_precision_follows_the_models_own(params, outputs, precision, expected, why):
    got, reason = verification.judged_precision(_ctx(params, outputs), Variant("v", "onnx", precision, Path("m")))
    assert got == expected
    assert (why in reason) if why else reason == ""


def test_float16_inputs_alone_do_not_loosen_the_tolerance():
    """Every variant is fed the same rounded input: only the model's own arithmetic can differ."""
    assert verification.judged_precision(_ctx(torch.float32), Variant("v", "onnx", "fp32", Path("m"))) == ("fp32", "")


def test_an_onnx_source_with_float16_weights_is_judged_at_the_fp16_tolerance(tmp_path):
    from onnx import TensorProto, helper, save

    weight = helper.make_tensor("w", TensorProto.FLOAT16, [2, 2], [1.0, 0.0, 0.0, 1.0])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 2])], [weight])
    save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    ctx = SimpleNamespace(model=None, reference=SimpleNamespace(output_dtypes={"y": "float32"}),
                          spec=SimpleNamespace(source=SimpleNamespace(kind="onnx", path=tmp_path / "m.onnx")))
    precision, why = verification.judged_precision(ctx, Variant("onnx_opt", "onnx", "fp32", Path("m")))
    assert precision == "fp16" and "(weights float16)" in why


def test_quantized_op_types_are_read_from_the_quantized_graph():
    import onnx
    from onnx import helper

    nodes = [helper.make_node(op, ["a"], [f"o{i}"]) for i, op in enumerate(
        ["DynamicQuantizeLinear", "MatMulInteger", "QuantizeLinear", "DequantizeLinear", "Cast", "MatMul"])]
    graph = helper.make_graph(nodes, "g", [], [])
    model = helper.make_model(graph)
    assert onnx_quantize.quantized_op_types(model) == {"DynamicQuantizeLinear": 1, "MatMulInteger": 1,
                                                   "QuantizeLinear": 1, "DequantizeLinear": 1}
    assert onnx_quantize.quantized_ops(model) == 3  # a QDQ pair quantizes one value
    assert isinstance(model, onnx.ModelProto) and np.isfinite(1.0)


MIXED_LINEARS = '''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 8); self.b = torch.nn.Linear(8, 2).double()
    def forward(self, x):
        return self.b(torch.relu(self.a(x)).double()).float()
def build():
    return M().eval()
'''


def test_torch_dynamic_int8_quantizes_only_the_float32_linear_layers(tmp_path):
    result = _build(tmp_path, "mixed", MIXED_LINEARS, "float32", 8, ["torchscript", "torchscript_int8_dynamic"])
    made = next(r for r in result.results if r.stage == "quantize").outputs["made"]
    assert made["torchscript_int8_dynamic"].startswith("1 Linear layer(s), torch.jit.")
    variant = result.context.variant("torchscript_int8_dynamic")
    assert variant.notes[0].startswith("1 nn.Linear layer(s) quantized")
    assert not variant.rejected.startswith("failed verification:\n- case"), variant.rejected  # it runs
