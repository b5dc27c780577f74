"""Triton's model warm-up with the version's own reference data instead of zeros.

A published config's ``model_warmup`` names, per input, a file in the model folder's ``warmup/``
sub-folder (Triton's ``input_data_file``: one sample's raw bytes, row-major, in the config's dtype and
wire dims; Triton repeats it for the warm-up's batch size). The sample is the first sample of the
version's first reference case (a validation case when the spec has data.validation: real traffic, not
zeros, so a warm-up takes the paths real requests take - a dynamically quantized model's scales, an
embedding's real token ids). Inputs whose dtype cannot be stored that way (strings) keep ``zero_data``.

File names carry their content's hash (``<input>.<sha256[:16]>.bin``): a file is never rewritten with
other content, so the config Triton serves never meets a half-written or foreign file, files of
several versions live side by side, and copying one to another model folder (select, s3, the
registry) cannot clash. They are small (one sample) and never removed by the builder.

Usage::

    config, files = with_reference_warmup(config, reference_npz_bytes)  # files: {"warmup/x.<hash>.bin": b"..."}
    files = read_warmup_files(model_folder, config_text)                 # what a copy of that config needs
    array = warmup_array(files[path], "TYPE_FP32", [1, 8, 8])
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import re
from pathlib import Path

import numpy as np

from builder.accuracy.tensors import to_wire
from builder.core.errors import UserInputError
from builder.repository.config import ModelConfig, Warmup, WarmupInput, config_as_dict
from builder.spec.model import TRITON_DTYPES

WARMUP_FOLDER = "warmup"  # Triton reads input_data_file from <model>/warmup/
NUMPY_DTYPES = {triton: numpy for numpy, triton in TRITON_DTYPES.items()}


def with_reference_warmup(config: ModelConfig, reference: bytes | None) -> tuple[ModelConfig, dict[str, bytes]]:
    """``config`` with each warm-up input fed from the reference's first sample, and the files that carries
    (path under the model folder -> bytes). Unchanged (and no files) without warm-ups or reference data."""
    sample = _reference_sample(reference, config) if config.warmups and reference else {}
    files: dict[str, bytes] = {}
    warmups = []
    for warmup in config.warmups:
        inputs = []
        for item in warmup.inputs:
            array = sample.get(item.name)
            if array is None:
                inputs.append(item)
                continue
            data = array.tobytes(order="C")
            path = f"{WARMUP_FOLDER}/{file_name(item.name, data)}"
            files[path] = data
            inputs.append(WarmupInput(item.name, item.data_type, list(array.shape) or [1], data_file=Path(path).name))
        warmups.append(Warmup(warmup.name, warmup.batch_size, inputs))
    return dataclasses.replace(config, warmups=warmups), files


def file_name(input_name: str, data: bytes) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", input_name).strip(".") or "input"
    return f"{safe}.{hashlib.sha256(data).hexdigest()[:16]}.bin"


def warmup_array(data: bytes, data_type: str, dims: list[int]) -> np.ndarray:
    """One warm-up sample from its file's bytes (Triton refuses a file whose size does not match)."""
    dtype = np.dtype(NUMPY_DTYPES[data_type])
    count = int(np.prod(dims)) if dims else 1
    if len(data) != count * dtype.itemsize:
        raise ValueError(f"warm-up data holds {len(data)} bytes; {data_type} dims {dims} need {count * dtype.itemsize}")
    return np.frombuffer(data, dtype=dtype).reshape(dims).copy()


def referenced_files(config_text: str) -> list[str]:
    """The warm-up files (paths under the model folder) a config's model_warmup names."""
    names = []
    for warmup in config_as_dict(config_text).get("model_warmup", []):
        for value in (warmup.get("inputs") or {}).values():
            if value.get("input_data_file"):
                names.append(f"{WARMUP_FOLDER}/{value['input_data_file']}")
    return sorted(set(names))


def read_warmup_files(model_folder: Path, config_text: str) -> dict[str, bytes]:
    """The files ``config_text``'s warm-ups name, read from ``model_folder`` (to publish a copy of that
    config elsewhere). Raises UserInputError naming a missing or altered file."""
    files = {}
    for path in referenced_files(config_text):
        where = Path(model_folder) / path
        if not where.is_file():
            raise UserInputError(f"{where} is missing: config.pbtxt's model_warmup reads it (Triton would not load "
                                 "the model); rebuild the model with triton-builder build")
        data = where.read_bytes()
        if file_name(where.name.rsplit(".", 2)[0], data) != where.name:
            raise UserInputError(f"{where} was changed after it was published (its content no longer matches the hash "
                                 "in its name); rebuild the model with triton-builder build")
        files[path] = data
    return files


def _reference_sample(reference: bytes, config: ModelConfig) -> dict[str, np.ndarray]:
    """Input name -> one sample in the config's wire dims and dtype, from reference.npz's bytes: the first
    validation case when there is one, else the first case."""
    batching = config.max_batch_size > 0
    dims = {t.name: t.dims for t in config.inputs}
    types = {t.name: t.data_type for t in config.inputs}
    with np.load(io.BytesIO(reference), allow_pickle=False) as archive:
        keys = [k.split("/", 2) for k in archive.files if k.startswith("input/")]
        cases = sorted({case for _, case, _ in keys})
        if not cases:
            return {}
        chosen = next((c for c in cases if c.split("_", 1)[1].startswith("val")), cases[0])
        sample = {}
        for _, case, name in keys:
            if case != chosen or name not in dims or types[name] not in NUMPY_DTYPES:
                continue
            array = archive[f"input/{case}/{name}"]
            if batching:
                array = to_wire(array[:1], dims[name], True)[0]
            else:
                array = to_wire(array, dims[name], False)
            sample[name] = np.ascontiguousarray(array, dtype=NUMPY_DTYPES[types[name]])
    return sample
