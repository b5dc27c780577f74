"""Stage `optimize`: graph-optimised variants of the plain ONNX export.

- ``onnx_opt``: onnxoptimizer folding passes (BN into Conv, ...), onnxslim (folds what those leave
  behind, removes dead code), then onnxruntime's offline graph optimisation saved to a file
  (``SessionOptions.optimized_model_filepath``): level *extended* for CPU targets (its fusions, e.g.
  FusedConv, are onnxruntime-only ops: fine for the onnxruntime and python backends), *basic* for
  gpu (extended fusions are made for the provider that optimised them, here the CPU one).
- ``onnx_fp16``: FP16 weights and compute, inputs/outputs kept in the spec's dtypes (Casts at the
  boundaries). Tried by default on target gpu only; on CPU when asked for.
- ``torchscript_fp16``: the same for the shipped TorchScript (builder/optimise/torch_fp16.py: half weights,
  channels_last where an input is 4-D, casts at the boundary); target gpu, and the python backend on a
  GPU instance (deploy.instance_kind gpu). Measured on the GPU where this machine has one.

Both are verified and measured like every other variant; nothing here is assumed to be faster.
"""

from __future__ import annotations

import warnings

from builder.accuracy.tensors import trace_example
from builder.model.variants import register_variant
from builder.optimise import onnx_tools, transformer_fusion
from builder.optimise.torch_fp16 import half_torchscript
from builder.optimise.trace_safety import froze_text, frozen_conversions
from builder.stages.base import BuildContext, StageResult, Variant
from builder.stages.common import check_base, example_args, export_legacy, finish_export, make_each

STAGE = "optimize"


def _base(ctx: BuildContext) -> Variant:
    base = ctx.variant("onnx")
    if base is None or not base.path.exists():
        raise RuntimeError("the base ONNX export is missing (see stage export_onnx)")
    return base


def _ms_ops(model) -> list[str]:
    return sorted({n.op_type for n in model.graph.node if n.domain not in ("", "ai.onnx")})


@register_variant("onnx_opt", format="onnx", precision="fp32", stage=STAGE, base="onnx",
                  description="ONNX FP32, graph-optimised (onnxoptimizer + onnxslim + onnxruntime offline)")
def make_onnx_opt(ctx: BuildContext) -> str:
    base = _base(ctx)
    out_dir = ctx.workdir / "onnx_opt"
    out_dir.mkdir(parents=True, exist_ok=True)
    folded = out_dir / "folded.onnx"
    fused = _transformer_fused(ctx, base, out_dir, folded)
    if fused is not None:
        passes, exporter = fused
    else:
        model, passes = onnx_tools.standard_passes(onnx_tools.load(base.path))
        onnx_tools.save(model, folded)
        exporter = base.exporter
    level = "basic" if ctx.target == "gpu" else "extended"
    final = out_dir / "model.onnx"
    onnx_tools.ort_optimize(folded, final, level)
    for leftover in (folded, folded.with_name(folded.name + ".data")):
        leftover.unlink(missing_ok=True)
    passes.append(f"onnxruntime offline graph optimisation: {level} (ORT_ENABLE_{level.upper()})")
    optimised = onnx_tools.load(final)
    variant = Variant("onnx_opt", "onnx", "fp32", final, exporter=f"{exporter}+optimised",
                      opset=base.opset, passes=passes)
    ort_only = _ms_ops(optimised)
    if ort_only:
        variant.notes.append(f"contains onnxruntime-only ops ({', '.join(ort_only)}): serve it with onnxruntime "
                             "(onnxruntime or python backend); `validate --triton-release R` replays it on that "
                             "release's onnxruntime")
    before, after = len(onnx_tools.load(base.path).graph.node), len(optimised.graph.node)
    variant.notes.append(f"nodes {before} -> {after}")
    ctx.add_variant(variant)
    return f"{before} -> {after} nodes ({level})"


def _transformer_fused(ctx: BuildContext, base: Variant, out_dir, folded) -> tuple[list[str], str] | None:
    """A Hugging Face encoder (builder/optimise/transformer_fusion.py): its legacy export with onnxruntime's transformer
    fusions, written to ``folded``; (passes, exporter), or None (not an encoder, or nothing fused: the usual
    passes run; a failure's reason is said in the build's progress)."""
    shape = transformer_fusion.encoder_shape(ctx.model) if ctx.spec.source.eager else None
    if shape is None or ctx.target == "gpu":  # on GPU TensorRT does its own fusions
        return None
    kind, heads, hidden = shape
    source = base.path
    exporter = base.exporter
    switched: list[str] = []
    try:
        if base.exporter != "legacy":  # the optimizer's attention patterns match the legacy graph only
            raw = out_dir / "legacy_raw.onnx"
            with transformer_fusion.eager_attention(ctx.model) as switched:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    export_legacy(ctx.model, ctx.spec, raw)
                frozen = frozen_conversions(ctx.model, example_args(ctx.spec), caught)
            if frozen:  # a trace that froze control flow on input values is no graph to fuse and serve
                ctx.progress(f"  onnx_opt: transformer fusions not applied: the legacy trace {froze_text(frozen)}")
                return None
            source = out_dir / "legacy.onnx"
            finish_export("legacy", ctx.spec, raw, source)
            exporter = "legacy"
        counts = transformer_fusion.fuse(source, folded, kind, heads, hidden)
    except Exception as exc:  # noqa: BLE001 - the usual passes still make the variant
        ctx.progress(f"  onnx_opt: transformer fusions not applied ({onnx_tools.short_error(exc)})")
        return None
    finally:
        for leftover in out_dir.glob("legacy*"):
            leftover.unlink(missing_ok=True)
    if not any(counts.get(k) for k in transformer_fusion.KEY_FUSIONS):
        folded.unlink(missing_ok=True)
        return None
    said = ", ".join(f"{k} {v}" for k, v in counts.items()) + (f" (exported with eager attention: "
                                                                 f"{'; '.join(switched)})" if switched else "")
    where = ("legacy export of the module (its attention matches; the dynamo graph does not)"
             if exporter != base.exporter else "export")
    return [f"onnxruntime transformer optimizer ({kind}, {heads} heads, hidden {hidden}) on the {where}: {said}"], \
        exporter


@register_variant("onnx_fp16", format="onnx", precision="fp16", stage=STAGE, base="onnx", targets=("gpu",),
                  description="ONNX FP16 (weights and compute; inputs/outputs keep the spec's dtypes)")
def make_onnx_fp16(ctx: BuildContext) -> str:
    base = _base(ctx)
    check_base(ctx, [base])  # FP16's looser tolerance would hide an export error the base failed on
    out_dir = ctx.workdir / "onnx_fp16"
    out_dir.mkdir(parents=True, exist_ok=True)
    model = onnx_tools.to_float16(onnx_tools.load(base.path), keep_io_types=True)
    final = onnx_tools.save(model, out_dir / "model.onnx")
    variant = Variant("onnx_fp16", "onnx", "fp16", final, exporter=f"{base.exporter}+fp16", opset=base.opset,
                      passes=["onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)"],
                      base=base.name)
    if ctx.target != "gpu":
        variant.notes.append("FP16 on CPU: most CPUs have no fast FP16 kernels; measured, not assumed")
    ctx.add_variant(variant)
    return f"{len(model.graph.node)} nodes"


@register_variant("torchscript_fp16", format="torchscript", precision="fp16", stage=STAGE, base="torchscript",
                  targets=("gpu",),
                  description="TorchScript FP16 (half weights and compute, channels_last for 4-D inputs; inputs/outputs "
                              "keep the spec's dtypes)")
def make_torchscript_fp16(ctx: BuildContext) -> str:
    import torch


    base = ctx.variant("torchscript")
    if base is None or not base.path.exists():
        raise RuntimeError("the base TorchScript export is missing (see stage export_torchscript)")
    check_base(ctx, [base])
    example = trace_example(ctx.spec)
    args = tuple(torch.from_numpy(example[t.name]) for t in ctx.spec.inputs)
    half = half_torchscript(torch.jit.load(str(base.path), map_location="cpu").eval(), args)
    out_dir = ctx.workdir / "torchscript_fp16"
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / "model.pt"
    half.save(str(final))
    variant = Variant("torchscript_fp16", "torchscript", "fp16", final, exporter=f"{base.exporter}+fp16",
                      passes=["module.half() (channels_last for 4-D inputs), traced with casts at the boundary"],
                      base=base.name)
    if ctx.spec.deploy.kind_for(ctx.target) != "KIND_GPU":
        variant.notes.append("FP16 on CPU: most CPUs have no fast FP16 kernels; measured, not assumed")
    ctx.add_variant(variant)
    return f"from {base.exporter}"


MAKERS = {"onnx_opt": make_onnx_opt, "onnx_fp16": make_onnx_fp16, "torchscript_fp16": make_torchscript_fp16}


def run(ctx: BuildContext) -> StageResult:
    wanted = [name for name in MAKERS if ctx.wants(name)]
    if not wanted:
        return StageResult.skipped(STAGE, "no optimised variant requested (onnx_opt, onnx_fp16, torchscript_fp16)")
    made, failed, text = make_each(ctx, wanted, lambda name: MAKERS[name](ctx))
    if made:
        return StageResult.ok(STAGE, text, made=made, failed=failed)
    if failed:
        return StageResult.fail(STAGE, text, made=made, failed=failed)
    return StageResult.skipped(STAGE, text, made=made, failed=failed)  # every one's base failed verification
