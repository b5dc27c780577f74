"""Which values a generated input holds: the rule per input, decided once and used wherever cases,
trace examples and calibration samples are generated (builder/accuracy/tensors.py random_tensor).

A generated case must be an input the model could really get: an attention mask of 63s, or a row
of nothing but padding, is no tokenizer's output, and PyTorch and onnxruntime compute different
garbage there - a correct export was rejected on it. In order of precedence:

1. the spec: ``inputs[i].kind`` (padding_mask | segments | positions), ``inputs[i].values`` (these
   values only), ``inputs[i].value_range``;
2. the data (data.validation, then data.calibration; stage load records it on the spec with
   ``from_data``): an integer or bool input draws from the values seen there, and one whose rows are
   all ones-then-zeros (or 0, 1, 2 ...) stays a padding mask (or positions);
3. the transformers naming convention, as Optimum's dummy input generators follow it;
4. otherwise: integers in [0, 100) (stage load probes a smaller range where the model refuses
   that), floats standard normal.

Usage::

    rule = rule_for(tensor)                       # InputRule(kind="padding_mask", source="transformers name")
    rule.describe()                               # "padding mask: ones, then zero padding (transformers name)"
    array = rule.generate(tensor.dtype, [8, 1], rng)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("padding_mask", "segments", "positions")
DEFAULT_ID_RANGE = (0, 100)
# values kept of an input seen in the data: a vocabulary's worth; more are drawn from their range
MAX_SEEN_VALUES = 1 << 16
# transformers' names (their decoder_ twins alike): a mask is ones then zero padding, token types 0/1
# segments, positions 0, 1, 2 ... (Optimum's DummyTextInputGenerator makes them so)
NAMED_KINDS = {"attention_mask": "padding_mask", "pixel_mask": "padding_mask", "token_type_ids": "segments",
               "position_ids": "positions"}


@dataclass(frozen=True)
class InputRule:
    kind: str  # padding_mask | segments | positions | values | range | normal | bool
    source: str  # spec | data.validation | data.calibration | transformers name | probed | default
    values: tuple = ()  # kind values: drawn from these
    low: float = 0
    high: float = 0  # kind range: [low, high), high exclusive

    def describe(self) -> str:
        """One line for the build report, e.g. 'padding mask: ones, then zero padding (transformers name)'."""
        what = {"padding_mask": "padding mask: ones, then zero padding, never a row of padding only",
                "segments": "segments: zeros, then ones", "positions": "positions: 0, 1, 2 ...",
                "normal": "standard normal", "bool": "random true/false"}.get(self.kind)
        if self.kind == "values":
            shown = ", ".join(f"{v:g}" for v in self.values[:6]) + (" ..." if len(self.values) > 6 else "")
            what = f"one of {len(self.values)} values ({shown})"
        elif self.kind == "range":
            what = f"uniform in [{self.low:g}, {self.high:g})"
        return f"{what} ({self.source})"

    def generate(self, dtype: str, shape: list[int], rng: np.random.Generator) -> np.ndarray:
        """A random array of ``shape`` (batch included) following the rule."""
        dt = np.dtype(dtype)
        if self.kind in ("padding_mask", "segments", "positions") and not shape:
            return np.ones(shape, dtype=dt) if self.kind == "padding_mask" else np.zeros(shape, dtype=dt)
        if self.kind == "padding_mask":  # at least one real token per row: a row of padding only is undefined
            lengths = rng.integers(1, shape[-1] + 1, size=shape[:-1])
            return (np.arange(shape[-1]) < lengths[..., None]).astype(dt)
        if self.kind == "segments":  # the second segment may be empty (a single sentence)
            starts = rng.integers(1, shape[-1] + 1, size=shape[:-1])
            return (np.arange(shape[-1]) >= starts[..., None]).astype(dt)
        if self.kind == "positions":
            return np.broadcast_to(np.arange(shape[-1]), shape).astype(dt)
        if self.kind == "values":
            return rng.choice(np.asarray(self.values), size=shape).astype(dt)
        if self.kind == "bool":
            return rng.random(shape) > 0.5
        if self.kind == "range" and np.issubdtype(dt, np.integer):
            return rng.integers(int(self.low), int(self.high), size=shape).astype(dt)
        if self.kind == "range":
            return rng.uniform(self.low, self.high, size=shape).astype(dt)
        return rng.standard_normal(shape).astype(dt)


def rule_for(tensor) -> InputRule:
    """The rule that makes ``tensor``'s (a TensorSpec) generated values, by the precedence above."""
    source = tensor.rule_source or "spec"
    if tensor.kind is not None:
        return InputRule(tensor.kind, source)
    if tensor.values is not None:
        return InputRule("values", source, values=tuple(tensor.values))
    if tensor.value_range is not None:
        return InputRule("range", source, low=tensor.value_range[0], high=tensor.value_range[1])
    named = named_kind(tensor)
    if named is not None:
        return InputRule(named, "transformers name")
    if tensor.dtype == "bool":
        return InputRule("bool", "default")
    if np.issubdtype(np.dtype(tensor.dtype), np.integer):
        return InputRule("range", "default", low=DEFAULT_ID_RANGE[0], high=DEFAULT_ID_RANGE[1])
    return InputRule("normal", "default")


def named_kind(tensor) -> str | None:
    """The kind transformers' naming gives ``tensor`` (None: no such name, or a dtype it does not fit):
    attention_mask, pixel_mask and *_attention_mask are padding masks, token_type_ids segments,
    position_ids positions; decoder_ (or any prefix_) names alike."""
    if not tensor.shape:
        return None
    name = tensor.name.lower()
    kind = next((k for n, k in NAMED_KINDS.items() if name == n or name.endswith("_" + n)), None)
    integer = tensor.dtype != "bool" and np.issubdtype(np.dtype(tensor.dtype), np.integer)
    if kind == "padding_mask" or (kind is not None and integer):
        return kind
    return None


def spec_gives_rule(tensor) -> bool:
    """Whether the spec itself (or a rule recorded on it earlier) decides the tensor's values."""
    return tensor.kind is not None or tensor.values is not None or tensor.value_range is not None


def from_data(inputs, data: list[tuple[str, dict[str, np.ndarray]]]) -> None:
    """Record on each integer or bool input the spec leaves open the rule its data shows: ``data`` is
    [(field, {input: array}), ...] in order of preference (data.validation first). Arrays hold samples
    first where the model batches; the pattern is read along the last axis either way."""
    for tensor in inputs:
        integer = tensor.dtype == "bool" or np.issubdtype(np.dtype(tensor.dtype), np.integer)
        if spec_gives_rule(tensor) or not integer:
            continue
        seen = [(field, np.asarray(arrays[tensor.name])) for field, arrays in data if tensor.name in arrays]
        seen = [(field, a) for field, a in seen if a.size]
        if not seen:
            continue
        tensor.rule_source = " and ".join(field for field, _ in seen)
        arrays = [a for _, a in seen]
        if tensor.shape and all(_is_padding_mask(a) for a in arrays):
            tensor.kind = "padding_mask"
        elif tensor.shape and all(_is_positions(a) for a in arrays):
            tensor.kind = "positions"
        else:
            values = np.unique(np.concatenate([a.ravel() for a in arrays]))
            if len(values) > MAX_SEEN_VALUES:
                tensor.value_range = (values.min().item(), values.max().item() + 1)
            else:
                tensor.values = tuple(v.item() for v in values)


def _is_padding_mask(array: np.ndarray) -> bool:
    """Every row (last axis) is ones, then zeros, with at least one 1, and some row has padding (a
    mask of ones only is one value seen: drawn as such)."""
    if array.ndim == 0 or not np.isin(array, (0, 1)).all():
        return False
    rows = array.reshape(-1, array.shape[-1]).astype(np.int64)
    return bool((rows[:, 0] == 1).all() and (np.diff(rows, axis=1) <= 0).all() and (rows == 0).any())


def _is_positions(array: np.ndarray) -> bool:
    if array.ndim == 0 or array.shape[-1] < 2:
        return False
    return bool((array.reshape(-1, array.shape[-1]) == np.arange(array.shape[-1])).all())


def rule_lines(inputs) -> dict[str, str]:
    """{input: what made its generated values} for the build report."""
    return {t.name: rule_for(t).describe() for t in inputs}
