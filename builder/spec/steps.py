"""``preprocess`` / ``postprocess``: your own steps around any model, served as python steps of an ensemble.

Usage (YAML)::

    preprocess:                    # clients send these; the function returns the model's inputs
      function: steps:parse        # steps.py in the spec's folder: parse(inputs: dict) -> dict
      inputs:
        - {name: csv, dtype: string}          # per-sample shape, default [1]; dtype string = TYPE_STRING
    postprocess:                   # takes the model's outputs; returns what clients get
      function: steps:name_class
      outputs:
        - {name: label, dtype: string}
    data:
      validation: data/raw.npz     # keyed by the preprocess inputs (strings as numpy unicode arrays)

Each function takes and returns ``{tensor name: numpy array}`` with the batch first (strings as bytes
objects on the server). The module is ONE file beside the spec, importing numpy and the standard library only:
it is published into the step's version folder and runs in the serving image's python backend.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STEP_KEYS = ("function", "inputs", "outputs")
STEP_DTYPES = ("string", "float32", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
FUNCTION = re.compile(r"^[A-Za-z_]\w*:[A-Za-z_]\w*\Z")


@dataclass
class StepTensor:
    name: str
    dtype: str
    shape: list[int] = field(default_factory=lambda: [1])

    @property
    def triton_dtype(self) -> str:
        return "TYPE_STRING" if self.dtype == "string" else "TYPE_" + {
            "float32": "FP32", "float16": "FP16", "float64": "FP64", "bool": "BOOL"}.get(self.dtype, self.dtype.upper())


@dataclass
class StepSpec:
    kind: str  # preprocess | postprocess
    module_file: Path  # the one file the function lives in (published with the step)
    function: str
    tensors: list[StepTensor]  # preprocess: what clients send; postprocess: what they get


def parse_step(raw: Any, kind: str, origin: str, base: Path, fields_class) -> StepSpec | None:
    if raw is None:
        return None
    f = fields_class(raw, kind, STEP_KEYS, origin)
    ref = f.get("function")
    if not isinstance(ref, str) or not FUNCTION.match(ref):
        raise f.error(f"{ref!r} is not 'module:function' (one .py file beside the spec), e.g. steps:parse", "function")
    module, function = ref.split(":")
    module_file = base / f"{module}.py"
    if not module_file.is_file():
        raise f.error(f"{module_file} not found: put {module}.py beside the spec", "function")
    key = "inputs" if kind == "preprocess" else "outputs"
    other = "outputs" if kind == "preprocess" else "inputs"
    if f.get(other) is not None:
        raise f.error(f"a {kind} step's {other} are the model's; list its {key} only", other)
    items = f.get(key)
    if not isinstance(items, list) or not items:
        raise f.error(f"list the tensors clients {'send' if kind == 'preprocess' else 'get'}, e.g. - {{name: text, "
                      "dtype: string}", key)
    tensors = []
    for i, item in enumerate(items):
        t = fields_class(item, f"{kind}.{key}[{i}]", ("name", "dtype", "shape"), origin)
        name = t.get("name")
        if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}\Z", name):
            raise t.error(f"{name!r} is not a tensor name (letters, digits, '_', '.', ':', '-')", "name")
        dtype = t.get("dtype", "float32")
        if dtype not in STEP_DTYPES:
            raise t.error(f"{dtype!r} is not one of {', '.join(STEP_DTYPES)}", "dtype")
        tensors.append(StepTensor(name, dtype, t.int_list("shape", minimum=1, allow_dynamic=True) or [1]))
    return StepSpec(kind, module_file, function, tensors)


def check_steps(spec, top) -> None:
    """The steps against the rest of the spec: a preprocess needs raw validation data to be verified on."""
    if spec.source.kind == "huggingface" and (spec.preprocess or spec.postprocess):
        raise top.error("a Hugging Face source brings its own tokenizer and post-processing steps; remove "
                        "preprocess/postprocess, or build the model with source.module", "preprocess")
    if (spec.preprocess or spec.postprocess) and spec.deploy.monitor:
        raise top.error("deploy.monitor is not available with preprocess/postprocess steps yet; remove one", "deploy")
    if spec.preprocess is not None and spec.data.validation is None:
        raise top.error("a preprocess step is verified on raw inputs: give data.validation, an .npz keyed by the "
                        f"preprocess inputs ({', '.join(t.name for t in spec.preprocess.tensors)}; strings as numpy "
                        "unicode arrays)", "data")
