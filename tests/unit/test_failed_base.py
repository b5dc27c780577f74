"""No variant from a failed base (stages/common.py check_base): a variant derived from another - INT8 from
onnx or onnx_opt, openvino_int8, TorchScript INT8, plans, FP16, compressed - is not made when its base
failed verification, and says why at once; the base is verified on demand, once. A derived variant
also records its error relative to its base (verification["vs_base"])."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from builder.optimise.openvino_tools import cpu_plugin_problem
from builder.spec.model import load_spec
from builder.stages import load, openvino, quantize, verify
from builder.stages.base import BuildContext, BuildOptions, Status, Variant
from builder.stages.common import BaseFailed, check_base

W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10

LINEAR = '''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.arange(12, dtype=torch.float32).reshape(4, 3) / 10)
    def forward(self, x):
        return x @ self.w
def build():
    return M()
'''


def matmul_onnx(path: Path, scale: float) -> Path:
    """y = x @ (scale * W): the model's own function at scale 1, a wrong export otherwise."""
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "linear",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor("w", TensorProto.FLOAT, [4, 3], (W * scale).ravel().tolist())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what the Triton release gate accepts
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def loaded(tmp_path: Path, variants: list[str], onnx_scale: float) -> tuple[BuildContext, list[str]]:
    """Stage load run on the linear model; an 'onnx' variant (right at scale 1) added, not yet verified."""
    (tmp_path / "model.py").write_text(LINEAR)
    spec = {"name": "linear", "source": {"module": "model:build"}, "max_batch_size": 8,
            "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}], "outputs": [{"name": "y"}],
            "quantization": {"search": "off"}, "variants": variants}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    said: list[str] = []
    ctx = BuildContext(spec=load_spec(tmp_path / "spec.yaml"), options=BuildOptions(repository=tmp_path / "repo"),
                       workdir=tmp_path / "work", progress=said.append)
    ctx.requested_variants = variants
    assert load.run(ctx).status is Status.OK
    ctx.add_variant(Variant("onnx", "onnx", "fp32", matmul_onnx(tmp_path / "work" / "onnx" / "model.onnx", onnx_scale)))
    return ctx, said


BASE_FAILED = r"its base onnx failed verification \(y: rel L2 5\.0e-01 > 1e-05 .*\); a variant made from it would " \
              r"inherit that error, so it is not made"


def test_int8_is_not_quantized_from_an_export_that_fails_verification(tmp_path):
    ctx, said = loaded(tmp_path, ["onnx", "onnx_int8_static", "onnx_int8_dynamic"], onnx_scale=1.5)
    result = quantize.run(ctx)

    assert result.status is Status.SKIPPED
    onnx_variant = ctx.variant("onnx")
    assert onnx_variant.verified is False  # verified on demand, before anything was quantized from it
    for name in ("onnx_int8_static", "onnx_int8_dynamic"):
        assert ctx.variant(name) is None and not (ctx.workdir / name).exists()
        kind, why = ctx.not_made[name]
        assert kind == "skipped" and re.fullmatch(BASE_FAILED, why), why
        assert any(line.startswith(f"  {name} skipped: its base onnx failed verification (y: rel L2") for line in said)
    assert said.count("  verifying onnx ...") == 1  # once, for both
    # stage verify does not verify it again, and still reports it
    report = verify.run(ctx).outputs["results"]
    assert report["onnx"][0].startswith("y: rel L2 5.0e-01 > 1e-05") and said.count("  verifying onnx ...") == 1


def test_int8_from_a_passing_export_is_made_and_records_its_error_vs_that_base(tmp_path):
    ctx, said = loaded(tmp_path, ["onnx", "onnx_int8_dynamic"], onnx_scale=1.0)
    assert quantize.run(ctx).status is Status.OK
    int8 = ctx.variant("onnx_int8_dynamic")
    assert ctx.variant("onnx").verified is True and int8.base == "onnx"
    verify.run(ctx)
    vs_base = int8.verification["vs_base"]
    assert vs_base["base"] == "onnx" and set(vs_base["rel_l2"]) == {"y"} and vs_base["worst_rel_l2"] >= 0
    assert any(n.startswith("vs its base onnx: rel L2 ") for n in int8.notes)


def test_a_failed_base_of_any_kind_names_itself_and_its_first_failure(tmp_path):
    failed = Variant("torchscript", "torchscript", "fp32", tmp_path / "m.pt", verified=False,
                     rejected="failed verification:\n- y: rel L2 2.0e-02 > 1e-05 (max abs 1e-01)\n- z: missing\n"
                              "- cases: fails on gen_b1 (x [1, 4])")  # the cases are the base's own row's to say
    with pytest.raises(BaseFailed, match=r"^its base torchscript failed verification \(y: rel L2 2\.0e-02 > 1e-05 "
                                         r"\(max abs 1e-01\) \(and 1 more\)\); a variant made from it would inherit "
                                         r"that error, so it is not made$"):
        check_base(None, [None, failed])  # a base not made (None) is not judged
    passed = Variant("onnx", "onnx", "fp32", tmp_path / "m.onnx", verified=True)
    check_base(None, [passed])


def test_torchscript_int8_is_not_made_from_a_failed_torchscript(tmp_path):
    ctx, said = loaded(tmp_path, ["torchscript", "torchscript_int8_dynamic"], onnx_scale=1.0)
    ctx.add_variant(Variant("torchscript", "torchscript", "fp32", tmp_path / "m.pt", verified=False,  # injected
                            rejected="failed verification:\n- y: rel L2 3.0e-02 > 1e-05"))
    result = quantize.run(ctx)
    assert result.status is Status.SKIPPED and ctx.variant("torchscript_int8_dynamic") is None
    assert ctx.not_made["torchscript_int8_dynamic"][1].startswith("its base torchscript failed verification (y: rel L2 "
                                                                  "3.0e-02 > 1e-05)")


@pytest.mark.skipif(cpu_plugin_problem() is not None, reason="OpenVINO's CPU plugin does not run here")
def test_openvino_int8_is_not_made_from_a_failed_export_but_the_fp32_ir_is_judged_on_its_own(tmp_path):
    ctx, said = loaded(tmp_path, ["onnx", "openvino", "openvino_int8"], onnx_scale=1.5)
    result = openvino.run(ctx)
    assert ctx.variant("openvino") is not None  # an FP32 conversion: made, and verified at FP32 itself
    assert ctx.variant("openvino_int8") is None
    assert ctx.not_made["openvino_int8"][0] == "skipped"
    assert ctx.not_made["openvino_int8"][1].startswith("its base onnx failed verification (y: rel L2 5.0e-01")
    assert "openvino_int8 skipped: its base onnx failed verification" in result.reason
    assert any(line.startswith("  openvino_int8 skipped: its base onnx") for line in said)
