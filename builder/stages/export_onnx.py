"""Stage `export_onnx`: the dynamo exporter by default, the legacy (TorchScript-based) exporter as a
fallback when it fails; which one ran and why is recorded. The batch axis and every -1 dim are
exported dynamic; outputs are renamed to the spec's names; onnx.checker and shape inference run;
large weights go to ``model.onnx.data`` beside the model."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

from builder.stages.base import BuildContext, StageResult, Variant
from builder.tensors import trace_example
from builder.variants import register_variant

STAGE = "export_onnx"
LEGACY_DEFAULT_OPSET = 17
EXTERNAL_DATA_THRESHOLD = 1 << 30  # bytes of weights above which they go to model.onnx.data


@register_variant("onnx", format="onnx", precision="fp32", stage=STAGE,
                  description="ONNX FP32 (dynamo exporter, legacy fallback)")
def make_onnx(ctx: BuildContext) -> StageResult:
    spec = ctx.spec
    out_dir = ctx.workdir / "onnx"
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / "model.onnx"
    if spec.source.kind == "onnx":
        shutil.copyfile(spec.source.path, final)
        data = spec.source.path.with_name(spec.source.path.name + ".data")
        if data.exists():
            shutil.copyfile(data, out_dir / data.name)
        opset = finalize_onnx(final, [o.name for o in spec.outputs], rename=False)
        ctx.add_variant(Variant("onnx", "onnx", "fp32", final, exporter="given", opset=opset))
        return StageResult.ok(STAGE, "source is ONNX: taken as it is", exporter="given", opset=opset)

    raw_dir = ctx.workdir / "onnx_raw"
    raw_dir.mkdir(exist_ok=True)
    raw = raw_dir / "model.onnx"
    attempts: dict[str, str] = {}
    order = {"auto": ["dynamo", "legacy"], "dynamo": ["dynamo"], "legacy": ["legacy"]}[spec.onnx.exporter]
    if spec.source.kind == "torchscript":
        order = ["legacy"]  # the dynamo exporter cannot take a ScriptModule
        attempts["dynamo"] = "skipped: the source is a TorchScript module, which only the legacy exporter takes"
    exporter = None
    for name in order:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                (_export_dynamo if name == "dynamo" else _export_legacy)(ctx, raw)
            exporter = name
            break
        except Exception as exc:  # noqa: BLE001 - exporter failures are recorded, then we fall back
            attempts[name] = " ".join(str(exc).split())[:400] or type(exc).__name__
    if exporter is None:
        return StageResult.fail(STAGE, "every ONNX exporter failed: "
                                + "; ".join(f"{k}: {v}" for k, v in attempts.items()), attempts=attempts)
    opset = finalize_onnx(raw, [o.name for o in spec.outputs], rename=True, dest=final)
    symbolic = mark_symbolic_output_dims(ctx, final)
    variant = Variant("onnx", "onnx", "fp32", final, exporter=exporter, opset=opset)
    if "dynamo" in attempts and exporter == "legacy":
        variant.notes.append(f"dynamo exporter failed, used legacy: {attempts['dynamo']}")
    ctx.add_variant(variant)
    shutil.rmtree(raw_dir, ignore_errors=True)
    return StageResult.ok(STAGE, f"exported with the {exporter} exporter, opset {opset}",
                          exporter=exporter, opset=opset, attempts=attempts, symbolic_output_dims=symbolic)


def mark_symbolic_output_dims(ctx: BuildContext, path: Path) -> dict[str, list[int]]:
    """Per-sample output dims the exported graph leaves symbolic (a data-dependent length, e.g. the
    rows of ``x[mask]``) become -1 in the signature the config is made from, even where every reference
    run happened to give the same length. Outputs whose shape the spec states are left as stated."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    stated = {o.name for o in ctx.spec.outputs if o.shape}
    changed: dict[str, list[int]] = {}
    for output in graph.output:
        current = ctx.reference.output_shapes.get(output.name)
        if current is None or output.name in stated or not output.type.tensor_type.HasField("shape"):
            continue
        dims = list(output.type.tensor_type.shape.dim)[1 if ctx.spec.batching else 0:]
        if len(dims) != len(current):
            continue
        merged = [-1 if d.HasField("dim_param") else c for d, c in zip(dims, current)]
        if merged != current:
            ctx.reference.output_shapes[output.name] = changed[output.name] = merged
    return changed


def _dynamic_axes(ctx: BuildContext) -> list[dict[int, str]]:
    offset = 1 if ctx.spec.batching else 0
    axes = []
    for tensor in ctx.spec.inputs:
        dims = {0: "batch"} if ctx.spec.batching else {}
        for j, size in enumerate(tensor.shape):
            if size == -1:
                dims[j + offset] = f"{tensor.name}_d{j}"
        axes.append(dims)
    return axes


def _example_args(ctx: BuildContext):
    import torch
    example = trace_example(ctx.spec)
    return tuple(torch.from_numpy(example[t.name]) for t in ctx.spec.inputs)


def _export_dynamo(ctx: BuildContext, path: Path) -> None:
    import logging

    import torch

    # the exporter logs one warning per torchvision op it cannot register; torchvision is not needed
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    from torch.export import Dim

    dynamic_shapes = tuple({axis: Dim.DYNAMIC for axis in dims} or None for dims in _dynamic_axes(ctx))
    kwargs = {"opset_version": ctx.spec.onnx.opset} if ctx.spec.onnx.opset else {}
    torch.onnx.export(ctx.model, _example_args(ctx), str(path), dynamo=True,
                      input_names=[t.name for t in ctx.spec.inputs], dynamic_shapes=dynamic_shapes,
                      external_data=True, report=False, verbose=False, **kwargs)


def _export_legacy(ctx: BuildContext, path: Path) -> None:
    import torch

    names = [t.name for t in ctx.spec.inputs]
    torch.onnx.export(ctx.model, _example_args(ctx), str(path), dynamo=False, input_names=names,
                      output_names=[o.name for o in ctx.spec.outputs],
                      dynamic_axes={n: axes for n, axes in zip(names, _dynamic_axes(ctx)) if axes},
                      opset_version=ctx.spec.onnx.opset or LEGACY_DEFAULT_OPSET)


def rename_value(graph, old: str, new: str) -> None:
    """Rename a value everywhere in the graph (producers, consumers, outputs, value_info)."""
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name == old:
                node.output[i] = new
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
    for collection in (graph.output, graph.value_info, graph.input):
        for value in collection:
            if value.name == old:
                value.name = new


def finalize_onnx(path: Path, output_names: list[str], rename: bool, dest: Path | None = None) -> int:
    """Rename outputs to the spec's names (moving clashing internal names aside), run the checker and
    shape inference, save (external data for large weights), return the default-domain opset."""
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    if rename:
        if len(graph.output) != len(output_names):
            raise ValueError(f"exported graph has {len(graph.output)} outputs, spec lists {len(output_names)}")
        current = [o.name for o in graph.output]
        used = {n for node in graph.node for n in (*node.input, *node.output)} | {i.name for i in graph.initializer}
        for wanted, have in zip(output_names, current):
            if wanted != have and wanted in used:
                # an internal value already carries the name we want: move it aside first
                rename_value(graph, wanted, f"{wanted}__internal")
        for wanted, have in zip(output_names, [o.name for o in graph.output]):
            if wanted != have:
                rename_value(graph, have, wanted)
    model = onnx.shape_inference.infer_shapes(model)
    target = dest or path
    weights = sum(len(t.raw_data) for t in graph.initializer)
    if target.exists() and target != path:
        target.unlink()
    onnx.save_model(model, str(target), save_as_external_data=weights > EXTERNAL_DATA_THRESHOLD,
                    location=target.name + ".data", all_tensors_to_one_file=True)
    onnx.checker.check_model(str(target), full_check=True)
    return next((op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), 0)


def run(ctx: BuildContext) -> StageResult:
    if not ctx.wants("onnx"):
        return StageResult.skipped(STAGE, "variant onnx not requested")
    return make_onnx(ctx)
