"""The bounded quantisation search: which static INT8 recipe to publish on THIS host.

A pure, injectable core (no onnxruntime, no clock of its own): the quantize stage supplies
``evaluate`` (quantise one candidate, verify it against the reference, measure it against FP32) and
``sensitivity`` (the output error when only one node is quantised); tests inject both.

1. ``search`` tries the candidates in order (the default recipe first) until the time budget is
   spent; every candidate gets a row (what changed, error, accuracy drop, speed vs FP32, verdict).
2. When none passes, ``fallback`` keeps the most sensitive nodes in FP32, one more at a time (most
   sensitive first), on the candidate with the smallest error, until the accuracy budget holds.
3. ``finalists`` (the fastest passing rows) are measured again side by side and ``rerank``ed; ``best``
   is the passing row with the smallest error within 10 % of the fastest; ``None`` when nothing
   passed, and ``summary`` says why.

Usage::

    rows = search(default_candidates(), evaluate, budget_seconds=120, clock=time.monotonic)
    if best(rows) is None:
        rows += fallback(closest(rows), node_names, sensitivity, evaluate, deadline, clock)
    print(format_table(rows)); winner = best(rows)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

PASS, FAIL, ERROR, OVER_BUDGET = "pass", "FAIL", "ERROR", "not tried (time budget spent)"
NOT_NEEDED = ("not tried (the default recipe and this host's priors settled it: a clear win over FP32, or INT8 "
              "stably slower than FP32 here)")


@dataclass(frozen=True)
class Candidate:
    """One static INT8 recipe (onnxruntime.quantization.quantize_static arguments)."""

    activation_type: str = "S8"  # S8 | U8
    weight_type: str = "S8"  # S8 | U8
    reduce_range: bool = False  # 7-bit weights: no u8 x s8 saturation without VNNI
    per_channel: bool = True
    quant_format: str = "QDQ"  # QDQ | QOperator | dynamic (quantize_dynamic: activations at run time)
    calibration: str = "minmax"  # minmax | entropy | percentile | none (dynamic)
    samples: int | None = None  # calibration samples (None: the spec's quantization.calibration_samples)
    op_types: tuple[str, ...] | None = None  # None: every op type onnxruntime quantises
    exclude: tuple[str, ...] = ()  # nodes kept in FP32

    @property
    def types(self) -> str:
        return f"{self.activation_type}{self.weight_type}"

    def label(self) -> str:
        parts = [self.quant_format, self.types, "per-channel" if self.per_channel else "per-tensor"]
        if self.quant_format != "dynamic":
            parts.append(self.calibration)
        if self.reduce_range:
            parts.append("reduce_range")
        if self.samples:
            parts.append(f"{self.samples} samples")
        if self.op_types:
            parts.append("ops " + "+".join(self.op_types))
        if self.exclude:
            parts.append(f"{len(self.exclude)} node(s) FP32")
        return ", ".join(parts)

    def changes(self, reference: "Candidate | None" = None) -> str:
        """What differs from ``reference`` (the default recipe), in words."""
        ref = reference or (DYNAMIC if self.quant_format == "dynamic" else Candidate())
        out = []
        if self.types != ref.types:
            out.append(f"types {ref.types} -> {self.types}")
        if self.reduce_range != ref.reduce_range:
            out.append(f"reduce_range {ref.reduce_range} -> {self.reduce_range}")
        if self.per_channel != ref.per_channel:
            out.append("per-tensor weights" if not self.per_channel else "per-channel weights")
        if self.quant_format != ref.quant_format:
            out.append(f"format {self.quant_format}")
        if self.calibration != ref.calibration:
            out.append(f"calibration {self.calibration}")
        if self.samples != ref.samples:
            out.append(f"{self.samples} calibration samples")
        if self.op_types != ref.op_types:
            out.append("only " + ", ".join(self.op_types or ()) + " quantised")
        if self.exclude != ref.exclude:
            out.append("FP32 kept for " + ", ".join(self.exclude))
        return "; ".join(out) or "default recipe"


DEFAULT = Candidate()
# onnxruntime's dynamic INT8 (the onnx_int8_dynamic default): u8 activations at run time, s8 weights
DYNAMIC = Candidate(activation_type="U8", weight_type="S8", per_channel=False, quant_format="dynamic",
                    calibration="none", op_types=("MatMul", "Gemm"))


def default_candidates(calibration_samples: int = 128) -> list[Candidate]:
    """The bounded list, default recipe first, then the changes most likely to fix an AVX2 host
    (reduce_range, U8U8: no u8 x s8 saturation), then per-tensor, QOperator, calibration methods,
    sample count and op types."""
    return [
        DEFAULT,
        replace(DEFAULT, reduce_range=True),
        replace(DEFAULT, activation_type="U8", weight_type="S8", reduce_range=True),
        replace(DEFAULT, activation_type="U8", weight_type="U8"),
        replace(DEFAULT, activation_type="U8", weight_type="S8"),
        replace(DEFAULT, per_channel=False),
        replace(DEFAULT, quant_format="QOperator", activation_type="U8", weight_type="S8", reduce_range=True),
        replace(DEFAULT, calibration="entropy"),
        replace(DEFAULT, calibration="percentile"),
        replace(DEFAULT, samples=max(1, calibration_samples // 4)),
        replace(DEFAULT, op_types=("Conv",)),
        replace(DEFAULT, op_types=("MatMul", "Gemm")),
    ]


def host_priors(isa_flags: Sequence[str], dynamic: bool = False) -> list[Candidate]:
    """The recipes that won on this host class before, which ``auto`` always tries right after the default
    (a search that stops at a passing default depends on one noisy figure: ResNet-18 on an AVX-512 VNNI Xeon
    published S8S8 at 0.90x FP32 in one build and U8S8 + reduce_range at 2.91x in the next).
    - x86 (AVX2, with or without VNNI): U8S8 with reduce_range - onnxruntime's fast path for u8 activations x s8
      weights, 7-bit weights so that VPMADDUBSW cannot saturate without VNNI (onnxruntime's own advice). With
      AVX-512 and VNNI hidden (benchmarks/as_avx2_only.sh), ResNet-18: U8S8 + reduce_range 1.66x FP32, U8U8
      1.05x, S8S8 + reduce_range 0.91x;
    - other CPUs (ARM): reduce_range and U8U8 (no u8 x s8 saturation);
    - dynamic INT8: per-channel weights (a MiniLM kept cosine 0.99 at 2.27x FP32, per-tensor fell to 0.875)."""
    if dynamic:
        return [replace(DYNAMIC, per_channel=True)]
    if any(flag in isa_flags for flag in ("avx2", "avx512_vnni", "avx_vnni")):
        return [replace(DEFAULT, activation_type="U8", weight_type="S8", reduce_range=True)]
    return [replace(DEFAULT, reduce_range=True), replace(DEFAULT, activation_type="U8", weight_type="U8")]


def with_priors(first: Candidate, priors: Sequence[Candidate], rest: Sequence[Candidate]) -> list[Candidate]:
    """``first``, then the priors, then the rest of the list, each recipe once."""
    ordered: list[Candidate] = []
    for candidate in [first, *priors, *rest]:
        if candidate not in ordered:
            ordered.append(candidate)
    return ordered


def dynamic_candidates() -> list[Candidate]:
    """Dynamic INT8 where it applies (MatMul/Gemm weights): the default, reduce_range, u8 weights,
    per-channel weights. (Op types stay MatMul+Gemm together: onnxruntime rewrites a Gemm as MatMul +
    Add before quantising it, so "only Gemm" would quantise nothing.)"""
    return [DYNAMIC, replace(DYNAMIC, reduce_range=True), replace(DYNAMIC, weight_type="U8"),
            replace(DYNAMIC, per_channel=True)]


@dataclass
class Result:
    """What ``evaluate`` measured for one candidate."""

    passed: bool
    error: float | None = None  # worst relative L2 error vs the reference
    drop: float | None = None  # task-metric drop in points (None: no labels)
    speedup: float | None = None  # throughput vs FP32 on this host (None: not measured)
    failures: list[str] = field(default_factory=list)


@dataclass
class Row:
    candidate: Candidate
    result: Result | None
    verdict: str
    seconds: float = 0.0
    stage: str = "search"  # search | fallback
    remeasured: bool = False  # speed re-measured side by side with the other finalists

    def to_dict(self) -> dict:
        r = self.result
        return {"candidate": self.candidate.label(), "changed": self.candidate.changes(), "stage": self.stage,
                "rel_l2": None if r is None else r.error, "accuracy_drop": None if r is None else r.drop,
                "speed_vs_fp32": None if r is None else r.speedup, "verdict": self.verdict,
                "seconds": round(self.seconds, 2), "remeasured": self.remeasured}


def _verdict(result: Result) -> str:
    if result.passed:
        return PASS
    return f"{FAIL}: {result.failures[0]}" if result.failures else FAIL


def _run(candidate: Candidate, evaluate: Callable[[Candidate], Result], clock, stage: str) -> Row:
    start = clock()
    try:
        result = evaluate(candidate)
        verdict = _verdict(result)
    except Exception as exc:  # noqa: BLE001 - one recipe failing must not end the search
        result, verdict = None, f"{ERROR}: {' '.join(str(exc).split())[:200]}"
    return Row(candidate, result, verdict, clock() - start, stage)


def search(candidates: Sequence[Candidate], evaluate: Callable[[Candidate], Result], budget_seconds: float,
           clock: Callable[[], float], *, stop_when: Callable[[list[Row]], bool] | None = None) -> list[Row]:
    """Evaluate ``candidates`` in order while the budget lasts (the first always runs) or until
    ``stop_when(rows so far)`` says enough; the rest get a row saying why they were not tried."""
    rows: list[Row] = []
    start = clock()
    for i, candidate in enumerate(candidates):
        spent = clock() - start >= budget_seconds
        if i and (spent or (stop_when is not None and stop_when(rows))):
            rows += [Row(c, None, OVER_BUDGET if spent else NOT_NEEDED) for c in candidates[i:]]
            break
        rows.append(_run(candidate, evaluate, clock, "search"))
    return rows


SLOWDOWN_BAND = 0.15  # "slower than FP32" means below 1 / 1.15 = 0.87x: short measurements on a busy host vary more
SLOWDOWN_ROUNDS = 3


def stably_slower(row: Row, remeasure: Callable[[list[Candidate]], list[float]], rounds: int = SLOWDOWN_ROUNDS,
                  band: float = SLOWDOWN_BAND) -> bool:
    """Whether a passing default recipe is slower than FP32 for real, which makes ``auto`` search on:
    its first measurement AND each of ``rounds`` re-measurements side by side with FP32
    (``remeasure([candidate]) -> [speed vs FP32]``) are below ``1 / (1 + band)``. A single slow
    window on a busy host is noise, not a reason to spend the search budget. When re-measured, the
    median of the re-measurements becomes the row's speed (marked re-measured)."""
    limit = 1.0 / (1.0 + band)
    speed = row.result.speedup if row.result is not None else None
    if speed is None or speed >= limit:
        return False
    speeds = []
    for _ in range(rounds):
        speeds.append(float(remeasure([row.candidate])[0]))
        if speeds[-1] >= limit:  # one round at FP32 speed: the first figure was noise
            break
    row.result.speedup = sorted(speeds)[len(speeds) // 2]
    row.remeasured = True
    return len(speeds) == rounds and all(s < limit for s in speeds)


CLEAR_WIN = 1.2  # a passing recipe this much faster than FP32 settles `auto` (short measurements vary ~10 %)


def auto_settled(rows: Sequence[Row], tried_first: int, remeasure: Callable[[list[Candidate]], list[float]]) -> bool:
    """``auto``'s stop rule, asked before each next candidate: never before the first ``tried_first``
    candidates (the default and this host's priors) are evaluated; then stop when the best passing recipe
    is a clear win (>= CLEAR_WIN x FP32), or when it is stably slower than FP32 (``stably_slower``: INT8
    loses on this host, more recipes will not turn that around). Nothing passing, or a best in the noisy
    band between, searches on."""
    if len(rows) < tried_first:
        return False
    winner = best(rows)
    if winner is None or winner.result.speedup is None:
        return False
    if winner.result.speedup >= CLEAR_WIN:
        return True
    if winner.remeasured:  # its re-measured median already decided once
        return winner.result.speedup < 1.0 / (1.0 + SLOWDOWN_BAND)
    return stably_slower(winner, remeasure)


def loses_to_fp32(rows: Sequence[Row]) -> bool:
    """Whether the best passing recipe was re-measured and stays stably slower than FP32 (``stably_slower``
    decided so): INT8 loses here whichever passing recipe ships, so re-measuring the finalists to choose
    between them (``settle``) would spend build time on a variant that cannot be selected."""
    winner = best(rows)
    return (winner is not None and winner.remeasured and winner.result.speedup is not None
            and winner.result.speedup < 1.0 / (1.0 + SLOWDOWN_BAND))


def closest(rows: Sequence[Row]) -> Candidate:
    """The evaluated candidate with the smallest error (the starting point of the fallback)."""
    scored = [r for r in rows if r.result is not None and r.result.error is not None]
    if not scored:
        return rows[0].candidate if rows else DEFAULT
    return min(scored, key=lambda r: r.result.error).candidate


def rank_nodes(nodes: Sequence[str], sensitivity: Callable[[str], float], deadline: float,
               clock: Callable[[], float]) -> list[tuple[str, float]]:
    """(node, error when only it is quantised), most sensitive first; nodes not measured before the
    deadline follow in graph order with an unknown (nan) sensitivity."""
    measured, rest = [], []
    for node in nodes:
        if clock() >= deadline:
            rest.append((node, math.nan))
            continue
        try:
            measured.append((node, float(sensitivity(node))))
        except Exception:  # noqa: BLE001 - an unmeasurable node goes last
            rest.append((node, math.nan))
    return sorted(measured, key=lambda item: -item[1]) + rest


def fallback(start: Candidate, ranked: Sequence[tuple[str, float]], evaluate: Callable[[Candidate], Result],
             deadline: float, clock: Callable[[], float], *, max_excluded: int | None = None) -> list[Row]:
    """Keep the most sensitive nodes in FP32, one more each step, until a candidate passes, the
    deadline passes or ``max_excluded`` nodes (default: all but one) are excluded."""
    limit = max_excluded if max_excluded is not None else max(len(ranked) - 1, 0)
    rows: list[Row] = []
    excluded: list[str] = list(start.exclude)
    for node, _score in ranked[:limit]:
        if clock() >= deadline:
            rows.append(Row(replace(start, exclude=tuple(excluded + [node])), None, OVER_BUDGET, 0.0, "fallback"))
            break
        excluded.append(node)
        row = _run(replace(start, exclude=tuple(excluded)), evaluate, clock, "fallback")
        rows.append(row)
        if row.verdict == PASS:
            break
    return rows


SPEED_NOISE = 0.10  # passing rows within 10 % of the fastest count as equally fast (short measurements)


def best(rows: Sequence[Row]) -> Row | None:
    """The passing row with the smallest error among those within SPEED_NOISE of the fastest
    (unmeasured speed counts as 0, so unmeasured rows go by error alone); None when nothing passed."""
    passing = [r for r in rows if r.verdict == PASS and r.result is not None]
    if not passing:
        return None
    fastest = max(r.result.speedup or 0.0 for r in passing)
    near = [r for r in passing if (r.result.speedup or 0.0) >= fastest / (1.0 + SPEED_NOISE)]
    return min(near, key=lambda r: r.result.error if r.result.error is not None else float("inf"))


def finalists(rows: Sequence[Row], band: float = 0.30, limit: int = 4) -> list[Row]:
    """The measured passing rows within ``band`` of the fastest, at least two (at most ``limit``,
    fastest first): the short per-candidate measurements are noisy on a busy host, so these are
    measured again side by side (``rerank``) before ``best`` decides."""
    measured = [r for r in rows if r.verdict == PASS and r.result is not None and r.result.speedup]
    if not measured:
        return []
    ranked = sorted(measured, key=lambda r: -r.result.speedup)
    near = [r for r in ranked if r.result.speedup >= ranked[0].result.speedup / (1.0 + band)]
    return (near if len(near) >= 2 else ranked[:2])[:limit]  # a lone outlier still meets the runner-up


def rerank(rows: Sequence[Row], speedups: dict[int, float]) -> None:
    """Replace the speed of ``rows[i]`` by ``speedups[i]`` (a side-by-side re-measurement)."""
    for i, speed in speedups.items():
        rows[i].result.speedup = speed
        rows[i].remeasured = True


def settle(rows: list[Row], remeasure: Callable[[list[Candidate]], list[float]], rounds: int = 3) -> int:
    """Re-measure the finalists side by side until every finalist has been re-measured (a finalist
    that drops out may let a row with a stale, lucky figure in: it meets the others next round).
    ``remeasure`` returns the speeds vs FP32 of the given candidates, measured together. Returns
    the number of rounds run."""
    for done in range(rounds):
        final = finalists(rows)
        if len(final) < 2 or all(r.remeasured for r in final):
            return done
        speeds = remeasure([r.candidate for r in final])
        rerank(rows, {rows.index(r): speed for r, speed in zip(final, speeds)})
    return rounds


def summary(rows: Sequence[Row]) -> str:
    """One sentence: which recipe won and why, or why none did."""
    tried = [r for r in rows if r.result is not None or r.verdict.startswith(ERROR)]
    skipped = sum(1 for r in rows if r.verdict == OVER_BUDGET)
    winner = best(rows)
    if winner is not None:
        speed = winner.result.speedup
        text = (f"search: {winner.candidate.label()} chosen of {len(tried)} tried ({winner.candidate.changes()}; "
                f"rel L2 {_num(winner.result.error)}")
        return text + (f", {speed:.2f}x FP32)" if speed is not None else ")")
    errors = [r.result.error for r in rows if r.result is not None and r.result.error is not None]
    smallest = f"; smallest rel L2 {min(errors):.3g}" if errors else ""
    return (f"search: none of {len(tried)} tried recipes passed verification{smallest}"
            + (f"; {skipped} not tried (time budget spent: raise quantization.search_seconds)" if skipped else "")
            + " - keep FP32, or relax verify.tolerance / verify.max_accuracy_drop")


def _num(value: float | None, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def format_table(rows: Sequence[Row]) -> str:
    """The search table: candidate, what changed, rel L2, accuracy drop, speed vs FP32, verdict."""
    head = ["#", "candidate", "changed", "rel L2", "acc drop", "vs FP32", "verdict"]
    body = []
    for i, row in enumerate(rows, 1):
        r = row.result
        body.append([str(i), row.candidate.label(), row.candidate.changes(),
                     _num(r.error if r else None), _num(r.drop if r else None, "+.2f"),
                     "-" if r is None or r.speedup is None else f"{r.speedup:.2f}x" + ("*" if row.remeasured else ""),
                     row.verdict])
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line[:-1], widths)) + "  " + line[-1]
             for line in [head, *body]]
    if any(r.remeasured for r in rows):
        lines.append("* re-measured side by side with the other finalists (the figure the choice used)")
    return "\n".join(lines)
