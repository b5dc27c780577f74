"""Your own pre/post-processing steps at build time: run on the raw validation data, checked, recorded.

Usage::

    steps = UserSteps.load(spec)                       # imports each step's one module file by path
    raw = read_raw(spec.data.validation, spec.preprocess)       # {input: array}, strings as bytes objects
    model_inputs = steps.preprocess(raw)               # the model's validation inputs
    served = steps.postprocess(model_outputs)          # what the ensemble must answer
    record = reference_record(raw, served)             # user_steps_reference.npz: `check` replays it

The functions run exactly as the published python steps run them (templates/pipeline/user_step.py):
{name: array, batch first} in, {name: array} out; strings are numpy object arrays of bytes.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from builder.core.errors import UserInputError
from builder.core.files import module_from_file
from builder.spec.steps import StepSpec

REFERENCE_FILE = "user_steps_reference.npz"


def load_function(step: StepSpec) -> Callable[[dict], dict]:
    name = f"triton_builder_user_step_{step.kind}_{abs(hash(str(step.module_file)))}"
    try:
        module = module_from_file(step.module_file, name)
    except BaseException as exc:  # noqa: BLE001 - the user's code: whatever it raises is theirs
        raise UserInputError(f"{step.kind}.function: importing {step.module_file.name} raised {type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:300]}; fix the module (numpy and the standard library "
                             "only: it runs in the serving image)") from None
    function = getattr(module, step.function, None)
    if not callable(function):
        raise UserInputError(f"{step.kind}.function: {step.module_file.name} has no function '{step.function}'")
    return function


def _as_wire(value: Any, dtype: str) -> np.ndarray:
    array = np.asarray(value)
    if dtype == "string":
        return np.array([v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.reshape(-1)],
                        dtype=np.object_).reshape(array.shape)
    return array.astype(dtype, copy=False)


def read_raw(path: Path, step: StepSpec) -> dict[str, np.ndarray]:
    """data.validation for a preprocess step: an .npz keyed by its inputs (strings: numpy unicode arrays)."""
    if not zipfile.is_zipfile(path):
        raise UserInputError(f"data.validation: {path} is not an .npz; save the raw inputs with np.savez(path, "
                             f"{', '.join(f'{t.name}=...' for t in step.tensors)})")
    try:
        with np.load(path, allow_pickle=False) as archive:
            data = {key: archive[key] for key in archive.files}
    except ValueError:
        raise UserInputError(f"data.validation: {path.name} holds Python objects, which are never unpickled; save "
                             "strings as a numpy unicode array (np.array(['a', 'b']))") from None
    missing = [t.name for t in step.tensors if t.name not in data]
    if missing:
        raise UserInputError(f"data.validation: {path.name} has no array {', '.join(missing)} (it has: "
                             f"{', '.join(data) or 'nothing'}); key the preprocess inputs by name")
    return {t.name: _as_wire(data[t.name], t.dtype) for t in step.tensors}


def _call(function: Callable, kind: str, arrays: dict[str, np.ndarray], wanted: list[str]) -> dict[str, np.ndarray]:
    try:
        result = function(dict(arrays))
    except BaseException as exc:  # noqa: BLE001
        raise UserInputError(f"{kind}.function raised {type(exc).__name__} on the validation data: "
                             f"{' '.join(str(exc).split())[:300]}") from None
    if not isinstance(result, dict) or any(name not in result for name in wanted):
        have = ", ".join(result) if isinstance(result, dict) else type(result).__name__
        raise UserInputError(f"{kind}.function must return a dict with {', '.join(wanted)} (got {have})")
    rows = {len(arrays[k]) for k in arrays}
    out = {name: np.asarray(result[name]) for name in wanted}
    short = [name for name, a in out.items() if a.ndim == 0 or {len(a)} != rows]
    if short:
        raise UserInputError(f"{kind}.function returned {', '.join(short)} without one row per input row "
                             f"({rows.pop()}): keep the batch dimension first")
    return out


@dataclass
class UserSteps:
    pre: StepSpec | None
    post: StepSpec | None
    pre_function: Callable | None = None
    post_function: Callable | None = None
    reference: bytes | None = None  # user_steps_reference.npz (set by stage load: record())

    @classmethod
    def load(cls, spec) -> "UserSteps | None":
        if spec.preprocess is None and spec.postprocess is None:
            return None
        return cls(spec.preprocess, spec.postprocess,
                   load_function(spec.preprocess) if spec.preprocess else None,
                   load_function(spec.postprocess) if spec.postprocess else None)

    def preprocess(self, raw: dict[str, np.ndarray], model_inputs: list[Any]) -> dict[str, np.ndarray]:
        out = _call(self.pre_function, "preprocess", raw, [t.name for t in model_inputs])
        return {t.name: out[t.name].astype(t.dtype, copy=False) for t in model_inputs}

    def record(self, raw: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        """The raw inputs (the model's own where there is no preprocess) and what the ensemble must answer."""
        self.reference = reference_record(raw, self.postprocess(outputs))

    def postprocess(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.post is None:
            return outputs
        out = _call(self.post_function, "postprocess", outputs, [t.name for t in self.post.tensors])
        return {t.name: _as_wire(out[t.name], t.dtype) for t in self.post.tensors}


def reference_record(raw: dict[str, np.ndarray], served: dict[str, np.ndarray]) -> bytes:
    """The raw inputs and the answers the ensemble must give, strings as unicode arrays (no pickle)."""
    def plain(array: np.ndarray) -> np.ndarray:
        if array.dtype == np.object_:
            return np.array([v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
                            ).reshape(array.shape)
        return array

    buffer = io.BytesIO()
    np.savez(buffer, **{f"input/{k}": plain(v) for k, v in raw.items()},
             **{f"output/{k}": plain(v) for k, v in served.items()})
    return buffer.getvalue()
