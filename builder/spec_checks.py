"""Checks across fields of one spec that the per-field parsing cannot make: an input's min/opt/max
shapes in order, a value_range its dtype can hold, verify.dynamic_sizes inside every dynamic dim's range.

Usage::

    check_input_ranges(fields, tensor)      # inside inputs[i], after its shapes and value_range
    check_dynamic_sizes(spec, origin)       # once every section is parsed
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from builder.errors import UserInputError

if TYPE_CHECKING:
    from builder.spec import ModelSpec, TensorSpec
    from builder.spec_fields import Fields


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
