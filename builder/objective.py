"""The trade-off objective J, in one place: the build's selection (stage select) and `triton-builder
select` on the serving host (builder/repository/reselect.py) both rank by it.

J = alpha * accuracy - beta * latency - gamma * memory, where accuracy is the variant's top-1 % with
labelled data, else 100 x its lowest cosine similarity to the reference on the validation set, else
100 (verified); latency is p50 ms at batch 1; memory the measured peak RSS growth in MB.

Usage::

    terms = tradeoff_terms(variant.accuracy, p50_ms=0.12, memory_mb=8.0,
                           weights={"alpha": 1.0, "beta": 10.0, "gamma": 0.0})
    terms["J"]   # 96.3 ...; also "accuracy", "latency_ms", "memory_mb" and the weights
"""

from __future__ import annotations

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
