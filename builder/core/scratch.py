"""Scratch folders that are recognisably ours and owned by a live process, so nothing a killed build
leaves behind survives the next build (or ``triton-builder clean``).

A scratch folder is named ``<prefix><pid>-<random>`` and holds ``.owner.lock``, which its process
keeps locked (flock) while it lives; the kernel drops the lock when the process dies, however it
dies. A folder whose lock can be taken belongs to nobody and is removed by ``sweep``.

Usage::

    folder = OwnedFolder.create(Path(tempfile.gettempdir()), WORK_PREFIX)
    try:
        ...                                     # use folder.path
    finally:
        folder.release()                        # removes it
    sweep(Path(tempfile.gettempdir()), WORK_PREFIX)   # what dead builds left: removed, listed
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator

from builder.core.processes import pid_alive

WORK_PREFIX = "triton-builder-work-"  # a build's work folder, in the temp dir
LOCK_NAME = ".owner.lock"

__all__ = ["OwnedFolder", "WORK_PREFIX", "sweep", "staging_parent", "staging_prefix"]


def staging_prefix(repository: Path) -> str:
    """Staging folders of ``repository`` sit beside it (same file system: the final rename is atomic;
    outside it: Triton never loads them)."""
    return f".{Path(repository).resolve().name}.triton-builder-staging-"


def staging_parent(repository: Path) -> Path:
    return Path(repository).resolve().parent


@dataclass
class OwnedFolder:
    path: Path
    _lock: IO[str] | None

    @classmethod
    def create(cls, parent: Path, prefix: str, label: str = "") -> "OwnedFolder":
        parent.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{label + '-' if label else ''}", dir=parent))
        lock = open(path / LOCK_NAME, "w")
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else holds it
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        return cls(path, lock)

    def release(self) -> None:
        """Remove the folder (and drop the lock last, so no sweeper races the removal)."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _owner_pid(name: str, prefix: str) -> int | None:
    head = name[len(prefix):].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def sweep(parent: Path, prefix: str) -> list[Path]:
    """Remove the ``prefix`` folders in ``parent`` whose owner is gone; returns what was removed."""
    removed = []
    try:
        entries = [p for p in Path(parent).iterdir() if p.name.startswith(prefix) and p.is_dir()]
    except OSError:
        return removed
    for folder in entries:
        lock_path = folder / LOCK_NAME
        try:
            handle = open(lock_path, "r+")
        except FileNotFoundError:
            # killed between creating the folder and its lock: the pid in the name decides
            pid = _owner_pid(folder.name, prefix)
            if pid is None or not pid_alive(pid):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
            continue
        except OSError:
            continue
        with contextlib.closing(handle):
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    continue  # a live process owns it
                raise
            shutil.rmtree(folder, ignore_errors=True)  # removed while we hold its lock
            removed.append(folder)
    return removed


@contextlib.contextmanager
def work_folder(label: str = "", prefix: str = WORK_PREFIX) -> Iterator[Path]:
    """A work folder in the temp dir (a build's by default; ``prefix`` names another kind), removed after the
    block; what killed processes left there under the same prefix is swept first."""
    root = Path(tempfile.gettempdir())
    sweep(root, prefix)
    folder = OwnedFolder.create(root, prefix, label)
    try:
        yield folder.path
    finally:
        folder.release()
