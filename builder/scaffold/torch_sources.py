"""`triton-builder init` for PyTorch sources (builder/scaffold/draft.py): a TorchScript file or a Python factory.

Usage::

    draft = torchscript_draft(Path("model.pt"), Path("spec.yaml"), sample=Path("x.npz"))
    draft = module_draft(Path("model.py"), "build", Path("spec.yaml"), sample=None)

Neither records its inputs' dtypes and shapes: with a sample (an .npz keyed by input name, samples
first) they are read from it and the model runs once on its first rows for the outputs' names, dtypes
and shapes; without one the draft holds placeholders marked ``# review:`` and says so. Input names
come from forward()'s signature (TorchScript: its compiled schema).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builder.core.errors import UserInputError
from builder.model.runtime import _named_fields, flatten_outputs
from builder.model.source import forward_parameters, import_factory
from builder.scaffold.draft import (DEFAULT_MAX_BATCH_SIZE, Draft, Tensor, Value, check_tensor_name, model_name,
                                    read_sample, relative_to_spec)
from builder.spec.model import MODULE_PATTERN, TRITON_DTYPES

SAMPLE_ROWS = 4  # the model runs once on at most this many samples


def _header(what: str, out: Path, sample: Path | None) -> list[str]:
    how = f"shapes and dtypes from the sample {sample.name}" if sample else \
        "no sample: shapes and dtypes are placeholders"
    return [f"Drafted by `triton-builder init` from {what}; {how}.",
            f"Every '# review:' is a guess: check it, then run: triton-builder build {out.name}"]


def _is_torchscript(path: Path) -> bool:
    """TorchScript archives hold code/ and constants.pkl beside data.pkl; torch.save's hold data.pkl alone."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return any("/code/" in n or n.endswith("constants.pkl") for n in names)


def torchscript_draft(path: Path, out: Path, sample: Path | None) -> Draft:
    import torch

    if not _is_torchscript(path):
        raise UserInputError(f"{path}: not a TorchScript file (torch.jit.script(model).save(...) or torch.jit.trace); "
                             "a torch.save state_dict or pickled module is not one: give model.py:build instead and "
                             "set source.weights to this file")
    try:
        model = torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as exc:  # noqa: BLE001 - a damaged file or one from a newer torch
        raise UserInputError(f"{path}: torch.jit.load failed ({' '.join(str(exc).split())[:200]})") from None
    draft = _draft(model, "torchscript", sample)
    draft.source = ("torchscript", relative_to_spec(path, out))
    draft.name = Value(model_name(path.stem), "from the file name: the Triton model name", review=True)
    draft.header = _header(f"{path.name} (TorchScript)", out, sample)
    return draft


def module_draft(path: Path, factory: str, out: Path, sample: Path | None) -> Draft:
    """``path``'s ``factory`` as source.module: the spec's folder must hold the file (it is what is importable)."""

    spec_dir = out.parent.resolve()
    try:
        relative = path.resolve().with_suffix("").relative_to(spec_dir)
    except ValueError:
        raise UserInputError(f"{path} is not inside the spec's folder {spec_dir}, the folder a build imports "
                             f"source.module from; write the spec beside it: --out {path.parent / 'spec.yaml'}"
                             ) from None
    ref = f"{'.'.join(relative.parts)}:{factory}"
    if not MODULE_PATTERN.match(ref):
        raise UserInputError(f"{path}: '{ref}' is not an importable 'python.module:callable' from {spec_dir}; "
                             "rename the file or folders to Python identifiers")
    model, _ = import_factory(ref, spec_dir, origin=f"{path.name}:{factory}")
    draft = _draft(model, "module", sample)
    draft.source = ("module", ref)
    stem = path.parent.name if path.stem in ("model", "models", "__init__") else path.stem
    draft.name = Value(model_name(stem), "from the module's name: the Triton model name", review=True)
    weights = sorted(path.parent.glob("*.safetensors"))
    if len(weights) == 1:
        draft.weights = Value(relative_to_spec(weights[0], out), f"the one .safetensors beside {path.name}: loaded "
                              "into the module (strict); remove this line if the factory loads its own", review=True)
    draft.header = _header(f"{path.name}:{factory}", out, sample)
    return draft


def _draft(model, kind: str, sample: Path | None) -> Draft:
    found = forward_parameters(model)
    every = found[0] if found else []
    params = every[:max(found[1], 1)] if found else []  # the required ones (at least one) for placeholders
    notes: list[str] = []
    if sample is None:
        inputs = [Tensor(Value(check_tensor_name(p, "forward() parameter"), "forward()'s parameter"),
                      Value("float32", "placeholder: not inferred", review=True),
                      Value([-1], "placeholder: the per-sample shape, WITHOUT the batch dim", review=True))
                  for p in params] or [Tensor(Value("input", "placeholder: forward()'s signature was not readable",
                                                    review=True),
                                              Value("float32", "placeholder: not inferred", review=True),
                                              Value([-1], "placeholder: the per-sample shape", review=True))]
        outputs = [Tensor(Value("output", "placeholder: one per tensor forward() returns, in order", review=True))]
        where = "TorchScript does not record them" if kind == "torchscript" else "a factory does not declare them"
        notes += [f"inputs' dtypes and shapes ({where}): pass --sample FILE.npz (one array per input, keyed by "
                  "its name, samples first) or edit the placeholders",
                  "outputs' number and names: the model never ran; pass --sample, or list one output per tensor "
                  "forward() returns"]
        batch = Value(DEFAULT_MAX_BATCH_SIZE, "a default: assumes forward() takes a batch first; 0 if it does not",
                      review=True)
        return Draft(kind=kind, name=Value("model"), source=("", ""), inputs=inputs, outputs=outputs,
                     max_batch_size=batch, not_inferred=notes)
    arrays = read_sample(sample)
    names = list(arrays)
    if every and set(names) <= set(every):
        names.sort(key=every.index)
        order_note = ""
    else:
        order_note = f"in the sample's order: forward() takes ({', '.join(every) or '?'}); inputs go BY POSITION"
        notes.append(f"the inputs' order: {sample.name}'s keys ({', '.join(names)}) are not forward()'s parameters "
                     f"({', '.join(every) or 'unreadable'}); list the inputs in forward()'s order")
    inputs = []
    for i, key in enumerate(names):
        array = arrays[key]
        if array.dtype.name not in TRITON_DTYPES:
            raise UserInputError(f"--sample: {sample.name}['{key}'] is {array.dtype.name}; a spec's inputs are one of "
                                 f"{', '.join(TRITON_DTYPES)}: save the array as one")
        inputs.append(Tensor(Value(check_tensor_name(key, f"--sample {sample.name}: key"),
                                   order_note if i == 0 else "", review=bool(order_note)),
                             Value(array.dtype.name, f"from {sample.name}"),
                             Value(list(array.shape[1:]), "from the sample, batch dim left out: a dim whose size "
                                   "varies (a sequence length) should be -1", review=True)))
    outputs, rows = _run(model, [arrays[n] for n in names], sample)
    batch_note = "a default: the sample's first dim read as the batch; requests are batched up to this"
    if any(shape[:1] != [rows] for _, _, _, shape in outputs):
        notes.append(f"the batch: an output's first dim is not the {rows} samples it ran on; if the model takes no "
                     "batch, set max_batch_size: 0 and give each input's full shape")
    tensors = [Tensor(Value(n, "" if named else "placeholder: the model returns unnamed tensors", review=not named),
                      comment=f"{sample.name}'s first {rows} sample(s) gave {dtype} {shape}")
               for n, named, dtype, shape in outputs]
    return Draft(kind=kind, name=Value("model"), source=("", ""), inputs=inputs, outputs=tensors,
                 max_batch_size=Value(DEFAULT_MAX_BATCH_SIZE, batch_note, review=True), not_inferred=notes)


def _run(model, arrays: list[Any], sample: Path) -> tuple[list[tuple[str, bool, str, list[int]]], int]:
    """(name, whether the model named it, dtype, shape) of each output of one run on the sample's first
    rows, and how many rows that was."""
    import numpy as np
    import torch


    rows = min(SAMPLE_ROWS, *(len(a) for a in arrays))
    try:
        with torch.no_grad():
            result = model(*[torch.as_tensor(np.ascontiguousarray(a[:rows])) for a in arrays])
    except Exception as exc:  # noqa: BLE001 - the user's model on the user's sample
        raise UserInputError(f"--sample: the model raised {type(exc).__name__} on {sample.name}'s first {rows} "
                             f"sample(s): {' '.join(str(exc).split())[:300]}; give one array per forward() input, "
                             "keyed by its name, samples first") from None
    found = flatten_outputs(result)
    fields = _named_fields(result)
    names = fields[1] if fields and len(fields[1]) == len(found) else None
    outputs = []
    for i, array in enumerate(found):
        name = names[i] if names else ("output" if len(found) == 1 else f"output_{i}")
        outputs.append((check_tensor_name(name, "output"), names is not None, array.dtype.name, list(array.shape)))
    return outputs, rows
