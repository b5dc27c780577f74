"""Small file helpers shared across the package."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType

from builder.core.errors import UserInputError


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def output_folder(path: str | Path, option: str = "--out") -> Path:
    """``path`` created (with its parents) for a run's reports; a folder that cannot be made (a read-only
    working directory under the default ``runs/...``, a file in the way) is the user's to fix, named by
    ``option``, before the run starts rather than after."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.filename and str(exc.filename) != str(folder):
            reason += f": {exc.filename}"
    else:
        if os.access(folder, os.W_OK | os.X_OK):  # an existing folder on a read-only mount passes mkdir
            return folder
        reason = "not writable"
    raise UserInputError(f"{option} {folder}: cannot write the output folder there ({reason}); pass {option} "
                         "with a writable folder")


def module_from_file(path: Path, name: str) -> ModuleType:
    """The Python file ``path`` executed as a fresh module ``name`` (never registered in sys.modules): the
    pipeline steps' shared code (templates/pipeline/*_steps.py) and the spec's own step functions."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
