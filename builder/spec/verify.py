"""The spec's ``verify`` section: per-precision tolerances, the task metric (builder/accuracy/task_metrics.py) and how
it is parsed, with messages that name the field (builder/spec/model.py re-exports what it needs).

Usage::

    verify = parse_verify({"metric": "embedding", "tolerances": {"int8": {"min_spearman": 0.95}}}, "spec.yaml", 16)
    verify.tolerance("int8")      # {"max_mismatch": 0.05, "min_row_cosine": 0.99, "min_spearman": 0.95, ...}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from builder.accuracy.task_metrics import METRICS, TOLERANCE_KEYS as TASK_TOLERANCE_KEYS, lossy_tolerance
from builder.spec.fields import Fields, is_number

# Default tolerances per precision: relative L2 error of each output against the reference.
# max_mismatch: the share of an integer/bool output's values (class ids, masks) that may differ
DEFAULT_TOLERANCES = {
    "fp32": {"rel_l2": 1e-5, "max_mismatch": 0.0},
    "fp16": {"rel_l2": 1e-2, "max_mismatch": 0.01},
    "int8": {"rel_l2": 0.1, "max_mismatch": 0.05},
}


VERIFY_KEYS = ("batch_sizes", "dynamic_sizes", "tolerances", "max_accuracy_drop", "seed", "metric")
TOLERANCE_KEYS = ("rel_l2", "max_abs", "min_cosine", "max_mismatch", *TASK_TOLERANCE_KEYS)


@dataclass
class VerifySpec:
    batch_sizes: list[int] | None = None
    dynamic_sizes: list[int] | None = None
    tolerances: dict[str, dict[str, float]] = field(default_factory=dict)
    max_accuracy_drop: float = 1.0  # percentage points
    seed: int = 0
    metric: str = "rel_l2"  # builder/accuracy/task_metrics.py: rel_l2 | embedding (lossy variants judged as embeddings)

    def tolerance(self, precision: str) -> dict[str, float]:
        merged = dict(DEFAULT_TOLERANCES.get(precision, DEFAULT_TOLERANCES["fp32"]))
        if self.metric != "rel_l2" and precision != "fp32":  # FP32 variants stay element-wise exact
            merged.pop("rel_l2", None)
            merged.update(lossy_tolerance(self.metric))
        merged.update(self.tolerances.get(precision, {}))
        return merged


def parse_verify(raw: Any, origin: str, max_batch_size: int) -> VerifySpec:
    if raw is None:
        return VerifySpec()
    f = Fields(raw, "verify", VERIFY_KEYS, origin)
    batch_sizes = f.int_list("batch_sizes")
    if batch_sizes and max_batch_size and max(batch_sizes) > max_batch_size:
        raise f.error(f"{max(batch_sizes)} exceeds max_batch_size {max_batch_size}", "batch_sizes")
    tolerances = {}
    raw_tol = f.get("tolerances") or {}
    if not isinstance(raw_tol, dict):
        raise f.error("must map a precision (fp32, fp16, int8) to {rel_l2, max_abs, min_cosine, max_mismatch}", "tolerances")
    for precision, values in raw_tol.items():
        if precision not in DEFAULT_TOLERANCES:
            raise f.error(f"unknown precision {precision!r}; known: {', '.join(DEFAULT_TOLERANCES)}", "tolerances")
        tf = Fields(values, f"verify.tolerances.{precision}", TOLERANCE_KEYS, origin)
        for key, value in tf.data.items():
            if not is_number(value) or value < 0:
                raise tf.error(f"must be a finite number >= 0, got {value!r}", key)
            if key == "max_mismatch" and value > 1:
                raise tf.error(f"is a share of the values (0 to 1, e.g. 0.01 for 1 %), got {value!r}", key)
            if key.startswith("min_") and value > 1:
                raise tf.error(f"is a similarity or share of at most 1, got {value!r}", key)
        tolerances[precision] = {k: float(v) for k, v in tf.data.items()}
    drop = f.get("max_accuracy_drop", 1.0)
    if not is_number(drop) or drop < 0:
        raise f.error(f"must be a finite number >= 0 of percentage points, got {drop!r}", "max_accuracy_drop")
    return VerifySpec(
        batch_sizes=batch_sizes,
        dynamic_sizes=f.int_list("dynamic_sizes"),
        tolerances=tolerances,
        max_accuracy_drop=float(drop),
        seed=f.integer("seed", 0, minimum=0),
        metric=f.choice("metric", "rel_l2", tuple(METRICS)),
    )
