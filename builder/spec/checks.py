"""Checks across fields of one spec that the per-field parsing cannot make: an input's min/opt/max
shapes in order, a value_range its dtype can hold, verify.dynamic_sizes inside every dynamic dim's range;
an input's generation rule (values or kind, builder/accuracy/input_rules.py) that fits its dtype and shape.

Usage::

    parse_input_rule(fields, tensor)        # inside inputs[i]: its values / kind

    check_input_ranges(fields, tensor)      # inside inputs[i], after its shapes and value_range
    check_dynamic_sizes(spec, origin)       # once every section is parsed
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from builder.accuracy.input_rules import KINDS
from builder.core.errors import UserInputError
from builder.spec.fields import is_number

if TYPE_CHECKING:
    from builder.spec.fields import Fields
    from builder.spec.model import ModelSpec, TensorSpec


def parse_input_rule(f: "Fields", tensor: "TensorSpec") -> None:
    """inputs[i].values (generated values only from these) and inputs[i].kind (padding_mask, segments,
    positions): one way of saying what an input holds, fitting its dtype and shape."""
    values, kind = f.get("values"), f.get("kind")
    given = [key for key, v in (("value_range", tensor.value_range), ("values", values), ("kind", kind)) if v is not None]
    if len(given) > 1:
        raise f.error(f"{' and '.join(given)} both say which values the input holds; give one of them (value_range: "
                      "any value in [low, high); values: these only; kind: padding_mask, segments or positions)",
                      given[-1])
    if values is not None:
        if not isinstance(values, list) or not values or not all(is_number(v) or isinstance(v, bool) for v in values):
            raise f.error(f"must be a non-empty list of numbers (the only values the input takes, e.g. [0, 1]), got "
                          f"{values!r}", "values")
        integer = tensor.dtype != "bool" and np.issubdtype(np.dtype(tensor.dtype), np.integer)
        if tensor.dtype == "bool" and not all(v in (0, 1) for v in values):
            raise f.error(f"{values!r} does not fit bool; give [0, 1], [true, false] or one of them", "values")
        if integer:
            info = np.iinfo(np.dtype(tensor.dtype))
            wrong = [v for v in values if v != int(v) or not info.min <= v <= info.max]
            if wrong:
                raise f.error(f"{wrong} do not fit {tensor.dtype} (whole numbers {info.min} to {info.max}); give "
                              "values the dtype holds", "values")
        tensor.values = tuple(dict.fromkeys(values))
    if kind is not None:
        if kind not in KINDS:
            raise f.error(f"{kind!r} is not supported; use one of: {', '.join(KINDS)} (padding_mask: ones then zero "
                          "padding; segments: zeros then ones; positions: 0, 1, 2 ...), or values: [...] for a set",
                          "kind")
        if not tensor.shape:
            raise f.error(f"{kind} runs along the last axis, and the input has shape [] (none); give values: [...] "
                          "instead", "kind")
        if kind != "padding_mask" and (tensor.dtype == "bool" or not np.issubdtype(np.dtype(tensor.dtype), np.integer)):
            raise f.error(f"{kind} holds integer ids, and the input is {tensor.dtype}; give an integer dtype, or "
                          "values: [...]", "kind")
        tensor.kind = kind


def check_input_ranges(f: "Fields", tensor: "TensorSpec") -> None:
    """min_shape <= opt_shape <= max_shape on every dynamic dim (else the builder tests sizes outside
    what the user allowed); an integer value_range within the dtype (else generated values wrap)."""
    profile = tensor.profile_shapes()
    for axis, dim in enumerate(tensor.shape):
        if dim != -1:
            continue
        low, opt, high = (profile[k][axis] for k in ("min", "opt", "max"))
        if not low <= opt <= high:
            raise f.error(f"dim {axis} has min {low}, opt {opt}, max {high}: give min_shape <= opt_shape <= max_shape "
                          "(when one is left out it defaults to 1 / 16 / 64 on the dynamic dims)", "opt_shape")
    if tensor.value_range is not None and tensor.dtype not in ("bool",) and np.issubdtype(np.dtype(tensor.dtype),
                                                                                          np.integer):
        info = np.iinfo(np.dtype(tensor.dtype))
        low, high = tensor.value_range
        if low < info.min or high > info.max + 1:
            raise f.error(f"[{low}, {high}) does not fit {tensor.dtype} ({info.min} to {info.max}): generated values "
                          "would wrap around; give a range the dtype holds (high is exclusive)", "value_range")


def check_dynamic_sizes(spec: "ModelSpec", origin: str) -> None:
    """verify.dynamic_sizes apply to every dynamic dim: each must lie in every such dim's [min, max]."""
    for size in spec.verify.dynamic_sizes or []:
        for tensor in spec.inputs:
            profile = tensor.profile_shapes()
            for axis, dim in enumerate(tensor.shape):
                if dim == -1 and not profile["min"][axis] <= size <= profile["max"][axis]:
                    raise UserInputError(
                        f"{origin}: field 'verify.dynamic_sizes': {size} is outside input '{tensor.name}' dim {axis}'s "
                        f"range {profile['min'][axis]}..{profile['max'][axis]} (min_shape..max_shape); every dynamic "
                        "dim takes each size, so give sizes inside every range, or widen the ranges")
