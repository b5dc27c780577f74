"""Stage `verify`: every variant against the reference, on every case, with the per-precision
tolerance; with labelled validation data also the top-1 accuracy and its drop. A variant that fails
is never published; the reason lists every failing output with its numbers. TensorRT plans run on
the GPU through builder.model.runtime's plan runner; where that cannot run, a plan is rejected, never
passed unchecked. A variant must also load on the Triton release it is built for (``build
--triton-release``, default the newest in builder/repository/triton_releases.py): an ONNX IR version or
opset beyond that release's onnxruntime, or a TorchScript saved by a torch newer than its libtorch
(Triton's own pytorch backend, targets cpu/gpu), is rejected here, with the fix, before anything is
published. The judgement itself is builder/accuracy/verification.py's (the stages that derive a variant use it
on the base first)."""

from __future__ import annotations

from builder.accuracy.verification import verify_one
from builder.stages.base import BuildContext, StageResult

STAGE = "verify"


def run(ctx: BuildContext) -> StageResult:
    if not ctx.variants:
        return StageResult.fail(STAGE, "no variant was produced to verify")
    report = {}
    for variant in ctx.variants:
        if variant.verified is not None:  # verified already, as the base of a derived variant (check_base)
            report[variant.name] = "passed" if variant.verified else [
                line.removeprefix("- ") for line in variant.rejected.splitlines()[1:]] or [variant.rejected]
            continue
        failures = verify_one(ctx, variant)
        report[variant.name] = "passed" if not failures else failures
    passed = [v.name for v in ctx.variants if v.verified]
    if not passed:
        return StageResult.fail(STAGE, "no variant passed verification", results=report)
    return StageResult.ok(STAGE, f"passed: {', '.join(passed)}", results=report)
