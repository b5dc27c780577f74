"""Stage `verify`: every variant against the reference, on every case, with the per-precision
tolerance; with labelled validation data also the top-1 accuracy and its drop. A variant that fails
is never published; the reason lists every failing output with its numbers. TensorRT plans run on
the GPU through builder.runtime's plan runner; where that cannot run, a plan is rejected, never
passed unchecked. A variant must also load on the Triton release it is built for (``build
--triton-release``, default the newest in builder/repository/triton_releases.py): an ONNX IR version or
opset beyond that release's onnxruntime, or a TorchScript saved by a torch newer than its libtorch
(Triton's own pytorch backend, targets cpu/gpu), is rejected here, with the fix, before anything is
published."""

from __future__ import annotations

from builder.repository.runtime_gate import limit_failures
from builder.repository.triton_releases import libtorch_failure, onnx_runtime_for, triton_release
from builder.runtime import open_runner, tensorrt_unavailable_reason
from builder.stages.base import BuildContext, StageResult, Variant
from builder.stages.common import accuracy_drop_failure, judged_precision
from builder.task_metrics import METRIC_NUMBERS, TOLERANCE_KEYS as TASK_TOLERANCE_KEYS, on_cases
from builder.tensors import (UNMEASURED, beyond_the_cases, class_id_outputs, compare_outputs, merge_case_metrics,
                             tolerance_failures, top1_accuracy)

STAGE = "verify"


def release_failures(ctx: BuildContext, variant: Variant) -> list[str]:
    """What keeps a variant from loading on the build's Triton release (ONNX IR version and opset; the
    torch that saved a TorchScript for the libtorch backend)."""
    release = triton_release(ctx.options.triton_release)
    if variant.format == "torchscript" and ctx.target != "python":
        import torch

        too_new = libtorch_failure(torch.__version__, release)
        return [too_new] if too_new else []
    if variant.format != "onnx":
        return []
    backend = "python" if ctx.target == "python" else "onnxruntime"
    return limit_failures(variant.path, onnx_runtime_for(release, backend))


def verify_variant(ctx: BuildContext, variant: Variant) -> list[str]:
    spec = ctx.spec
    too_new = release_failures(ctx, variant)
    if too_new:
        return too_new
    outputs = [o.name for o in spec.outputs]
    try:
        run = open_runner(variant.format, variant.path, outputs, [t.name for t in spec.inputs])
    except Exception as exc:  # noqa: BLE001 - a runtime that cannot load this one variant rejects only it
        return [f"the variant could not be loaded to run: {' '.join(str(exc).split())[:300]}"]
    per_case, own = [], []
    for case, ref in zip(ctx.reference.cases, ctx.reference.outputs):
        try:
            own.append(run(case["inputs"]))
            per_case.append(compare_outputs(ref, own[-1]))
        except Exception as exc:  # noqa: BLE001 - a runtime failure on a case is a verification failure
            return [f"case {case['id']}: the variant failed to run: {' '.join(str(exc).split())[:300]}"]
    metrics = merge_case_metrics(per_case)
    precision, why = judged_precision(ctx, variant)
    tolerance = spec.verify.tolerance(precision)
    variant.verification = {"metrics": metrics, "tolerance": tolerance, "cases": len(per_case),
                            "reference": ctx.reference_kind, "verified_by": variant.verified_by}
    if why:
        variant.verification.update(tolerance_precision=precision, tolerance_reason=why)
        if why not in variant.notes:
            variant.notes.append(why)
            ctx.progress(f"  {variant.name}: {why}")
    if variant.verified_by == "task_accuracy":
        failures = _task_accuracy_only(ctx, variant, own, metrics)
    else:  # a task metric's thresholds hold on data.validation; the cases show the same function (on_cases)
        failures = tolerance_failures(metrics, on_cases(tolerance))

    ref = ctx.reference
    if ref.validation_inputs is not None:
        got = ref.run_validation(run, spec.max_batch_size)
        if variant.verified_by == "task_accuracy":
            variant.own_validation_outputs = got
        on_validation = compare_outputs(ref.validation_outputs, got)
        variant.accuracy = {"cosine_vs_reference": {name: m.get("cosine") for name, m in on_validation.items()}}
        samples = ref.validation_samples(spec.batching)
        variant.verification["validation"] = {"samples": samples, "rel_l2": {
            name: m.get("rel_l2") for name, m in on_validation.items()}}
        _note_task_metric(ctx, variant, on_validation, tolerance, samples)
        if variant.verified_by != "task_accuracy":
            failures += beyond_the_cases(on_validation, tolerance, failures, samples)
        elif ref.labels is not None:  # the untrained outputs on every sample too
            failures += _lines_of(beyond_the_cases(on_validation, spec.verify.tolerance("int8"), failures, samples),
                                  untrained_outputs(ctx))
        if ref.labels is not None:
            first = ref.top1_output  # the class ids or scores the labels fit (stage load)
            ref_top1 = top1_accuracy(ref.validation_outputs[first], ref.labels)
            var_top1 = top1_accuracy(got[first], ref.labels)
            drop = ref_top1 - var_top1
            variant.accuracy.update({"metric": "top1", "output": first, "reference": ref_top1,
                                     "variant": var_top1, "drop": drop})
            over = accuracy_drop_failure(variant.accuracy, spec.verify.max_accuracy_drop)
            if over:
                failures.append(f"{first}: top-1 accuracy {var_top1:.2f}% vs reference {ref_top1:.2f}%: {over}")
    return failures


def _note_task_metric(ctx: BuildContext, variant: Variant, metrics: dict, tolerance: dict, samples: int) -> None:
    """The task metric's numbers on the validation set (verify.metric other than rel_l2, lossy variants):
    recorded beside the verdict and said in the variant's notes, passing or not."""
    metric = ctx.spec.verify.metric
    if metric == "rel_l2" or not any(key in tolerance for key in TASK_TOLERANCE_KEYS):
        return
    numbers = {name: {k: m[k] for k in METRIC_NUMBERS[metric] if k in m} for name, m in metrics.items()
               if not m.get("integer")}
    variant.verification["task_metric"] = {"metric": metric, "samples": samples, "numbers": numbers,
                                           "limits": {k: tolerance[k] for k in TASK_TOLERANCE_KEYS if k in tolerance}}
    if metric == "embedding":
        said = "; ".join(f"{name}: per-sample cosine {n.get('row_cosine_min', float('nan')):.4f}, similarity-order "
                         f"Spearman {n.get('spearman', float('nan')):.4f}, top-5 neighbours kept "
                         f"{n.get('neighbours_kept', float('nan')):.3f}" for name, n in numbers.items())
    else:
        unit = "tokens" if metric == "token_classification" else "samples"
        said = "; ".join(f"{name}: labels kept on {n['label_agreement']:.2%} of the {unit}"
                         for name, n in numbers.items() if "label_agreement" in n)
    article = "an" if metric[0] in "aeiou" else "a"
    note = f"judged as {article} {metric.replace('_', ' ')} on {samples} validation samples (verify.metric): {said}"
    variant.notes.append(note)
    ctx.progress(f"  {variant.name}: {note}")


def _task_accuracy_only(ctx: BuildContext, variant: Variant, own: list[dict], metrics: dict) -> list[str]:
    """A variant that changes the function by design (stage compress) is held to the task accuracy
    below, not to closeness: its rel L2 vs the reference is recorded, not judged. But an output it no
    longer gives, gives in another shape (a pruned layer feeding a returned tensor: the config's dims
    no longer fit) or gives NaN/Inf for is a failure like any variant's. Its own outputs on the reference
    cases become its reference.npz, which the served gate (check) compares with."""
    variant.own_outputs = own
    variant.verification["tolerance_applies_to"] = "the served answers vs this variant's own outputs (reference.npz)"
    if ctx.reference.labels is None:
        return ["verified by task accuracy, which needs labelled validation data: data.validation with a "
                "'labels' array"]
    broken = {name: m for name, m in metrics.items() if set(UNMEASURED) & set(m)}
    failures = tolerance_failures(broken, {}) if broken else []
    # the outputs training did not aim at (an embedding beside the logits): the labels cannot vouch for
    # them, so closeness must, at the loosest tolerance the spec accepts for any variant (int8's)
    untrained = [n for n in untrained_outputs(ctx) if n not in broken]
    return failures + _lines_of(tolerance_failures(metrics, ctx.spec.verify.tolerance("int8")), untrained)


def untrained_outputs(ctx: BuildContext) -> list[str]:
    """The outputs a compressed variant was not trained on: all but the one the labels score and any integer
    output holding one class id per label (judged, like it, by the accuracy drop)."""
    ref = ctx.reference
    outputs = ref.validation_outputs if ref.validation_outputs is not None else (ref.outputs[0] if ref.outputs else {})
    class_ids = class_id_outputs(outputs, ref.labels)
    return [name for name in outputs if name != ref.top1_output and name not in class_ids]


def _lines_of(lines: list[str], names: list[str]) -> list[str]:
    return [line for line in lines if any(line.startswith(f"{name}: ") for name in names)]


def run(ctx: BuildContext) -> StageResult:
    if not ctx.variants:
        return StageResult.fail(STAGE, "no variant was produced to verify")
    report = {}
    for variant in ctx.variants:
        if variant.verified is not None:
            continue
        why_not = tensorrt_unavailable_reason() if variant.format == "plan" else ""
        if why_not:
            # the tensorrt stage only makes plans where they can run: this is a plan from elsewhere
            variant.verified = False
            variant.rejected = f"cannot verify the TensorRT plan here: {why_not}"
            report[variant.name] = variant.rejected
            continue
        ctx.progress(f"  verifying {variant.name} ...")
        failures = verify_variant(ctx, variant)
        variant.verified = not failures
        if failures:
            variant.rejected = "failed verification:\n" + "\n".join(f"- {f}" for f in failures)
            ctx.progress(f"  {variant.name} FAILED verification:\n" + "\n".join(f"    - {f}" for f in failures))
        report[variant.name] = "passed" if not failures else failures
    passed = [v.name for v in ctx.variants if v.verified]
    if not passed:
        return StageResult.fail(STAGE, "no variant passed verification", results=report)
    return StageResult.ok(STAGE, f"passed: {', '.join(passed)}", results=report)
