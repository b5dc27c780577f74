"""Helpers the stages share (stages never import each other; what two of them need lives here).

Usage::

    failure = accuracy_drop_failure(variant.accuracy, spec.verify.max_accuracy_drop)
    if failure:   # "drop 1.50 points > 1.0 allowed"
        ...
"""

from __future__ import annotations

from typing import Any


def accuracy_drop_failure(accuracy: dict[str, Any] | None, limit: float) -> str:
    """The accuracy constraint, in one place: why the task-metric drop is over ``limit`` ("" when it is
    within it, or when no drop was measured)."""
    drop = (accuracy or {}).get("drop")
    if drop is None or drop <= limit:
        return ""
    return f"drop {drop:.2f} points > {limit} allowed"
