"""The trade-off objective J, in one place: the build's selection (stage select) and `triton-builder
select` on the serving host (builder/repository/reselect.py) both rank by it.

J = alpha * accuracy - beta * latency - gamma * memory, where accuracy is the variant's top-1 % with
labelled data, else 100 x its lowest cosine similarity to the reference on the validation set, else
100 (verified); latency is p50 ms at batch 1; memory the measured peak RSS growth in MB.

Usage::

    terms = tradeoff_terms(variant.accuracy, p50_ms=0.12, memory_mb=8.0,
                           weights={"alpha": 1.0, "beta": 10.0, "gamma": 0.0})
    terms["J"]   # 96.3 ...; also "accuracy", "latency_ms", "memory_mb" and the weights

The tie rule, also shared: a variant further from the reference wins on speed only by more than the
measurement noise. ``prefer_accurate`` takes each candidate's speed (higher is better: inferences/s, or
1/p50) and its worst rel L2 against the reference, and returns the one to publish::

    choice = prefer_accurate({"onnx_int8_static": 142e3, "onnx": 135e3}, {"onnx_int8_static": 1.7e-2,
                             "onnx": 2.8e-7})
    choice.name, choice.why   # "onnx", "within measurement noise of onnx_int8_static (1.05x) and closer ..."
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def accuracy_term(accuracy: dict[str, Any] | None) -> float:
    """The accuracy J uses (percent): top-1 with labels, else 100 x the lowest cosine, else 100."""
    acc = accuracy or {}
    if acc.get("variant") is not None:
        return float(acc["variant"])
    cosines = [c for c in (acc.get("cosine_vs_reference") or {}).values() if c is not None]
    return 100.0 * min(cosines) if cosines else 100.0


def tradeoff_terms(accuracy: dict[str, Any] | None, p50_ms: float | None, memory_mb: float | None,
                   weights: dict[str, float]) -> dict[str, float] | None:
    """J and its terms (None when the latency was not measured)."""
    if not p50_ms:
        return None
    acc = accuracy_term(accuracy)
    memory = float(memory_mb or 0.0)
    j = weights["alpha"] * acc - weights["beta"] * p50_ms - weights["gamma"] * memory
    return {"J": j, "accuracy": acc, "latency_ms": p50_ms, "memory_mb": memory, **weights}


NOISE = 0.05  # speed margins below this are inside what a short in-process measurement can tell apart
CLOSER = 10.0  # "closer to the reference": a worst rel L2 at least this many times smaller
EXACT = 1e-4  # a worst rel L2 below this is float32 rounding: such a variant is never "further" from the reference


def speed(objective: str, throughput: float | None, p50_ms: float | None) -> float | None:
    """What ``prefer_accurate`` compares (higher is faster): inferences/s, or 1/p50 for objective latency."""
    if objective == "latency":
        return 1.0 / p50_ms if p50_ms else None
    return throughput


@dataclass(frozen=True)
class Choice:
    name: str
    why: str | None = None  # why the fastest was passed over (None: the fastest is the choice)
    fastest: str | None = None


def prefer_accurate(speed: dict[str, float], error: dict[str, float | None], noise: float = NOISE,
                    closer: float = CLOSER, exact: float = EXACT) -> Choice:
    """The fastest candidate, unless its worst rel L2 is over ``exact`` and one within ``noise`` of its
    speed is ``closer`` times nearer the reference: then the fastest of those. A candidate without an
    error figure (verified by task accuracy, or not compared) never displaces the fastest, nor is
    displaced by error."""
    fastest = max(speed, key=speed.get)
    worst = error.get(fastest)
    if worst is None or worst <= exact:
        return Choice(fastest)
    tied = [n for n in speed if n != fastest and speed[n] > 0 and speed[fastest] / speed[n] - 1 < noise
            and error.get(n) is not None and error[n] * closer <= worst]
    if not tied:
        return Choice(fastest)
    name = max(tied, key=speed.get)
    margin = speed[fastest] / speed[name]
    return Choice(name, f"within measurement noise of {fastest} ({margin:.2f}x, < {1 + noise:g}x) and closer to "
                        f"the reference (rel L2 {error[name]:.1e} vs {worst:.1e}): a variant further from the "
                        f"reference must be more than {100 * noise:g}% faster to be published", fastest)
