"""Model repository layout: where a model and its versions live, version numbering, and the atomic
publish of a version folder.

Usage::

    with publish_version(repo, "digits_cnn", version=None) as draft:   # or reservation=reserve_version(...)
        shutil.copy(model_file, draft.folder / "model.onnx")   # fill the staging folder
        draft.config_text = rendered_config
    draft.version, draft.path   # set once the version folder has been moved into place

Nothing is visible in the repository until the with-block ends without error. A model's first
version appears with its config.pbtxt in one rename of the whole staged model folder; a later
version folder is renamed into place (it never replaces an existing version), then config.pbtxt is
replaced atomically - only when the new version is the highest: one published below a higher version
(``draft.config_replaced`` False, ``draft.note`` says so) leaves the config the higher one is served
with. On error the staging folder is removed and the repository is as it was; a staging folder a
killed build left is owned by nobody and removed by the next publish (builder/core/scratch.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from builder.core.errors import UserInputError
from builder.core.scratch import WORK_PREFIX, OwnedFolder, staging_parent, staging_prefix, sweep
from builder.spec.model import validate_model_name

RESERVATION_FILE = "reserved-version"  # in a staging folder: the model name and version, a line each

#: deploy.monitor (builder/repository/monitored.py): ensemble <name> over <name>__model and <name>__monitor
MODEL_SUFFIX = "__model"
MONITOR_SUFFIX = "__monitor"
#: a version folder's model file, by variant format
MODEL_FILES = {"onnx": "model.onnx", "torchscript": "model.pt", "openvino": "model.xml", "plan": "model.plan"}
#: a Hugging Face source (builder/repository/pipeline.py): ensemble <name> over <name>__preprocess, <name>__model
#: and (classification) <name>__postprocess
PREPROCESS_SUFFIX = "__preprocess"
POSTPROCESS_SUFFIX = "__postprocess"


def model_dir(repository: Path, name: str, resolve: bool = True) -> Path:
    """The folder holding model ``name``'s versions: for a monitored model (``name`` is an ensemble over
    ``name__model``) that folder, unless ``resolve`` is False (the ensemble's own folder)."""
    validate_model_name(name, "model name")
    root = Path(repository).resolve()
    path = (root / name).resolve()
    if path.parent != root:
        raise UserInputError(f"model name {name!r} escapes the repository {root}")
    if resolve and is_monitored(root, name):
        return root / (name + MODEL_SUFFIX)
    return path


def is_monitored(repository: Path, name: str) -> bool:
    """Whether ``name`` is the ensemble of a monitored model (deploy.monitor)."""
    config = Path(repository) / name / "config.pbtxt"
    if not (Path(repository) / (name + MODEL_SUFFIX) / "config.pbtxt").is_file() or not config.is_file():
        return False
    return any(line.split("#")[0].replace(" ", "") == 'platform:"ensemble"' for line in config.read_text().splitlines())


def is_pipeline(repository: Path, name: str) -> bool:
    """Whether ``name`` is the ensemble of a pipeline: a model step with pre- and/or post-processing steps (a Hugging
    Face source's, or the spec's own preprocess/postprocess)."""
    return is_monitored(repository, name) and any((Path(repository) / (name + suffix) / "config.pbtxt").is_file()
                                                  for suffix in (PREPROCESS_SUFFIX, POSTPROCESS_SUFFIX))


def model_names(repository: Path) -> list[str]:
    """The models of a repository: its visible folders holding config.pbtxt."""
    root = Path(repository)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if not p.name.startswith(".") and p.is_dir() and (p / "config.pbtxt").is_file())


def not_in_repository(name: str, repository: Path, where: str = "--repository") -> UserInputError:
    """Model ``name`` is not in ``repository``: the models it does hold, so a typo is seen at once."""
    root = Path(repository).resolve()
    models = model_names(root)
    have = f"its models: {', '.join(models)}" if models else "it holds no models"
    return UserInputError(f"model '{name}' is not in {root} ({have}); name one of them, or pass the {where} that "
                          f"holds '{name}'")


def require_model_repository(repository: Path, where: str = "--repository") -> Path:
    """``repository`` resolved when it is one (its folders are models; an empty folder is a repository
    not built into yet), else an error saying what was found and what a repository looks like: a
    command that acts on whatever it is given (clean removes folders beside it) must not guess."""
    root = Path(repository).resolve()
    shape = ("a model repository is a folder of model folders, each holding config.pbtxt and numbered version "
             "folders (1/, 2/, ...): pass the folder builds publish into (build --repository)")
    if not root.exists():
        raise UserInputError(f"{where} {repository}: no model repository there (no such folder); {shape}")
    if not root.is_dir():
        raise UserInputError(f"{where} {repository}: no model repository there (a file, not a folder); {shape}")
    if (root / "config.pbtxt").is_file():
        raise UserInputError(f"{where} {repository}: this is a model folder (it holds config.pbtxt); pass the "
                             f"repository above it: {where} {root.parent}")
    # files beside the models (the checkout's own model_repository/README.md) are no models to Triton either
    folders = [p for p in root.iterdir() if not p.name.startswith(".") and p.is_dir()]
    if folders and not model_names(root):
        raise UserInputError(f"{where} {repository}: no model repository there (none of its {len(folders)} "
                             f"folder(s) is a model folder with config.pbtxt); {shape}")
    return root


def is_version_name(name: str) -> bool:
    """A folder name Triton loads as a version: ASCII digits without a leading zero. Triton skips "02"
    (it logs "contains leading zeros" and never loads it), so it is no version here either: reading it
    as 2 named a folder 2/ that does not exist."""
    return name.isascii() and name.isdigit() and (name == "0" or not name.startswith("0"))


def existing_versions(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and is_version_name(p.name))


def misnamed_versions(folder: Path) -> list[str]:
    """Version-like folders Triton ignores (digits with a leading zero, "02"): validate names them."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir()
                  if p.is_dir() and p.name.isascii() and p.name.isdigit() and not is_version_name(p.name))


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


@dataclass
class Draft:
    name: str
    folder: Path  # the staging version folder to fill
    config_text: str | None = None
    version: int | None = None  # chosen when the draft opens
    path: Path | None = None  # set once the version folder is in place
    config_replaced: bool = True  # False: a higher version was there, its config.pbtxt was kept
    note: str = ""  # what the caller should tell the user (a version published below the latest)
    # files of the model folder the config reads (warmup/...: content-addressed, never rewritten with other bytes)
    model_files: dict[str, bytes] = field(default_factory=dict)


LOCK_FILE = ".triton-builder.lock"


def not_writable(root: Path, reason: str, where: str = "--repository") -> UserInputError:
    return UserInputError(f"{where} {root}: the model repository is not writable ({reason}); it must be writable "
                          f"to publish or tune into it: fix its permissions or mount, or choose another {where}")


def _why_not_writable(folder: Path) -> str | None:
    """Why ``folder`` (an existing folder) cannot take new files, or None when it can. os.access sees a
    read-only mount even as root (whom permission bits do not stop)."""
    if os.access(folder, os.W_OK | os.X_OK):
        return None
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    return "permission denied"


def require_writable(repository: Path, where: str = "--repository", staged: bool = True) -> None:
    """Refuse, before any work, a repository that a publish could not write: a read-only mount or
    another user's folder would otherwise fail only at the end (the lock file, the rename); ``staged``
    (a new version, not a config rewritten in place): also where its staging folder could not be made.
    Writes nothing: a repository that does not exist yet is judged by the nearest folder that does."""
    root = Path(repository).resolve()
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return  # a file where the folder should be: the callers' own checks name it
    reason = _why_not_writable(existing)
    if reason is None and (existing / LOCK_FILE).exists() and not os.access(existing / LOCK_FILE, os.W_OK):
        reason = f"its {LOCK_FILE} cannot be opened for writing"
    if reason is not None:
        raise not_writable(root, reason if existing == root else f"{existing}: {reason}", where)
    if staged:
        _require_staging_beside(root, existing, where)


def _require_staging_beside(root: Path, existing: Path, where: str) -> None:
    """Versions are staged beside the repository (Triton tries to load every folder inside it, hidden ones
    too) and renamed in, which needs the parent writable and on the same file system: a repository that is
    itself a mount point (a Docker or Kubernetes volume, NFS) failed at the very end with EXDEV."""
    parent = staging_parent(root)
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    fix = (f"pass a folder inside it instead ({where} {root / 'model_repository'}) and point Triton's "
           "--model-repository there, or mount the volume one level up")
    if existing == root and parent.is_dir() and os.stat(parent).st_dev != os.stat(root).st_dev:
        raise UserInputError(f"{where} {root}: the repository is a mount point (its parent {parent} is another file "
                             "system), and versions are staged beside it so that each appears in one rename; "
                             + fix)
    reason = _why_not_writable(parent) if parent.is_dir() else None
    if reason is not None:
        raise UserInputError(f"{where} {root}: its parent folder {parent} is not writable ({reason}), and versions "
                             "are staged beside the repository so that each appears in one rename; " + fix)


def atomic_write(root: Path, target: Path, content: str | bytes) -> None:
    """Replace ``target`` (a file in a model folder of repository ``root``) with ``content`` at once: written to
    a temporary file in ``root`` (never a half-written file in a model folder), then renamed over it (0644)."""
    handle, tmp = tempfile.mkstemp(prefix=f".{target.parent.name}.{target.name}.", suffix=".tmp", dir=root)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(content.encode("utf-8") if isinstance(content, str) else content)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@contextlib.contextmanager
def reading_lock(root: Path) -> Iterator[None]:
    """Shared hold of the repository's lock while a reader (``serve``'s watch) reads and loads a consistent
    state: a publish, a rollback or a tune holds it exclusively while it writes. Nothing to hold (no lock
    file yet, or one this user cannot open) reads as it is: publishing is atomic without it."""
    try:
        handle = open(Path(root) / LOCK_FILE)
    except OSError:
        yield
        return
    with _held(handle, fcntl.LOCK_SH):
        yield


@contextlib.contextmanager
def _repository_lock(root: Path) -> Iterator[None]:
    lock_path = root / LOCK_FILE
    try:
        handle = open(lock_path, "w")
    except OSError as exc:  # checked up front by require_writable; this is the mount changing since
        raise not_writable(root, exc.strerror or str(exc)) from None
    with _held(handle, fcntl.LOCK_EX):
        yield


@contextlib.contextmanager
def _held(handle, mode: int) -> Iterator[None]:
    with handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _place_model_files(root: Path, model: Path, files: dict[str, bytes]) -> None:
    """Files of a model folder that its new config reads, each written whole (a temp file in the repository
    root, then a rename) unless it is already there with the same bytes."""
    for relative, data in files.items():
        target = model / relative
        if target.is_file() and target.read_bytes() == data:
            continue
        if not target.parent.is_dir():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.parent.chmod(0o755)
        atomic_write(root, target, data)


def _readable_by_all(folder: Path) -> None:
    """Files 0644, folders 0755 whatever the builder's umask: Triton often runs as another user."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def make_folders(folder: Path) -> None:
    """``mkdir -p`` whose new folders are 0755 whatever the umask: under umask 077 a repository root
    (or a parent) made 0700 hides the 0644 files inside from Triton running as another user. Folders
    that already existed keep their modes: they are the user's."""
    missing = []
    current = Path(folder)
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:  # another build made it meanwhile: its mode is that build's to set
            continue
        path.chmod(0o755)


@dataclass
class Reservation:
    """A version number held for one publish: its owned staging folder records it, so concurrent
    builds into the same repository take distinct numbers; released (with the folder) when done."""
    repository: Path
    name: str
    version: int
    staging: OwnedFolder


def _reserved(root: Path, name: str) -> set[int]:
    """Versions of ``name`` held by live builds' staging folders (dead ones were swept)."""
    held = set()
    for folder in staging_parent(root).glob(staging_prefix(root) + "*"):
        try:
            owner, number = (folder / RESERVATION_FILE).read_text().split("\n")[:2]
        except (OSError, ValueError):
            continue
        if owner == name and number.isdigit():
            held.add(int(number))
    return held


@contextlib.contextmanager
def reserve_version(repository: Path, name: str, requested: int | None = None) -> Iterator[Reservation]:
    """Hold the version a publish will take (``requested``, else the next number neither published
    nor held by a live build) and its staging folder, beside the repository (same file system:
    renames are atomic; outside it: Triton never loads it), owned by this process: a build killed
    now leaves a folder the next one removes."""
    root = Path(repository).resolve()
    model_dir(root, name, resolve=False)
    try:
        make_folders(root)
    except OSError as exc:
        raise not_writable(root, exc.strerror or str(exc)) from None
    with _repository_lock(root):
        sweep(staging_parent(root), staging_prefix(root))
        taken = set(existing_versions(root / name)) | _reserved(root, name)
        if requested is not None and requested in taken:
            raise UserInputError(f"version {requested} of model '{name}' already exists or is being published by "
                                 "another build; versions are never overwritten: remove 'version:' from the spec "
                                 "to take the next free number, or choose another")
        version = requested if requested is not None else max(taken, default=0) + 1
        staging = OwnedFolder.create(staging_parent(root), staging_prefix(root), name)
        (staging.path / RESERVATION_FILE).write_text(f"{name}\n{version}\n")
    try:
        yield Reservation(root, name, version, staging)
    finally:
        staging.release()


@contextlib.contextmanager
def publish_version(repository: Path, name: str, version: int | None = None,
                    reservation: Reservation | None = None) -> Iterator[Draft]:
    if reservation is None:
        with reserve_version(repository, name, version) as own, \
                publish_version(repository, name, reservation=own) as draft:
            yield draft
        return
    root = reservation.repository
    target_model = model_dir(root, name, resolve=False)
    # the whole model folder is staged: a model's first version appears with its config in one rename
    staged_model = reservation.staging.path / "model"
    draft = Draft(name=name, folder=staged_model / "version", version=reservation.version)
    draft.folder.mkdir(parents=True)
    # a failure leaves the staged folder to the reservation, which removes it on release
    yield draft
    if draft.config_text is None:
        raise RuntimeError("publish_version: config_text was not set")
    (staged_model / "config.pbtxt").write_text(draft.config_text)
    for relative, data in draft.model_files.items():
        (staged_model / relative).parent.mkdir(parents=True, exist_ok=True)
        (staged_model / relative).write_bytes(data)
    _readable_by_all(staged_model)
    with _repository_lock(root):
        if draft.version in existing_versions(target_model):
            raise UserInputError(f"version {draft.version} of model '{name}' already exists (published while "
                                 "this build ran?); versions are never overwritten: build again")
        destination = target_model / str(draft.version)
        if not target_model.exists():
            draft.folder.rename(staged_model / str(draft.version))
            os.rename(staged_model, target_model)  # atomic: model, config and version at once
        else:
            # decided under the lock, at the rename: a version whose number is below one already there (an
            # explicit lower `version:`, or a concurrent build that finished first) must not rewrite the
            # config Triton serves the higher version with (version_policy latest); a reservation can't tell
            # this early, since builds finish in any order
            higher = max(existing_versions(target_model), default=None)
            os.rename(draft.folder, destination)  # atomic: the version appears complete or not at all
            if higher is not None and higher > draft.version:
                draft.config_replaced = False
                draft.note = (f"version {draft.version} of '{name}' was published below version {higher}: "
                              f"config.pbtxt was kept as version {higher} has it (it is the config Triton serves "
                              f"version {higher} with), so a latest version_policy goes on serving {higher}, not "
                              f"{draft.version}; to serve this build, build it without 'version:' (it takes the "
                              "next number)")
            else:
                _place_model_files(root, target_model, draft.model_files)  # before the config that reads them
                os.replace(staged_model / "config.pbtxt", target_model / "config.pbtxt")
        draft.path = destination


def clean(repository: Path | None = None) -> list[Path]:
    """Every scratch folder a dead build left: work folders in the temp dir and, with a repository,
    its staging folders. Returns what was removed (``triton-builder clean``). ``repository`` must be
    one (UserInputError otherwise, before anything is removed): its staging folders are looked for
    beside it, and "nothing to clean" for a mistyped path would hide the mistake."""
    if repository is not None:
        repository = require_model_repository(repository)
    removed = sweep(Path(tempfile.gettempdir()), WORK_PREFIX)
    if repository is not None:
        removed += sweep(staging_parent(repository), staging_prefix(repository))
    return removed


def companion_name(model_name: str, main: Path, companion: Path) -> str:
    """A companion's name in the version folder: ONNX external data keeps its suffix after the main
    file's name (``model.onnx.data``), a file sharing the main file's stem keeps its extension (an
    OpenVINO IR's ``model.bin`` beside ``model.xml``)."""
    if companion.name.startswith(main.name):
        return model_name + companion.name[len(main.name):]
    return Path(model_name).stem + companion.name[len(main.stem):]
