"""The ``serve`` processes running on this machine, found by the repository they serve, and what version of a
model each answers with: how ``rollback`` says which version the server answers with afterwards.

``serve`` writes one small record per server under ``<cache>/servers/`` (``~/.cache/triton-builder`` or
``$TRITON_BUILDER_CACHE``; mode 0600): the repository's resolved path, the HTTP and gRPC addresses, the serve
process's pid and the server's ``--id``. Never the control key: reading a version's readiness needs none. The
record goes at a clean stop; one left by a killed serve is skipped (its server no longer answers as that id)
and removed.

Usage::

    with announced(server, repository):           # serve_forever, while it serves
        ...
    for found in servers_of(Path("model_repository")):
        result = await_version(found, "digits_cnn", 1, timeout=30)   # ServedVersion(answering=["1"], ...)
    lines = served_after_rollback(Path("model_repository"), "digits_cnn", 1)  # what rollback prints
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from builder.core.side_env import cache_root
from builder.repository.layout import model_dir
from builder.serving import startup
from builder.serving.client import TritonClient

__all__ = ["RunningServer", "ServedVersion", "announced", "servers_of", "await_version", "records_dir",
           "served_after_rollback"]


def records_dir() -> Path:
    return cache_root() / "servers"


@dataclass(frozen=True)
class RunningServer:
    repository: str
    http_url: str
    grpc_url: str
    pid: int
    server_id: str


@dataclass
class ServedVersion:
    server: RunningServer
    model: str
    wanted: int
    answering: list[str] = field(default_factory=list)  #: the versions ready on that server at the end
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.answering == [str(self.wanted)]

    def line(self) -> str:
        where = f"the running server at http://{self.server.http_url} (triton-builder serve, pid {self.server.pid})"
        if self.ok:
            return f"{where} answers {self.model} with version {self.wanted} (switched in {self.seconds:.1f} s)"
        now = ", ".join(self.answering) or "no ready version"
        return (f"{where} still answers {self.model} with version {now} after {self.seconds:.0f} s (wanted "
                f"{self.wanted}): its log says why; restart it to serve what the repository holds")


def _key(path: Path | str) -> str:
    return str(Path(path).expanduser().resolve())


@contextlib.contextmanager
def announced(server, repository: Path | str) -> Iterator[Path | None]:
    """Record ``server`` (a started ``EmbeddedServer``) as serving ``repository`` for the block. An
    ``s3://`` repository is not recorded (nothing local changes under it)."""
    if str(repository).startswith("s3://"):
        yield None
        return
    record = RunningServer(_key(repository), server.http_url, server.grpc_url, os.getpid(), server.server_id)
    folder = records_dir()
    path = folder / f"{os.getpid()}-{server.server_id}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(record.__dict__, out)
    except OSError:  # a read-only home: rollback then reports no server found, serving is unaffected
        path = None
    try:
        yield path
    finally:
        if path is not None:
            path.unlink(missing_ok=True)


def servers_of(repository: Path | str, answers: Callable[[str, str], bool] = startup.answers_as) -> list[RunningServer]:
    """The servers recorded as serving ``repository`` that still answer as themselves (stale records go)."""
    folder = records_dir()
    if not folder.is_dir():
        return []
    wanted, found = _key(repository), []
    for path in sorted(folder.glob("*.json")):
        try:
            record = RunningServer(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if not answers(record.http_url, record.server_id):
            path.unlink(missing_ok=True)
            continue
        if record.repository == wanted:
            found.append(record)
    return found


def await_version(server: RunningServer, model: str, version: int, timeout: float = 30.0,
                  interval: float = 0.25) -> ServedVersion:
    """Wait until ``server`` answers ``model`` with ``version`` only (the versions ready there, from the
    model's metadata); the result says what it answers with at the end."""
    start = time.monotonic()
    result = ServedVersion(server, model, version)
    with TritonClient(server.http_url, network_timeout=5.0) as client:
        while True:
            try:
                result.answering = sorted(map(str, client.model_metadata(model).get("versions", [])), key=int)
            except Exception:  # noqa: BLE001 - a model being reloaded may answer nothing for a moment
                result.answering = []
            result.seconds = time.monotonic() - start
            if result.ok or result.seconds >= timeout:
                return result
            time.sleep(interval)


def served_after_rollback(repository: Path, name: str, version: int, timeout: float = 30.0,
                          progress: Callable[[str], object] = lambda message: None) -> list[str]:
    """One line per running ``serve`` of ``repository``: the version it answers model ``name`` with once it
    loaded the rollback (a monitored model's versions are its model step's), or one line saying none was found."""
    folder = model_dir(Path(repository), name).name
    found = servers_of(repository)
    if not found:
        return [f"no running `triton-builder serve` of {_key(repository)} was found on this machine: a server "
                f"started from it serves version {version}. A server started otherwise (the NGC image, Kubernetes) "
                f"switches by itself in poll mode; in explicit mode load '{folder}' again over the model-control "
                "API with its key (Triton loads the new version before it unloads the old)"]
    lines = []
    for server in found:
        progress(f"waiting for the server at http://{server.http_url} to answer {folder} with version {version} ...")
        lines.append(await_version(server, folder, version, timeout).line())
    return lines
