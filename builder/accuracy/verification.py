"""One variant judged against the reference: stage verify runs it on every variant, and the stages
that derive a variant from another (stages/common.py check_base) run it on the base first, so that
nothing is made from a base that failed. It lives outside builder/stages because stages never import
each other; what it needs of them (the context, the variant) is in stages/base.py.

Usage::

    failures = verify_variant(ctx, variant)     # [] or one line per failing output, with its numbers
    verify_one(ctx, variant)                    # the same, recorded: variant.verified / .rejected, progress
    precision, why = judged_precision(ctx, variant)

A variant is judged on every reference case at its precision's tolerance (the model's own where that
is looser: judged_precision) and, with data.validation, on every validation sample. A failure names
the cases it fails on, with their sizes: a variant wrong on the data differs from one that differs
only at the generated sizes the data never had. A variant derived from a base (variant.base: INT8 from
onnx or onnx_opt...) also records its error relative to that base (verification["vs_base"]), so an
export error is never hidden inside a quantisation budget.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from builder.accuracy.task_metrics import METRIC_NUMBERS, TOLERANCE_KEYS as TASK_TOLERANCE_KEYS, on_cases
from builder.accuracy.tensors import (UNMEASURED, beyond_the_cases, class_id_outputs, compare_outputs,
                                      merge_case_metrics, tolerance_failures, top1_accuracy, worst_metric)
from builder.model.runtime import open_runner, tensorrt_unavailable_reason
from builder.repository.runtime_gate import limit_failures
from builder.repository.triton_releases import libtorch_failure, onnx_runtime_for, triton_release
from builder.stages.base import BuildContext, Variant


def accuracy_drop_failure(accuracy: dict[str, Any] | None, limit: float) -> str:
    """The accuracy constraint, in one place: why the task-metric drop is over ``limit`` ("" when it is
    within it, or when no drop was measured)."""
    drop = (accuracy or {}).get("drop")
    if drop is None or drop <= limit:
        return ""
    return f"drop {drop:.2f} points > {limit} allowed"



# the tolerances from tightest to loosest: a variant is judged at its own precision's, or at the model's
# own when that is looser (an export adds no approximation, but cannot be closer than the model's rounding)
LOOSENESS = ("fp32", "fp16", "int8")
HALF_DTYPES = ("float16", "bfloat16")


def model_half_dtypes(ctx: "BuildContext") -> list[str]:
    """Where the model computes in half precision: its floating-point parameters and buffers (a torch
    or TorchScript model; an ONNX source's weights) and its outputs, as 'parameters float16',
    'output y float16'. Inputs do not count: every variant gets the same rounded input."""
    found: list[str] = []
    if callable(getattr(ctx.model, "parameters", None)):
        dtypes = {str(t.dtype).removeprefix("torch.") for t in [*ctx.model.parameters(), *ctx.model.buffers()]}
        found += [f"parameters {d}" for d in HALF_DTYPES if d in dtypes]
    elif ctx.spec.source.kind == "onnx":
        import onnx

        kinds = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"}
        graph = onnx.load(str(ctx.spec.source.path), load_external_data=False).graph
        dtypes = {kinds.get(t.data_type) for t in graph.initializer}
        found += [f"weights {d}" for d in HALF_DTYPES if d in dtypes]
    outputs = ctx.reference.output_dtypes if ctx.reference else {}
    return found + [f"output {name} {dtype}" for name, dtype in outputs.items() if dtype in HALF_DTYPES]


def judged_precision(ctx: "BuildContext", variant: "Variant") -> tuple[str, str]:
    """The precision whose tolerance ``variant`` is judged by, and why when it is not the variant's own:
    an fp32 export of a float16/bfloat16 model differs from the eager model by half-precision rounding
    (rel L2 ~1e-3), so holding it to the fp32 tolerance rejects a faithful export while an INT8 variant
    that quantised nothing passes at the INT8 one."""
    own = variant.precision
    if own not in LOOSENESS or LOOSENESS.index(own) >= LOOSENESS.index("fp16"):
        return own, ""
    half = model_half_dtypes(ctx)
    if not half and variant.computes_in in ("fp16", "bf16"):
        return "fp16", (f"judged at the fp16 tolerance, not {own}'s: served by Triton's openvino backend, which has "
                        f"no f32 setting, the CPU plugin computes it in {variant.computes_in} on this CPU (its default "
                        "here), so that is what was verified and measured")
    if not half:
        return own, ""
    return "fp16", (f"judged at the fp16 tolerance, not {own}'s: the model itself computes in half precision "
                    f"({', '.join(half[:4])}), so no export of it can be closer than half-precision rounding")


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
    if variant.precision == "fp32":
        variant.case_outputs = own
    _vs_base(ctx, variant, own)
    if variant.verified_by == "task_accuracy":
        failures = _task_accuracy_only(ctx, variant, own, metrics)
    else:  # a task metric's thresholds hold on data.validation; the cases show the same function (on_cases)
        failures = tolerance_failures(metrics, on_cases(tolerance))
        failures += _failing_cases(ctx, variant, per_case, on_cases(tolerance)) if failures else []

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


def _failing_cases(ctx: BuildContext, variant: Variant, per_case: list[dict], tolerance: dict) -> list[str]:
    """One line naming the cases the variant fails on, with their sizes, and whether the data.validation
    cases pass: "wrong on real data" and "differs on shapes the data never had" call for different fixes."""
    failing = []
    for case, metrics in zip(ctx.reference.cases, per_case):
        # one case's output may be constant (a single sample): not a failure of the variant's
        judged = {n: {k: v for k, v in m.items() if k not in ("ref_min", "ref_max")} for n, m in metrics.items()}
        if tolerance_failures(judged, tolerance):
            failing.append(case)
    if not failing:
        return []
    variant.verification["failing_cases"] = [
        {"id": c["id"], "shapes": {k: list(np.shape(a)) for k, a in c["inputs"].items()}} for c in failing]
    named = ", ".join(f"{c['id']} (" + ", ".join(f"{k} {list(np.shape(a))}" for k, a in c["inputs"].items()) + ")"
                      for c in failing[:6]) + (f" and {len(failing) - 6} more" if len(failing) > 6 else "")
    validation = [c["id"] for c in ctx.reference.cases if c["id"].startswith("val")]
    if validation and not any(c["id"].startswith("val") for c in failing):
        return [f"cases: fails only on generated cases {named}; it passes on the data.validation cases "
                f"({', '.join(validation)}): it differs at sizes or values the data never had (give verify.dynamic_sizes "
                "or inputs[].values / kind when those are not inputs the model gets)"]
    return [f"cases: fails on {named}"]


def _vs_base(ctx: BuildContext, variant: Variant, own: list[dict]) -> None:
    """A derived variant's error relative to its base (INT8 vs the FP32 graph it was quantized from), beside
    its error vs the reference: what the derivation itself lost, never hidden inside its tolerance."""
    base = next((v for v in ctx.variants if v.name == variant.base), None) if variant.base else None
    if base is None or base.case_outputs is None or len(base.case_outputs) != len(own):
        return
    metrics = merge_case_metrics([compare_outputs(b, o) for b, o in zip(base.case_outputs, own)])
    variant.verification["vs_base"] = {"base": base.name, "rel_l2": {n: m.get("rel_l2") for n, m in metrics.items()},
                                       "cosine": {n: m.get("cosine") for n, m in metrics.items()},
                                       "worst_rel_l2": worst_metric(metrics)}
    if variant.verification["vs_base"]["worst_rel_l2"] is not None:
        variant.notes.append(f"vs its base {base.name}: rel L2 {variant.verification['vs_base']['worst_rel_l2']:.1e} "
                             f"(vs the reference: {worst_metric(variant.verification['metrics']) or 0:.1e})")


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


def verify_one(ctx: BuildContext, variant: Variant) -> list[str]:
    """Verify ``variant`` and record the verdict on it (verified, rejected) and in the progress; returns
    its failures ([] when it passed). A plan where TensorRT cannot run here is rejected, never passed."""
    why_not = tensorrt_unavailable_reason() if variant.format == "plan" else ""
    if why_not:
        # the tensorrt stage only makes plans where they can run: this is a plan from elsewhere
        variant.verified = False
        variant.rejected = f"cannot verify the TensorRT plan here: {why_not}"
        return [variant.rejected]
    ctx.progress(f"  verifying {variant.name} ...")
    failures = verify_variant(ctx, variant)
    variant.verified = not failures
    if failures:
        variant.rejected = "failed verification:\n" + "\n".join(f"- {f}" for f in failures)
        ctx.progress(f"  {variant.name} FAILED verification:\n" + "\n".join(f"    - {f}" for f in failures))
    return failures
