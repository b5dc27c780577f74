"""Stage `export_onnx`: the dynamo exporter by default, the legacy (TorchScript-based) exporter as a
fallback when it fails; which one ran and why is recorded. The batch axis and every -1 dim are
exported dynamic; outputs are renamed to the spec's names; onnx.checker and shape inference run;
large weights go to ``model.onnx.data`` beside the model. The legacy exporter TRACES: whatever made it
the one used (the spec, or a dynamo failure), a trace that froze control flow on the input values
(builder/optimise/trace_safety.py) is refused when no verification case can show that (``_unseen_by_the_cases``)."""

from __future__ import annotations

import re
import shutil
import warnings
from pathlib import Path

from builder.accuracy.tensors import compare_outputs, merge_case_metrics, tolerance_failures
from builder.accuracy.verification import judged_precision
from builder.model.runtime import open_runner
from builder.model.variants import register_variant
from builder.optimise.onnx_tools import copy_with_external_data
from builder.optimise.trace_safety import froze_text, frozen_conversions
from builder.stages.base import BuildContext, StageResult, Variant
from builder.stages.common import (example_args, export_dynamo, export_legacy, finalize_onnx, finish_export, not_made,
                                   stop_if_work_folder_refused)

STAGE = "export_onnx"
#: a variant note with this prefix is a hint shown with the variant's verification failure (builder/pipeline.py)
IF_UNVERIFIED = "if verification fails: "


@register_variant("onnx", format="onnx", precision="fp32", stage=STAGE,
                  description="ONNX FP32 (dynamo exporter, legacy fallback)")
def make_onnx(ctx: BuildContext) -> StageResult:
    spec = ctx.spec
    out_dir = ctx.workdir / "onnx"
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / "model.onnx"
    if spec.source.kind == "onnx":
        # its external data, wherever the source keeps it, becomes model.onnx.data: what publish carries
        copy_with_external_data(spec.source.path, final)
        try:
            opset = finalize_onnx(final, [o.name for o in spec.outputs], rename=False)
        except Exception as exc:  # noqa: BLE001 - a model onnx cannot check is a lost variant, not a crash
            stop_if_work_folder_refused(exc, ctx.workdir)
            why = f"the source ONNX {spec.source.path.name} fails onnx's checker or shape inference: {_clean(exc)}"
            not_made(ctx, "onnx", why)
            return StageResult.fail(STAGE, why)
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
    exporter, frozen = None, []
    for name in order:
        try:
            with warnings.catch_warnings(record=True) as caught:
                # recorded, not printed: the legacy trace's TracerWarnings show control flow it froze
                warnings.simplefilter("always")
                (export_dynamo if name == "dynamo" else export_legacy)(ctx.model, ctx.spec, raw)
            # finalizing is part of the attempt: an export the checker or onnxruntime refuses is one more
            # failed exporter (the next one is tried), never a crashed build
            opset = finish_export(name, spec, raw, final)
            if name == "legacy":  # the dynamo exporter refuses data-dependent control flow itself
                # the watched re-trace runs only where this trace warned of a tensor -> Python conversion
                frozen = frozen_conversions(ctx.model, example_args(spec), caught)
                if frozen and _unseen_by_the_cases(ctx, final):
                    attempts[name] = _refusal(frozen, attempts.get("dynamo"))
                    continue
            symbolic = mark_symbolic_output_dims(ctx, final)
            exporter = name
            break
        except Exception as exc:  # noqa: BLE001 - exporter failures are recorded, then we fall back
            stop_if_work_folder_refused(exc, ctx.workdir)  # a full $TMPDIR fails every exporter alike
            attempts[name] = _clean(exc)
    if exporter is None:
        why = "every ONNX exporter failed: " + "; ".join(f"{k}: {v}" for k, v in attempts.items())
        not_made(ctx, "onnx", why)  # the summary table lists it, as it lists the variants derived from it
        return StageResult.fail(STAGE, why, attempts=attempts)
    variant = Variant("onnx", "onnx", "fp32", final, exporter=exporter, opset=opset)
    if "dynamo" in attempts and exporter == "legacy":
        variant.notes.append(f"dynamo exporter failed, used legacy: {attempts['dynamo']}")
        variant.notes.append(f"{IF_UNVERIFIED}the legacy exporter TRACES the model, so Python control flow on "
                             "input values or sizes (a loop, a branch) is frozen at the export example; add "
                             "torchscript to variants (scripted when its trace is unsafe) or write that control "
                             "flow with tensor ops (masks, torch.where)")
    if frozen:  # the cases do take another path: verification fails it, and this says where and why
        variant.notes.append(f"{IF_UNVERIFIED}the legacy exporter's trace {froze_text(frozen)}")
    ctx.add_variant(variant)
    shutil.rmtree(raw_dir, ignore_errors=True)
    return StageResult.ok(STAGE, f"exported with the {exporter} exporter, opset {opset}", exporter=exporter,
                          opset=opset, attempts=attempts, symbolic_output_dims=symbolic, frozen=frozen)


def _unseen_by_the_cases(ctx: BuildContext, path: Path) -> bool:
    """Whether the export agrees with the reference on every verification case: then the control flow
    its trace froze is never exercised by verification, which would publish it (where a case does take
    another path, verification rejects it with its own numbers, and the variant is left to it)."""

    spec = ctx.spec
    try:
        run = open_runner("onnx", path, [o.name for o in spec.outputs])
        metrics = merge_case_metrics([compare_outputs(ref, run(case["inputs"]))
                                      for case, ref in zip(ctx.reference.cases, ctx.reference.outputs)])
    except Exception:  # noqa: BLE001 - an export that fails on a case fails verification there
        return False
    # the tolerance verify will hold it to: an fp16 model's export, judged at fp32, would fail on rounding
    # alone and so pass this probe, to be published by verify at the fp16 tolerance with its branch frozen
    precision, _ = judged_precision(ctx, Variant("onnx", "onnx", "fp32", path))
    return not tolerance_failures(metrics, spec.verify.tolerance(precision))


def _refusal(frozen: list[str], dynamo: str | None) -> str:
    """Why a legacy export whose trace froze ``frozen`` is not made; ``dynamo``: how the dynamo
    exporter failed, None where it was not tried (the spec asked for the legacy one)."""
    if dynamo is None:  # torch.cond cannot help a legacy-only build until the spec lets dynamo try
        cause = " (onnx.exporter: legacy, so only the legacy exporter was tried)"
        ops = "(torch.where(cond, a, b), which a trace keeps; torch.cond with onnx.exporter: auto)"
    else:
        guard = "GuardOnDataDependentSymNode" in dynamo or "data-dependent" in dynamo
        cause = " (the dynamo exporter cannot guard on a data-dependent value)" if guard else ""
        ops = "(torch.where(cond, a, b), or torch.cond) so the dynamo exporter takes it"
    return (f"refused: the model has data-dependent control flow{cause}, and the legacy exporter's trace "
            f"{froze_text(frozen)}; every verification case takes the example's path, so this ONNX would pass "
            f"verification and be wrong where an input takes another; fix: write that branch with tensor ops "
            f"{ops}, or serve the torchscript variant (scripted when its trace is unsafe)")


def _clean(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    # torch.export's message opens with generic next steps; the cause follows "Exception summary"
    text = text.split("## Exception summary", 1)[-1].strip()
    return re.sub(r"\x1b\[[0-9;]*m", "", text)[:400] or type(exc).__name__


def mark_symbolic_output_dims(ctx: BuildContext, path: Path) -> dict[str, list[int]]:
    """Per-sample output dims the exported graph leaves symbolic (a data-dependent length, e.g. the
    rows of ``x[mask]``) become -1 in the signature the config is made from, even where every reference
    run happened to give the same length. Outputs whose shape the spec states are left as stated.
    The other way round - a dim the graph declares fixed while the reference runs vary it (the dynamo
    exporter declares nn.LSTM/GRU outputs at the trace example's sequence length) - the file's
    declaration is made symbolic, so the ONNX file, its metadata and the config agree."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    stated = {o.name for o in ctx.spec.outputs if o.shape}
    changed: dict[str, list[int]] = {}
    corrected = False
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
        for i, (dim, value) in enumerate(zip(dims, current)):
            if value == -1 and dim.HasField("dim_value"):  # declared fixed, varies in the reference runs
                dim.dim_param = f"{output.name}_dim{i}"  # (dynamo on nn.LSTM/GRU: the example's length)
                corrected = True
    if corrected:  # the file's declared outputs must agree with the config (a native backend checks them)
        onnx.save(model, str(path))
    return changed


def run(ctx: BuildContext) -> StageResult:
    if not ctx.wants("onnx"):
        return StageResult.skipped(STAGE, "variant onnx not requested")
    return make_onnx(ctx)
