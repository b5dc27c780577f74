"""Model repository layout: where a model and its versions live, version numbering, and the atomic
publish of a version folder.

Usage::

    with publish_version(repo, "digits_cnn", version=None) as draft:
        shutil.copy(model_file, draft.folder / "model.onnx")   # fill the staging folder
        draft.config_text = rendered_config
    draft.version, draft.path   # set once the version folder has been moved into place

Nothing is visible in the repository until the with-block ends without error; then the finished
version folder is renamed into place (it never replaces an existing version) and config.pbtxt is
replaced atomically. On error the staging folder is removed and the repository is as it was.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from builder.errors import UserInputError
from builder.spec import validate_model_name


def model_dir(repository: Path, name: str) -> Path:
    validate_model_name(name, "model name")
    root = Path(repository).resolve()
    path = (root / name).resolve()
    if path.parent != root:
        raise UserInputError(f"model name {name!r} escapes the repository {root}")
    return path


def existing_versions(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def latest_version(folder: Path) -> int | None:
    versions = existing_versions(folder)
    return versions[-1] if versions else None


def check_version_free(repository: Path, name: str, version: int | None) -> None:
    """Fail early (before any work) if an explicitly requested version already exists."""
    if version is not None and version in existing_versions(model_dir(repository, name)):
        raise UserInputError(
            f"version {version} of model '{name}' already exists in {Path(repository).resolve()}; versions are "
            "never overwritten: remove 'version:' from the spec to take the next free number, or choose another"
        )


def next_version(repository: Path, name: str, requested: int | None = None) -> int:
    """The number a version published now takes: the requested one, else the next free number
    (chosen before the version is described so its metadata can record it; checked again under the
    repository lock when it is published)."""
    if requested is not None:
        return requested
    taken = existing_versions(model_dir(Path(repository).resolve(), name))
    return max(taken) + 1 if taken else 1


@dataclass
class Draft:
    name: str
    folder: Path  # the staging version folder to fill
    config_text: str | None = None
    version: int | None = None  # chosen when the draft opens
    path: Path | None = None  # set once the version folder is in place


@contextlib.contextmanager
def _repository_lock(root: Path) -> Iterator[None]:
    lock_path = root / ".triton-builder.lock"
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def publish_version(repository: Path, name: str, version: int | None = None) -> Iterator[Draft]:
    root = Path(repository).resolve()
    target_model = model_dir(root, name)
    root.mkdir(parents=True, exist_ok=True)
    # staging sits beside the repository (same filesystem: rename is atomic) so Triton never sees it
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-staging-{name}-", dir=root.parent))
    # the number is chosen now so metadata can record it; it is checked again under the lock
    draft = Draft(name=name, folder=staging / "version", version=next_version(root, name, version))
    draft.folder.mkdir()
    created_model_dir = False
    try:
        yield draft
        if draft.config_text is None:
            raise RuntimeError("publish_version: config_text was not set")
        (staging / "config.pbtxt").write_text(draft.config_text)
        with _repository_lock(root):
            if not target_model.exists():
                target_model.mkdir()
                created_model_dir = True
            if draft.version in existing_versions(target_model):
                raise UserInputError(f"version {draft.version} of model '{name}' already exists (published while "
                                     "this build ran?); versions are never overwritten: build again")
            destination = target_model / str(draft.version)
            os.rename(draft.folder, destination)  # atomic: the version appears complete or not at all
            os.replace(staging / "config.pbtxt", target_model / "config.pbtxt")
            draft.path = destination
    except BaseException:
        if created_model_dir and not any(target_model.iterdir()):
            target_model.rmdir()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
