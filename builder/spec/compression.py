"""The spec's training-time compression settings: ``data.training`` and the ``compression:`` section
(builder/stages/compress.py and builder/compression/ use them; see README.md "Training-time compression").

Usage::

    compression:
      prune_ratio: 0.5        # target fraction of channels removed per prunable layer (structured)
      prune_steps: 5          # iterative prune + fine-tune steps toward it; the largest ratio within
                              # verify.max_accuracy_drop is kept
      steps: 300              # optimizer steps per variant (all its fine-tuning together)
      seconds: 60             # wall-clock budget per variant; whichever of steps / seconds comes first
      batch_size: 64
      learning_rate: 0.001
      temperature: 4.0        # distillation: soft targets softmax(logits / T)
      alpha: 0.7              # distillation: alpha * KL(soft) + (1 - alpha) * cross-entropy(labels)
      student: null           # distillation: 'module:function' building the student (default: the pruned model)
      feature_matching: false # distillation: also match the features entering the teacher's output layer
      seed: 0

``data.training`` is an .npz with one array per model input and a ``labels`` array (class ids), or
``module:function`` (importable from the spec's folder) returning such a mapping, or an iterable of
batches of that form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.spec.fields import Fields, is_number

CALLABLE_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")
_KEYS = ("prune_ratio", "prune_steps", "steps", "seconds", "batch_size", "learning_rate", "temperature", "alpha",
         "student", "feature_matching", "seed")


@dataclass
class CompressionSpec:
    prune_ratio: float = 0.5
    prune_steps: int = 5
    steps: int = 300
    seconds: float = 60.0
    batch_size: int = 64
    learning_rate: float = 1e-3
    temperature: float = 4.0
    alpha: float = 0.7
    student: str | None = None
    feature_matching: bool = False
    seed: int = 0


def parse_training(d: Fields, base: Path) -> Path | str | None:
    """``data.training``: an .npz path (resolved against the spec folder) or 'module:function'."""
    value = d.get("training")
    if isinstance(value, str) and CALLABLE_PATTERN.match(value) and not (base / value).exists():
        return value
    return d.path("training", base)


def _number(f: Fields, key: str, default: float, hint: str, *, high: float | None = None,
            zero_ok: bool = False) -> float:
    """A number > 0 (>= 0 where ``zero_ok``), below ``high`` (at most, where ``zero_ok``) if given."""
    value = f.get(key, default)
    bad = not is_number(value)
    if not bad:
        bad = value < 0 or (value == 0 and not zero_ok) or (high is not None and (
            value > high if zero_ok else value >= high))
    if bad:
        bounds = (f"in [0, {high:g}]" if zero_ok else f"in (0, {high:g})") if high is not None else "> 0"
        raise f.error(f"must be a finite number {bounds} ({hint}), got {value!r}", key)
    return float(value)


def parse_compression(raw: Any, origin: str) -> CompressionSpec:
    if raw is None:
        return CompressionSpec()
    f = Fields(raw, "compression", _KEYS, origin)
    student = f.get("student")
    if student is not None and (not isinstance(student, str) or not CALLABLE_PATTERN.match(student)):
        raise f.error(f"{student!r} is not 'python.module:callable' returning the student nn.Module, "
                      "e.g. student:build", "student")
    return CompressionSpec(
        prune_ratio=_number(f, "prune_ratio", 0.5, "fraction of channels removed per layer, e.g. 0.5", high=1.0),
        prune_steps=f.integer("prune_steps", 5, minimum=1),
        steps=f.integer("steps", 300, minimum=1),
        seconds=_number(f, "seconds", 60.0, "the training budget per variant"),
        batch_size=f.integer("batch_size", 64, minimum=1),
        learning_rate=_number(f, "learning_rate", 1e-3, "the fine-tuning learning rate"),
        temperature=_number(f, "temperature", 4.0, "distillation softmax temperature"),
        alpha=_number(f, "alpha", 0.7, "weight of the soft-target loss", high=1.0, zero_ok=True),
        student=student,
        feature_matching=f.boolean("feature_matching", False),
        seed=f.integer("seed", 0, minimum=0),
    )
