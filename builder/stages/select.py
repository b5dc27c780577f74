"""Stage `select`: choose the variant to publish as `<name>`.

With measurements (stage `benchmark`), the objective decides: highest throughput (default) or
lowest p50 latency at batch 1, among variants that passed verification and the accuracy
constraint. Without measurements, a fixed preference per target applies and says so.
"""

from __future__ import annotations

from builder.stages.base import BuildContext, StageResult

STAGE = "select"

# used only when nothing was measured
PREFERENCE = {
    "embedded": ["onnx", "torchscript"],
    "cpu": ["onnx", "torchscript"],
    "gpu": ["tensorrt_fp16", "onnx_fp16", "onnx", "torchscript"],
}


def _score(variant, objective: str) -> float | None:
    bench = variant.benchmark or {}
    if objective == "latency":
        p50 = bench.get("latency_ms_b1", {}).get("p50")
        return -p50 if p50 else None
    return bench.get("best_throughput")


def run(ctx: BuildContext) -> StageResult:
    eligible = [v for v in ctx.variants if v.eligible]
    for v in ctx.variants:
        if not v.eligible:
            v.selection_reason = v.rejected.splitlines()[0] if v.rejected else "not verified"
    if not eligible:
        return StageResult.fail(STAGE, "no variant is eligible: every one failed verification or a constraint")
    objective = ctx.spec.objective
    scored = [(v, _score(v, objective)) for v in eligible]
    measured = [(v, s) for v, s in scored if s is not None]
    if measured:
        winner, best = max(measured, key=lambda item: item[1])
        unit = "inferences/s" if objective == "throughput" else "ms p50 at batch 1"
        for v, s in measured:
            shown = s if objective == "throughput" else -s
            v.selection_reason = (f"selected: best {objective} ({shown:.4g} {unit})" if v is winner else
                                  f"lost on {objective}: {shown:.4g} vs {(best if objective == 'throughput' else -best):.4g} {unit}")
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
    return StageResult.ok(STAGE, f"{winner.name} ({how})", selected=winner.name)
