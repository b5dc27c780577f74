"""`triton-builder init`: a commented spec.yaml drafted from a model, for the user to review and build.

Usage::

    from builder.scaffold.init import init_spec

    result = init_spec(Path("model.onnx"), Path("spec.yaml"))                  # ONNX: read from the graph
    result = init_spec(Path("model.pt"), Path("spec.yaml"), sample=Path("x.npz"))   # TorchScript (+ a sample)
    result = init_spec(Path("model.py:build"), Path("spec.yaml"), sample=Path("x.npz"))   # a factory
    result = init_spec(Path("hf_folder"), Path("spec.yaml"))                   # config.json + tokenizer files
    print("\\n".join(result.lines()))    # what was written, guessed and not inferred; the next command

Every value guessed rather than read from the model is marked ``# review:`` in the file. A sample
(``--sample``) is an .npz keyed by input name, samples first, as data files are (a "labels" array is
left out); it is read with ``allow_pickle=False`` and the model runs once on it for its outputs. An
existing file is never replaced without ``force``; the text is checked with the spec parser before it
is written. A Hugging Face folder also gets ``hf_model.py`` beside the spec (builder/scaffold/huggingface.py).
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.accuracy.input_rules import named_kind
from builder.core.errors import UserInputError
from builder.spec.fields import validate_tensor_name
from builder.spec.model import TRITON_DTYPES, TensorSpec

DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_PROFILE = (1, 16, 64)  # min / opt / max of a dynamic dim (TensorSpec.profile_shapes' defaults)
ONNX_SUFFIXES = (".onnx",)
TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")
SUPPORTED = ("an ONNX file (model.onnx)", "a TorchScript file (model.pt, with --sample FILE.npz for shapes)",
             "a Python factory (model.py:build, with --sample FILE.npz)",
             "a Hugging Face folder (config.json and tokenizer files)")
_PLAIN = re.compile(r"^(?:[A-Za-z_]|\.{1,2}/|/)[A-Za-z0-9_./:-]*(?<!:)\Z")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


@dataclass
class InitResult:
    """What ``init_spec`` wrote: the spec, each field read from the model and each guessed (those
    marked ``# review:``), and what it could not infer, each with what to do about it."""

    path: Path
    kind: str  # onnx | torchscript | module | huggingface
    inferred: dict[str, Any] = field(default_factory=dict)
    guessed: dict[str, Any] = field(default_factory=dict)
    not_inferred: list[str] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)

    @property
    def next_command(self) -> str:
        return f"triton-builder build {_shell_path(self.path)}"

    def lines(self) -> list[str]:
        out = [f"wrote {p}" for p in self.written]
        out.append(f"read from the {self.kind} source: {', '.join(self.inferred) or 'nothing'}")
        if self.guessed:
            out.append(f"guessed (marked '# review:' in {self.path.name}): {', '.join(self.guessed)}")
        if self.not_inferred:
            out.append("could not infer:")
            out += [f"  - {item}" for item in self.not_inferred]
        out.append(f"next: review {self.path.name}, then run: {self.next_command}")
        return out


def _named_kind(t: "Tensor") -> "Value | None":
    """The generation rule transformers' naming gives an input (attention_mask: a padding mask), written
    into the draft: generated cases must be inputs the model could get (builder/accuracy/input_rules.py)."""
    if t.dtype is None or t.shape is None or not isinstance(t.name.value, str):
        return None
    kind = named_kind(TensorSpec(name=t.name.value, dtype=str(t.dtype.value), shape=list(t.shape.value)))
    said = {"padding_mask": "ones, then zero padding", "segments": "token types: zeros, then ones",
            "positions": "0, 1, 2 ..."}
    return Value(kind, f"from its name (transformers' convention): {said[kind]}") if kind else None


def _shell_path(path: Path) -> str:
    try:
        shown = os.path.relpath(path)
    except ValueError:
        shown = str(path)
    return shown if re.fullmatch(r"[\w./-]+", shown) else "'" + shown.replace("'", "'\\''") + "'"


# --------------------------------------------------------------------------------------------
# the draft: values with the reason for each, rendered as commented YAML


@dataclass
class Value:
    """One value of the draft: ``review`` marks a guess; ``note`` says where it came from."""

    value: Any
    note: str = ""
    review: bool = False


@dataclass
class Tensor:
    name: Value
    dtype: Value | None = None
    shape: Value | None = None
    profile: Value | None = None  # (min_shape, opt_shape, max_shape) for a shape with -1 dims
    value_range: Value | None = None
    comment: str = ""  # a comment on the '- name:' line (outputs: the shape seen)


@dataclass
class Draft:
    kind: str
    name: Value
    source: tuple[str, str]  # (source key, value)
    inputs: list[Tensor]
    outputs: list[Tensor]
    max_batch_size: Value
    header: list[str] = field(default_factory=list)
    source_note: str = ""
    weights: Value | None = None
    not_inferred: list[str] = field(default_factory=list)
    extra_files: dict[str, str] = field(default_factory=dict)  # file name beside the spec -> its text
    source_fields: list[tuple[str, Value]] = field(default_factory=list)  # more source keys (huggingface: task)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, str) and (not _PLAIN.match(value) or value.lower() in _YAML_WORDS):
        return json.dumps(value)  # a JSON string is a YAML double-quoted scalar
    return str(value)


class _Writer:
    def __init__(self, result: InitResult):
        self.rows: list[tuple[str, str]] = []
        self.result = result

    def comment(self, text: str) -> None:
        self.rows.append(("# " + text, ""))

    def line(self, text: str, note: str = "") -> None:
        self.rows.append((text, note))

    def value(self, prefix: str, key: str, where: str, v: Value | None) -> None:
        if v is None:
            return
        note = f"review: {v.note}" if v.review else v.note
        self.line(f"{prefix}{key}: {_scalar(v.value)}", note)
        (self.result.guessed if v.review else self.result.inferred)[where] = v.value

    def render(self) -> str:
        width = min(48, max((len(t) for t, n in self.rows if n), default=0) + 2)
        # a line longer than the column keeps one space before its comment ("x#" would be part of a YAML value)
        return "".join(((t.ljust(width) if len(t) < width else t + " ") + f"# {n}" if n else t).rstrip() + "\n"
                       for t, n in self.rows)


def render(draft: Draft, result: InitResult) -> str:
    w = _Writer(result)
    for text in draft.header:
        w.comment(text)
    w.value("", "name", "name", draft.name)
    w.line("source:")
    key, value = draft.source
    w.line(f"  {key}: {_scalar(value)}", draft.source_note)
    result.inferred[f"source.{key}"] = value
    for field_key, field_value in draft.source_fields:
        w.value("  ", field_key, f"source.{field_key}", field_value)
    if draft.source_fields:  # a Hugging Face folder: it says the inputs and outputs
        w.value("", "max_batch_size", "max_batch_size", draft.max_batch_size)
        w.line("# data:", "optional")
        w.line("#   validation: texts.txt", "texts verified on and profiled: one per line (.jsonl, .json too)")
        return w.render()
    if draft.weights is not None:
        w.value("  ", "weights", "source.weights", draft.weights)
    elif draft.kind == "module":
        w.line("  # weights: weights.safetensors", "optional: a state_dict loaded into the module (strict)")
    for section, tensors in (("inputs", draft.inputs), ("outputs", draft.outputs)):
        w.line(f"{section}:")
        for i, t in enumerate(tensors):
            where = f"{section}[{i}]"
            if t.comment:  # said on the name's line
                note = "; ".join(n for n in (t.name.note, t.comment) if n)
                t.name = Value(t.name.value, note, t.name.review)
            w.value("  - ", "name", f"{where}.name", t.name)
            w.value("    ", "dtype", f"{where}.dtype", t.dtype)
            w.value("    ", "shape", f"{where}.shape", t.shape)
            if t.profile is not None:
                note = f"review: {t.profile.note}" if t.profile.review else t.profile.note
                for k, shape in zip(("min_shape", "opt_shape", "max_shape"), t.profile.value):
                    w.line(f"    {k}: {_scalar(shape)}", note)
                    note = ""
                (result.guessed if t.profile.review else result.inferred)[f"{where}.min/opt/max_shape"] = \
                    list(t.profile.value)
            kind = _named_kind(t) if section == "inputs" and t.value_range is None else None
            if t.value_range is not None:
                w.value("    ", "value_range", f"{where}.value_range", t.value_range)
            elif kind is not None:
                w.value("    ", "kind", f"{where}.kind", kind)
            elif section == "inputs" and t.dtype is not None and str(t.dtype.value).startswith(("int", "uint")):
                w.line("    # value_range: [0, 100]", "generated ids (high exclusive): keep them inside the vocabulary")
    w.value("", "max_batch_size", "max_batch_size", draft.max_batch_size)
    w.line("# data:", "optional .npz files keyed by input name, samples first")
    w.line("#   calibration: data/calib.npz", "INT8 calibration samples")
    w.line("#   validation: data/val.npz", "checked against; a 'labels' array adds top-1 accuracy")
    return w.render()


def _profile(shape: list[int], what: str) -> Value:
    low, opt, high = ([size if d == -1 else d for d in shape] for size in DEFAULT_PROFILE)
    return Value((low, opt, high), f"{what}: sizes the build tests (and TensorRT's profiles): give the sizes "
                                   "you serve", review=True)


def model_name(text: str) -> str:
    """``text`` as a Triton model name (letters, digits, '_' and '-'), e.g. 'my model.v2' -> my_model_v2."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_")[:128]
    return name or "model"


# --------------------------------------------------------------------------------------------
# the entry point








def check_tensor_name(name: str, what: str) -> str:
    try:
        return validate_tensor_name(name, what)
    except UserInputError as exc:
        raise UserInputError(f"{exc}; the spec cannot name it: rename it in the model") from None


def relative_to_spec(path: Path, out: Path) -> str:
    try:
        return os.path.relpath(path, out.parent)
    except ValueError:  # another drive (Windows)
        return str(path)


# --------------------------------------------------------------------------------------------
# ONNX: names, dtypes and dims from the graph


def _onnx_dims(value_info) -> list[int | str | None]:
    """Each dim: its size, its symbol, or None where the graph leaves it unnamed (or says -1 / 0)."""
    dims: list[int | str | None] = []
    for d in value_info.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or None)
    return dims


def _onnx_dtype(value_info, what: str, result_notes: list[str]) -> Value:
    import numpy as np
    from onnx import helper


    elem = value_info.type.tensor_type.elem_type
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name
    except (KeyError, TypeError, ValueError):
        dtype = str(elem)
    if dtype in TRITON_DTYPES:
        return Value(dtype)
    result_notes.append(f"{what}.dtype: the graph says {dtype}, which a spec cannot give (supported: "
                        f"{', '.join(TRITON_DTYPES)}); cast it in the model")
    return Value("float32", f"placeholder: the graph's {dtype} is not supported", review=True)


def _show(dims: list) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def onnx_draft(path: Path, out: Path) -> Draft:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file
        raise UserInputError(f"{path}: not a readable ONNX model ({' '.join(str(exc).split())[:200]})") from None
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    graph_inputs = [v for v in graph.input if v.name not in initializers]
    if not graph_inputs or not graph.output:
        raise UserInputError(f"{path}: the graph has no inputs or no outputs; export the model with both")
    notes: list[str] = []
    dims = {v.name: _onnx_dims(v) for v in list(graph_inputs) + list(graph.output)}
    batched = all(dims[v.name] and not isinstance(dims[v.name][0], int) for v in graph_inputs)
    inputs = []
    for i, v in enumerate(graph_inputs):
        check_tensor_name(v.name, f"{path.name}: input")
        tensor = Tensor(Value(v.name), _onnx_dtype(v, f"inputs[{i}]", notes))
        per_sample = dims[v.name][1:] if batched else dims[v.name]
        shape = [d if isinstance(d, int) else -1 for d in per_sample]
        symbols = [f"dim {a} ('{d}')" if d else f"dim {a}" for a, d in enumerate(per_sample) if not isinstance(d, int)]
        tensor.shape = Value(shape, f"{', '.join(symbols)} symbolic in the graph: -1, dynamic" if symbols else "")
        if symbols:
            tensor.profile = _profile(shape, "dynamic dims")
        inputs.append(tensor)
    outputs = []
    for i, v in enumerate(graph.output):
        check_tensor_name(v.name, f"{path.name}: output")
        outputs.append(Tensor(Value(v.name), _onnx_dtype(v, f"outputs[{i}]", notes),
                              comment=f"the graph declares {_show(dims[v.name])}"))
    if batched:
        first = sorted({str(dims[v.name][0]) for v in graph_inputs})
        batch = Value(DEFAULT_MAX_BATCH_SIZE, f"a default: the inputs' first dim is symbolic ({', '.join(first)}), "
                                              "read as the batch; requests are batched up to this", review=True)
    else:
        batch = Value(0, "the graph fixes an input's first dim (or has a scalar input): no batch dimension; to "
                         "batch, re-export with a dynamic first axis", review=True)
    return Draft(kind="onnx", name=Value(model_name(path.stem), "from the file name: the Triton model name",
                                         review=True),
                 source=("onnx", relative_to_spec(path, out)), inputs=inputs, outputs=outputs,
                 max_batch_size=batch, not_inferred=notes,
                 header=[f"Drafted by `triton-builder init` from {path.name} (ONNX): names, dtypes and dims read from "
                         "the graph.", "Every '# review:' is a guess: check it, then run: triton-builder build "
                         f"{out.name}"])


def read_sample(path: Path) -> dict[str, Any]:
    """The sample's arrays by name, samples first ('labels' left out); never unpickled."""
    import numpy as np

    if not zipfile.is_zipfile(path):
        raise UserInputError(f"--sample: {path} is not an .npz archive; save one array per input, keyed by its "
                             "name, samples first: np.savez(path, **arrays)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files if k != "labels"}
    except ValueError as exc:
        raise UserInputError(f"--sample: {path.name} holds Python objects or is unreadable ({exc}); save numeric "
                             "arrays, which are never unpickled") from None
    if not arrays:
        raise UserInputError(f"--sample: {path.name} holds no arrays besides 'labels'; key one per input by name")
    for key, array in arrays.items():
        if array.ndim == 0 or len(array) == 0:
            raise UserInputError(f"--sample: {path.name}['{key}'] has shape {list(array.shape)}: give the samples "
                                 "first (at least one), as data files do, e.g. [1, 3, 224, 224]")
    return arrays
