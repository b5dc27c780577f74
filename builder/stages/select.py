"""Stage `select`: choose the variant to publish as `<name>`.

With measurements (stage `benchmark`), the objective decides: highest throughput (default) or
lowest p50 latency at batch 1, among variants that passed verification (per-precision tolerance)
and the accuracy constraint (drop <= verify.max_accuracy_drop); a variant further from the reference
(INT8 next to FP32) must beat a closer one by more than the measurement noise, else the closer one is
published (builder/model/objective.py ``prefer_accurate``). Every variant gets the reason it won
or lost, with the numbers. Without measurements, a fixed preference per target applies and says so.
A text pipeline's variants are ranked by the throughput their serving layout can reach: texts of different
lengths batch only where the model step takes ragged batches (an ONNX graph on onnxruntime's backend) or where
length buckets pay for their padding, else it runs batch 1 (builder/huggingface/ragged.py served_text_rate).
Objective ``tradeoff`` (spec ``objective: {alpha: .., beta: .., gamma: ..}``) picks the highest
J = alpha*accuracy - beta*p50 latency (ms) - gamma*memory (MB) (see ``tradeoff``); the report shows J.

A base export that was built only because a derived variant needs it (e.g. ``onnx`` for
``onnx_int8_static``) is verified and measured, but never published.
"""

from __future__ import annotations

from builder.accuracy.tensors import worst_metric
from builder.accuracy.verification import accuracy_drop_failure
from builder.huggingface.ragged import served_text_rate, takes_ragged
from builder.model.measure import human
from builder.model.objective import NOISE, prefer_accurate, speed, tradeoff_terms
from builder.repository.config import backend_for
from builder.stages.base import BuildContext, StageResult, Variant

STAGE = "select"

# used only when nothing was measured
PREFERENCE = {
    "python": ["onnx", "torchscript"],
    "cpu": ["onnx", "torchscript"],
    "gpu": ["tensorrt_fp16", "onnx_fp16", "onnx", "torchscript"],
}


def tradeoff(variant: Variant, weights: dict[str, float]) -> dict[str, float] | None:
    """J = alpha * accuracy - beta * latency - gamma * memory, with its terms (None: not measured);
    builder/model/objective.py defines the terms (`triton-builder select` ranks by the same J)."""
    bench = variant.benchmark or {}
    return tradeoff_terms(variant.accuracy, (bench.get("latency_ms_b1") or {}).get("p50"),
                          bench.get("peak_memory_mb"), weights)


def _throughput(bench: dict) -> float | None:
    """What the throughput objective ranks: the best batch's, or for a text pipeline what serving can reach."""
    return bench.get("served_throughput", bench.get("best_throughput"))


def _score(variant, objective: str) -> float | None:
    bench = variant.benchmark or {}
    if objective == "tradeoff":
        return (bench.get("tradeoff") or {}).get("J")
    if objective == "latency":
        p50 = bench.get("latency_ms_b1", {}).get("p50")
        return -p50 if p50 else None
    return _throughput(bench)


def _served_text_rates(ctx: BuildContext) -> None:
    """A text pipeline's model step batches texts of different lengths only with ragged batches (an ONNX graph on
    onnxruntime's backend) or length buckets: each measured variant is ranked by the throughput its serving layout
    can reach (builder/huggingface/ragged.py served_text_rate), not by a batch Triton would never form for it."""
    pipeline = ctx.pipeline
    if pipeline is None or pipeline.images or not pipeline.token_lengths:
        return
    names = [t.name for t in ctx.spec.inputs]
    for v in ctx.variants:
        if v.benchmark and v.benchmark.get("best_throughput"):
            ragged = takes_ragged(v.format, backend_for(ctx.target, v.format), pipeline.tags_tokens, names,
                                  ctx.spec.deploy.ragged_batching, v.opset)
            v.benchmark["served_throughput"], v.benchmark["served_how"] = served_text_rate(
                v.benchmark, ragged, pipeline.token_lengths, pipeline.length_buckets)


def worst_rel_l2(variant) -> float | None:
    """The variant's largest rel L2 over its outputs against the reference (None: verified by task accuracy)."""
    if variant.verified_by != "reference":
        return None
    return worst_metric((variant.verification or {}).get("metrics") or {})


def _error_text(variant) -> str:
    error = worst_rel_l2(variant)
    return "-" if error is None else f"{error:.1e}"


def _mark_constraints(ctx: BuildContext) -> None:
    """Base-only exports and variants over the accuracy-drop limit are not eligible."""
    for base, derived in ctx.base_only.items():
        variant = ctx.variant(base)
        if variant is not None and not variant.rejected:
            variant.rejected = f"not requested; base for {', '.join(derived)}"
    # verify enforces the same constraint (stages/common.py); this covers variants verified elsewhere
    for v in ctx.variants:
        over = accuracy_drop_failure(v.accuracy, ctx.spec.verify.max_accuracy_drop)
        if v.verified and not v.rejected and over:
            v.rejected = f"accuracy {over}"


def _measured_text(v: Variant, objective: str) -> str:
    bench = v.benchmark or {}
    if objective == "tradeoff":
        t = bench["tradeoff"]
        return (f"J {t['J']:.3f} = {t['alpha']:g}*{t['accuracy']:.2f} accuracy - {t['beta']:g}*{t['latency_ms']:.3f} "
                f"ms - {t['gamma']:g}*{t['memory_mb']:.1f} MB")
    if objective == "latency":
        return f"p50 {bench['latency_ms_b1']['p50']:.3f} ms at batch 1"
    if bench.get("served_how"):
        return f"{human(bench['served_throughput'])} inf/s {bench['served_how']}"
    return f"{human(bench['best_throughput'])} inf/s at batch {bench.get('best_batch')}"


def _versus(v: Variant, other: Variant, objective: str) -> tuple[float, str]:
    """(how many times slower v is than other, 'measured X vs Y unit')."""
    a, b = v.benchmark or {}, other.benchmark or {}
    if objective == "latency":
        x, y = a["latency_ms_b1"]["p50"], b["latency_ms_b1"]["p50"]
        return x / y, f"p50 {x:.3f} vs {y:.3f} ms at batch 1"
    x, y = _throughput(a), _throughput(b)
    return y / x, f"measured {human(x)} vs {human(y)} inf/s{' as served' if a.get('served_how') else ''}"


def _times(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio < 1.1 else f"{ratio:.1f}x"


def run(ctx: BuildContext) -> StageResult:
    _mark_constraints(ctx)
    objective = ctx.spec.objective
    if objective == "throughput":
        _served_text_rates(ctx)
    if objective == "tradeoff":
        for v in ctx.variants:
            terms = tradeoff(v, ctx.spec.tradeoff)
            if terms is not None:
                v.benchmark["tradeoff"] = terms
    eligible = [v for v in ctx.variants if v.eligible]
    for v in ctx.variants:
        if not v.eligible:
            v.selection_reason = "rejected: " + (v.rejected.splitlines()[0].rstrip(":") if v.rejected
                                                 else "not verified")
    if not eligible:
        return StageResult.fail(STAGE, "no variant is eligible: every one failed verification or a constraint")
    measured = [v for v in eligible if _score(v, objective) is not None]
    on_cpu = [v for v in measured if v.benchmark.get("device", "cpu") == "cpu"]
    if len(on_cpu) < len(measured):  # GPU figures and CPU figures measure different machines: rank the GPU's
        measured = [v for v in measured if v not in on_cpu]
    else:
        on_cpu = []
    if measured:
        winner, tie_rule = max(measured, key=lambda v: _score(v, objective)), None
        if objective != "tradeoff":  # J weighs accuracy itself
            speeds = {v.name: speed(objective, _throughput(v.benchmark),
                                    (v.benchmark.get("latency_ms_b1") or {}).get("p50")) for v in measured}
            choice = prefer_accurate(speeds, {v.name: worst_rel_l2(v) for v in measured})
            winner, tie_rule = next(v for v in measured if v.name == choice.name), choice.why
        _explain_measured(ctx, winner, measured, objective, tie_rule)
        for v in eligible:
            if v in on_cpu:
                v.selection_reason = ("not ranked: measured on this machine's CPU, the others on its GPU "
                                      f"({_measured_text(v, objective)} on the CPU)")
            elif v not in measured:
                v.selection_reason = "not measured (see stage benchmark): not comparable"
        how = f"objective {objective}, measured"
    else:
        order = PREFERENCE.get(ctx.target, PREFERENCE["cpu"])
        ranked = sorted(eligible, key=lambda v: order.index(v.name) if v.name in order else len(order))
        winner = ranked[0]
        for v in eligible:
            v.selection_reason = ("selected: first eligible in the target's preference order "
                                  f"({' > '.join(order)}; nothing was measured)" if v is winner
                                  else f"eligible, ranked after {winner.name} (not measured)")
        how = f"preference order for target {ctx.target} (nothing measured)"
    winner.selected = True
    ctx.selected = winner
    return StageResult.ok(STAGE, f"{winner.name} ({how}): {winner.selection_reason}", selected=winner.name,
                          reasons={v.name: v.selection_reason for v in ctx.variants})


def _explain_measured(ctx: BuildContext, winner: Variant, measured: list[Variant], objective: str,
                      tie_rule: str | None = None) -> None:
    """Every measured variant's reason; ``tie_rule``: why faster variants further from the reference lost."""
    if objective == "tradeoff":
        return _explain_tradeoff(winner, measured)
    best = "highest throughput" if objective == "throughput" else "lowest p50 latency"
    reason = f"selected: {tie_rule or best}{'; measured' if tie_rule else ''} ({_measured_text(winner, objective)})"
    plain = ctx.variant("onnx")
    if (plain is not None and plain is not winner and plain.benchmark and objective == "throughput"
            and plain.benchmark.get("device", "cpu") == winner.benchmark.get("device", "cpu")):
        ratio = _throughput(winner.benchmark) / _throughput(plain.benchmark)
        reason += f"; {_times(ratio)} the throughput of onnx"
    others = sorted((v for v in measured if v is not winner), key=lambda v: -_score(v, objective))
    slower = [v for v in others if _versus(v, winner, objective)[0] >= 1]  # not one passed over for accuracy
    if slower:
        ratio, _ = _versus(slower[0], winner, objective)
        if ratio - 1 < NOISE:
            reason += f"; runner-up {slower[0].name} within {100 * (ratio - 1):.1f}% (inside measurement noise)"
    drop = (winner.accuracy or {}).get("drop")
    if drop is not None:
        reason += f"; accuracy drop {drop:+.2f} points (limit {ctx.spec.verify.max_accuracy_drop})"
    winner.selection_reason = reason
    for v in others:
        ratio, numbers = _versus(v, winner, objective)
        if ratio >= 1:
            v.selection_reason = f"rejected: {_times(ratio)} slower than {winner.name} ({numbers})"
        else:  # faster, but lost to the tie rule
            v.selection_reason = (f"rejected: only {_times(1 / ratio)} faster than {winner.name} ({numbers}), inside "
                                  f"measurement noise, for rel L2 {_error_text(v)} vs {_error_text(winner)}")
    # measured but not eligible (base-only exports): keep why, add the numbers for comparison
    for v in ctx.variants:
        if not v.eligible and v.verified and _score(v, objective) is not None:
            ratio, numbers = _versus(v, winner, objective)
            v.selection_reason += f" ({numbers} of {winner.name})"


def _explain_tradeoff(winner: Variant, measured: list[Variant]) -> None:
    """Objective tradeoff: the highest J wins; every other variant gets its J and the gap."""
    winner.selection_reason = f"selected: highest J ({_measured_text(winner, 'tradeoff')})"
    best = _score(winner, "tradeoff")
    for v in measured:
        if v is not winner:
            v.selection_reason = (f"rejected: J {_score(v, 'tradeoff'):.3f} < {best:.3f} of {winner.name} "
                                  f"({_measured_text(v, 'tradeoff')})")
