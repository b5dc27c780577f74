"""Stage `export_torchscript`: trace AND script the model; ship the trace only when it is safe.

A trace freezes Python control flow at the example it saw. Both exports are run on probe inputs
that differ from the trace example (other batch sizes, values and dynamic sizes, and the negated
example); a trace that disagrees with the eager model there is *trace-unsafe* and is not shipped.
"""

from __future__ import annotations

import shutil
import warnings

import numpy as np

from builder.stages.base import BuildContext, StageResult, Variant
from builder.tensors import compare_outputs, merge_case_metrics, tolerance_failures, trace_example
from builder.runtime import torch_runner
from builder.variants import register_variant

STAGE = "export_torchscript"


@register_variant("torchscript", format="torchscript", precision="fp32", stage=STAGE,
                  description="TorchScript (trace when trace-safe, else script) for the LibTorch backend")
def make_torchscript(ctx: BuildContext) -> StageResult:
    import torch

    spec = ctx.spec
    out_dir = ctx.workdir / "torchscript"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.pt"

    if spec.source.kind == "torchscript":
        shutil.copyfile(spec.source.path, path)
        ctx.add_variant(Variant("torchscript", "torchscript", "fp32", path, exporter="given"))
        return StageResult.ok(STAGE, "source is TorchScript: taken as it is", exporter="given")
    if spec.source.kind != "module":
        return StageResult.skipped(STAGE, f"source is {spec.source.kind}: no PyTorch module to export")

    names = [t.name for t in spec.inputs]
    outputs = [o.name for o in spec.outputs]
    example = trace_example(spec)
    example_args = tuple(torch.from_numpy(example[n]) for n in names)
    exports, errors = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            exports["trace"] = torch.jit.trace(ctx.model, example_args, check_trace=False, strict=False)
        except Exception as exc:  # noqa: BLE001 - any exporter failure is recorded, not fatal
            errors["trace"] = _first_line(exc)
        try:
            exports["script"] = torch.jit.script(ctx.model)
        except Exception as exc:  # noqa: BLE001
            errors["script"] = _first_line(exc)

    probes = [case["inputs"] for case in ctx.reference.cases]
    probe_refs = list(ctx.reference.outputs)
    negated = _negated(example, spec)
    if negated is not None:
        probes.append(negated)
        probe_refs.append(torch_runner(ctx.model, outputs, names)(negated))

    disagreement = {}
    for kind, module in exports.items():
        runner = torch_runner(module, outputs, names)
        try:
            metrics = merge_case_metrics([compare_outputs(ref, runner(inp)) for inp, ref in zip(probes, probe_refs)])
        except Exception as exc:  # noqa: BLE001 - e.g. a trace that baked in the example's shape
            disagreement[kind] = [f"fails on probe inputs: {_first_line(exc)}"]
            continue
        failing = tolerance_failures(metrics, spec.verify.tolerance("fp32"))
        if failing:
            disagreement[kind] = failing

    trace_unsafe = "trace" in exports and "trace" in disagreement
    if trace_unsafe:
        ctx.notes.append(
            "trace-unsafe: the traced TorchScript disagrees with the eager model on inputs other than the "
            "trace example (data-dependent control flow got frozen): "
            + "; ".join(disagreement["trace"]) + ". The traced model is not shipped."
        )
    if "trace" in exports and not trace_unsafe:
        chosen = "trace"
    elif "script" in exports and "script" not in disagreement:
        chosen = "script"
    else:
        reasons = {**errors, **{k: "; ".join(v) for k, v in disagreement.items()}}
        return StageResult.fail(STAGE, "no usable TorchScript export: "
                                + "; ".join(f"{k}: {v}" for k, v in reasons.items()),
                                trace_unsafe=trace_unsafe, errors=reasons)
    torch.jit.save(exports[chosen], str(path))
    variant = Variant("torchscript", "torchscript", "fp32", path, exporter=f"torch.jit.{chosen}")
    if trace_unsafe:
        variant.notes.append("trace-unsafe: shipping the scripted model")
    ctx.add_variant(variant)
    return StageResult.ok(STAGE, f"shipping torch.jit.{chosen}", exporter=chosen, trace_unsafe=trace_unsafe,
                          errors=errors, disagreement=disagreement)


def _negated(example: dict[str, np.ndarray], spec) -> dict[str, np.ndarray] | None:
    """The example with float inputs negated: flips the sign of any data-dependent test."""
    if not any(np.issubdtype(v.dtype, np.floating) for v in example.values()):
        return None
    return {t.name: (-example[t.name] if np.issubdtype(example[t.name].dtype, np.floating) else example[t.name])
            for t in spec.inputs}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def run(ctx: BuildContext) -> StageResult:
    if not ctx.wants("torchscript"):
        return StageResult.skipped(STAGE, "variant torchscript not requested")
    return make_torchscript(ctx)
