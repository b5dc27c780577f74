"""The per-version artifact record (metadata.yaml) and the reference cases (reference.npz).

Usage::

    write_reference(folder / "reference.npz", cases, outputs)   # or reference_bytes(cases, outputs)
    cases, outputs = read_reference(folder / "reference.npz")
    write_metadata(folder / "metadata.yaml", {...}); read_metadata(folder / "metadata.yaml")
"""

from __future__ import annotations

import io
import platform
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from builder.core.errors import UserInputError


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for module in ("torch", "onnx", "onnxruntime", "numpy"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = "not installed"
    from importlib.metadata import PackageNotFoundError, version
    try:  # without importing it (slow): the OpenVINO that saved an IR variant (docker/triton/Dockerfile)
        versions["openvino"] = version("openvino")
    except PackageNotFoundError:
        versions["openvino"] = "not installed"
    try:
        versions["triton_builder"] = version("triton-builder")
    except PackageNotFoundError:
        versions["triton_builder"] = "source"
    return versions


def write_reference(path: Path, cases: list[dict[str, Any]], outputs: list[dict[str, np.ndarray]]) -> None:
    path.write_bytes(reference_bytes(cases, outputs))


def reference_bytes(cases: list[dict[str, Any]], outputs: list[dict[str, np.ndarray]]) -> bytes:
    """The reference cases as the bytes of reference.npz."""
    arrays = {}
    for index, (case, out) in enumerate(zip(cases, outputs)):
        prefix = f"{index:03d}_{case['id']}"
        for name, value in case["inputs"].items():
            arrays[f"input/{prefix}/{name}"] = value
        for name, value in out.items():
            arrays[f"output/{prefix}/{name}"] = value
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def read_reference(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, np.ndarray]]]:
    if not path.is_file():
        raise UserInputError(f"{path} is missing: this version has no reference cases; rebuild it with triton-builder build")
    cases: dict[str, dict[str, Any]] = {}
    outputs: dict[str, dict[str, np.ndarray]] = {}
    try:
        # never unpickled: numpy's "pickled data" ValueError is what a truncated, replaced or object-array
        # file raises, alike with zip and key-layout errors; all mean the file is not what build wrote
        with np.load(path, allow_pickle=False) as archive:
            for key in archive.files:
                kind, case_key, name = key.split("/", 2)
                if kind == "input":
                    cases.setdefault(case_key, {"id": case_key.split("_", 1)[1], "inputs": {}})["inputs"][name] = \
                        archive[key]
                else:
                    outputs.setdefault(case_key, {})[name] = archive[key]
        order = sorted(cases)
        return [cases[k] for k in order], [outputs[k] for k in order]
    except (ValueError, OSError, EOFError, KeyError, IndexError, zipfile.BadZipFile, zlib.error) as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise UserInputError(f"{path}: not a plain numeric .npz of reference cases as build writes it ({reason}); "
                             "it is never unpickled: rebuild the version with triton-builder build (or restore "
                             "the file from where the version was published)") from None


def numeric_output_names(meta: dict[str, Any]) -> list[str]:
    """The version's outputs that hold numbers, in order: what replays and version-to-version comparisons run and
    compare (a classifier's folded label head also answers ``label``, a string: builder/huggingface/label_head.py)."""
    return [o["name"] for o in meta["spec"]["outputs"] if o.get("dtype") != "string"]


def write_metadata(path: Path, record: dict[str, Any]) -> None:
    import yaml
    path.write_text(yaml.safe_dump(_plain(record), sort_keys=False, width=120))


def read_metadata(path: Path) -> dict[str, Any]:
    import yaml
    if not path.is_file():
        raise UserInputError(f"{path} is missing: not a version built by triton-builder")
    return yaml.safe_load(path.read_text())


def _plain(value: Any) -> Any:
    """numpy scalars, Paths and tuples as plain YAML-safe values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (Path, str)):
        return str(value)  # also str subclasses such as torch's TorchVersion
    if isinstance(value, np.generic):
        return value.item()
    return value
