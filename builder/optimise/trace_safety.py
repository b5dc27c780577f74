"""Which control flow a ``torch.jit.trace`` froze on the inputs' VALUES, told from its TracerWarnings.

A trace runs forward once and records tensor ops; a Python ``if``, loop count or number taken from a
tensor is held at what the example gave. A branch no probe or verification case reaches
(``if x.abs().max() > 8:``) only shows up in the tracer's warning "Converting a tensor to a Python
boolean", which a size or a weight gives alike; ``frozen_conversions`` keeps the ones that come from
the input values. Both trace-based exports use it: the TorchScript trace and the legacy ONNX exporter.

Usage::

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")     # a warning shown once before must be recorded again
        traced = torch.jit.trace(model, args, check_trace=False, strict=False)   # or a legacy ONNX export
    frozen = frozen_conversions(model, args, caught)   # [] -> nothing input-dependent was frozen
    if frozen:
        print("the trace " + froze_text(frozen))          # names each line and what it became

The second (watched) trace runs only when ``caught`` holds such a warning from outside torch, so a
model without one costs nothing more than reading its warnings.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import warnings
from pathlib import Path

#: what the tracer says where a tensor becomes a Python value, which the trace then holds constant
#: (torch's tracer: Python boolean / number / integer / float / complex / list, and a NumPy array)
_CONVERSION = re.compile(r"Converting a tensor to a (Python \w+|NumPy array)")
#: the Tensor methods behind those warnings, watched in frozen_conversions' second trace
_CONVERTERS = ("__bool__", "__int__", "__float__", "__index__", "__complex__", "item", "tolist", "numpy")
#: graph nodes a value may come through and still not depend on the inputs' values: their sizes, the
#: module's weights, constants
_NOT_VALUES = frozenset({"aten::size", "aten::sym_size", "aten::dim", "aten::numel", "prim::GetAttr",
                         "prim::Constant"})


def froze_text(frozen: list[str]) -> str:
    """The sentence after "the trace ..." that says what ``frozen`` (frozen_conversions' lines) means."""
    return ("froze data-dependent control flow: at " + "; ".join(frozen) + " a tensor computed from the input "
            "values became a Python value, which the trace holds constant: the example's branch, loop count or "
            "number, for every input")


def conversion_warnings(caught: list) -> dict[tuple[str, int], str]:
    """(file, line) -> what the tensor became ("Python boolean"), for each tracer conversion warning
    from outside torch: torch's own come from shape checks in nn, which torch itself ignores."""
    import torch

    torch_dir = Path(os.path.realpath(os.path.dirname(torch.__file__)))  # torch's own files, not an asset
    warned: dict[tuple[str, int], str] = {}
    for w in caught:
        found = _CONVERSION.search(str(w.message)) if issubclass(w.category, torch.jit.TracerWarning) else None
        if found and not Path(w.filename).resolve().is_relative_to(torch_dir):
            warned.setdefault((w.filename, w.lineno), found.group(1))
    return warned


def frozen_conversions(model, args: tuple, caught: list) -> list[str]:
    """Where a trace of ``model`` on ``args`` froze control flow or a number on the inputs' VALUES, one
    line each (``model.py:9 `if x.abs().max() > 8:` (Python boolean)``); [] where it froze none.
    ``caught``: the warnings that trace raised.

    The tracer warns whenever a tensor becomes a Python value, but a size (``if x.shape[1] > 37``,
    ``float(x.shape[-1])``) or a weight gives the same text and is not this problem: on a static shape
    it is a constant, and dynamic sizes are what probes at other sizes are for. So a second trace
    follows each converted value back through the graph: it counts only if it reaches a forward input
    other than through its size. Where that cannot be told, it counts."""
    warned = conversion_warnings(caught)
    if not warned:
        return []
    judged = _input_dependent_sites(model, args)
    return [f"{Path(file).name}:{line} `{linecache.getline(file, line).strip()}` ({kind})"
            for (file, line), kind in warned.items() if judged is None or judged.get((file, line), True)]


def _input_dependent_sites(model, args: tuple) -> dict[tuple[str, int], bool] | None:
    """Trace ``model`` again, watching every tensor -> Python conversion: per (file, line), whether a
    converted value depends on the inputs' values. None where this trace fails."""
    import torch
    from torch.overrides import TorchFunctionMode

    converters = {getattr(torch.Tensor, name) for name in _CONVERTERS}
    sites: dict[tuple[str, int], bool] = {}

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in converters and args and isinstance(args[0], torch.Tensor) and torch._C._is_tracing():
                caller = sys._getframe(1)
                key = (caller.f_code.co_filename, caller.f_lineno)
                try:
                    depends = _reaches_an_input(torch._C._get_value_trace(args[0]))
                except Exception:  # noqa: BLE001 - a value the trace cannot name is judged unsafe
                    depends = True
                sites[key] = sites.get(key, False) or depends
            return func(*args, **(kwargs or {}))

    try:
        # a separate trace: under a TorchFunctionMode some nn modules take another path (e.g. the
        # attention fast path), which must not be the one shipped
        with warnings.catch_warnings(), Watch():
            warnings.simplefilter("ignore")
            torch.jit.trace(model, args, check_trace=False, strict=False)
    except Exception:  # noqa: BLE001 - then every warning counts
        return None
    return sites


def _reaches_an_input(value) -> bool:
    """Whether a traced value is computed from a forward input's values (not only from its sizes,
    the module's weights or constants)."""
    seen, todo = set(), [value]
    while todo:
        current = todo.pop()
        if current.unique() in seen:
            continue
        seen.add(current.unique())
        node = current.node()
        if node.kind() == "prim::Param":
            if current.type().kind() != "ClassType":  # input 0 is the module itself
                return True
        elif node.kind() not in _NOT_VALUES:
            todo.extend(node.inputs())
    return False
