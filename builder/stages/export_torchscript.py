"""Stage `export_torchscript`: trace AND script the model; ship the trace only when it is safe.

A trace freezes Python control flow at the example it saw. Both exports are run on probe inputs
that differ from the trace example (other batch sizes, values and dynamic sizes, and the negated
example); a trace that disagrees with the eager model there is *trace-unsafe* and is not shipped.
A rare branch (``if x.abs().max() > 8:``) is never reached by the probes, so the tracer's own
warnings are read too: a trace that turned a tensor computed from the input VALUES into a Python
bool or number froze that control flow, and is trace-unsafe as well (builder/optimise/trace_safety.py).
"""

from __future__ import annotations

import shutil
import warnings

import numpy as np

from builder.accuracy.tensors import compare_outputs, merge_case_metrics, tolerance_failures, trace_example
from builder.model.runtime import torch_runner
from builder.model.variants import register_variant
from builder.optimise.trace_safety import froze_text, frozen_conversions
from builder.stages.base import BuildContext, StageResult, Variant

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
    if not spec.source.eager:
        return StageResult.skipped(STAGE, f"source is {spec.source.kind}: no PyTorch module to export")

    names = [t.name for t in spec.inputs]
    outputs = [o.name for o in spec.outputs]
    example = trace_example(spec)
    example_args = tuple(torch.from_numpy(example[n]) for n in names)
    exports, errors = {}, {}
    with warnings.catch_warnings(record=True) as caught:
        # recorded, not printed: the tracer's warnings are how a branch the probes never reach shows up
        warnings.simplefilter("always")
        try:
            with _full_fp32(torch):
                exports["trace"] = torch.jit.trace(ctx.model, example_args, check_trace=False, strict=False)
        except Exception as exc:  # noqa: BLE001 - any exporter failure is recorded, not fatal
            errors["trace"] = _first_line(exc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
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

    frozen = frozen_conversions(ctx.model, example_args, caught) if "trace" in exports else []
    trace_unsafe = "trace" in exports and ("trace" in disagreement or bool(frozen))
    if "trace" in exports and "trace" in disagreement:
        ctx.notes.append(
            "trace-unsafe: the traced TorchScript disagrees with the eager model on inputs other than the "
            "trace example (data-dependent control flow got frozen): "
            + "; ".join(disagreement["trace"]) + ". The traced model is not shipped."
        )
    froze = ""
    if frozen:
        unseen = "" if "trace" in disagreement else "; no verification case takes another path, so no probe shows it"
        froze = f"torch.jit.trace {froze_text(frozen)}{unseen}; fix: {_TORCHSCRIPT_FIX}"
        ctx.notes.append(f"trace-unsafe: {froze}. The traced model is not shipped.")
    if "trace" in exports and not trace_unsafe:
        chosen = "trace"
    elif "script" in exports and "script" not in disagreement:
        chosen = "script"
    else:
        # as for a trace the probes caught: a trace known to compute another function is never shipped
        reasons = {**errors, **{k: "; ".join(v) for k, v in disagreement.items()}}
        if froze:
            reasons["trace"] = "; ".join(filter(None, [reasons.get("trace", ""), froze]))
        return StageResult.fail(STAGE, "no usable TorchScript export: "
                                + "; ".join(f"{k}: {v}" for k, v in reasons.items()),
                                trace_unsafe=trace_unsafe, errors=reasons, frozen=frozen)
    torch.jit.save(exports[chosen], str(path))
    variant = Variant("torchscript", "torchscript", "fp32", path, exporter=f"torch.jit.{chosen}")
    if trace_unsafe:
        variant.notes.append("trace-unsafe: shipping the scripted model")
    ctx.add_variant(variant)
    why = f": the trace froze data-dependent control flow at {'; '.join(frozen)}" if frozen else ""
    return StageResult.ok(STAGE, f"shipping torch.jit.{chosen}{why}", exporter=chosen, trace_unsafe=trace_unsafe,
                          errors=errors, disagreement=disagreement, frozen=frozen)


_TORCHSCRIPT_FIX = ("make forward scriptable (torch.jit.script is shipped then), or write that branch with "
                    "tensor ops (torch.where(cond, a, b) instead of a Python if)")


def _negated(example: dict[str, np.ndarray], spec) -> dict[str, np.ndarray] | None:
    """The example with float inputs negated: flips the sign of any data-dependent test."""
    if not any(np.issubdtype(v.dtype, np.floating) for v in example.values()):
        return None
    return {t.name: (-example[t.name] if np.issubdtype(example[t.name].dtype, np.floating) else example[t.name])
            for t in spec.inputs}


def _full_fp32(torch):
    """A trace bakes cuDNN's allow_tf32 into every convolution: off, so the trace runs on a GPU in the FP32
    it was verified in (torch's default TF32 put convnet64 1.2e-4 off on an H100; fp32 tolerance 1e-5)."""
    cudnn = torch.backends.cudnn
    return cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic,
                       allow_tf32=False)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def run(ctx: BuildContext) -> StageResult:
    if not ctx.wants("torchscript"):
        return StageResult.skipped(STAGE, "variant torchscript not requested")
    return make_torchscript(ctx)
