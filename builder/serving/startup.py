"""How an ``EmbeddedServer`` start is judged (builder/serving/embedded.py): whose server answers the
readiness probe, which port another process took, which models loaded, the extra environment the
server and its python stubs run in, and what they leave behind (bytecode, a killed owner's temp folder).

Usage::

    server_id = new_server_id()                       # passed as tritonserver --id=...
    answers_as("127.0.0.1:8000", server_id)           # True only for OUR server on that port
    failed = wait_for_start_models(server)            # {name: "STATE: reason"} once none is loading
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from builder.core.errors import ServerError
from builder.core.processes import http_get, pid_alive
from builder.serving.server_log import readable

if TYPE_CHECKING:
    from builder.serving.embedded import EmbeddedServer

__all__ = ["SERVER_ENVIRONMENT", "bytecode_dirs", "precompile_bytecode", "remove_new_bytecode", "sweep_killed_workdirs", "new_server_id",
           "answers_as", "busy_port_error", "wait_for_start_models", "load_error", "shm_files", "remove_orphan_shm",
           "remove_dead_server_folders"]

SERVER_ENVIRONMENT = {
    # no bytecode next to served files from any python the server starts (the stub's own interpreter
    # ignores it: remove_new_bytecode)
    "PYTHONDONTWRITEBYTECODE": "1",
    # onnxruntime (1.31) in a stub otherwise writes a device id and a telemetry event queue under
    # ~/.cache/Microsoft on every session
    "ORT_DISABLE_TELEMETRY": "1",
}


def bytecode_dirs(repository: Path | None) -> set[Path]:
    """Every ``__pycache__`` folder inside ``repository``'s version folders (none for None: s3://)."""
    if repository is None or not repository.is_dir():
        return set()
    return {p for p in repository.glob("*/*/**/__pycache__") if p.is_dir()}


def precompile_bytecode(repository: Path | None) -> None:
    """Write the bytecode of every ``.py`` in ``repository``'s version folders before a poll-mode start. The stub
    would write it while a model loads, changing the version folder Triton polls: poll mode then reloaded every
    python model in place once or twice after its load, under traffic (Triton 2.51 crashed, "malloc(): unaligned
    fastbin chunk", when that reload met another model's load). Valid bytecode there is read, never rewritten; it
    is removed at the stop like the stub's (``remove_new_bytecode``)."""
    import py_compile

    if repository is None or not repository.is_dir():
        return
    for source in repository.glob("*/*/**/*.py"):
        if "__pycache__" not in source.parts:
            py_compile.compile(str(source), doraise=False, quiet=2)


def remove_new_bytecode(repository: Path | None, before: set[Path]) -> None:
    """Remove the ``__pycache__`` folders that appeared since ``before``. The python backend's stub
    imports model.py in an isolated interpreter (pybind11 ignores PYTHONDONTWRITEBYTECODE) and writes
    its bytecode into the served version folder, changing a published version's contents; it does so
    once, while the model loads. A folder that was there before the server started is left alone."""
    for folder in bytecode_dirs(repository) - before:
        shutil.rmtree(folder, ignore_errors=True)



SHM = Path("/dev/shm")
# the python backend's shared-memory regions, and model.py's shared drift windows
SHM_PREFIXES = ("triton_python_backend_shm_region_", "triton_builder_drift_")


def shm_files(folder: Path = SHM) -> set[str]:
    """The names in ``folder`` that a tritonserver's python backend and our model.py create."""
    try:
        return {p.name for p in folder.iterdir() if p.name.startswith(SHM_PREFIXES)}
    except OSError:
        return set()


def _in_use(folder: Path) -> set[str]:
    """The names in ``folder`` some process maps or holds open (every /proc/<pid>/maps and fd/ readable here)."""
    used: set[str] = set()
    prefix = str(folder) + "/"
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            used.update(line.split(prefix, 1)[1].split()[0] for line in (proc / "maps").read_text().splitlines()
                        if prefix in line)
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith(prefix):
                    used.add(target[len(prefix):].split()[0])
        except OSError:  # gone, or another user's: its files are not ours to remove (sticky /dev/shm) either
            continue
    return used


def remove_orphan_shm(before: set[str], folder: Path = SHM) -> list[str]:
    """Remove what appeared in ``folder`` since ``before`` (``shm_files``) and no process maps or holds open:
    a server that failed to start (its ports taken by a racing one) or was killed leaves the python backend's
    1 MB regions and the drift windows behind, and nothing else removes them. The names removed."""
    new = shm_files(folder) - before
    if not new:
        return []
    orphans = sorted(new - _in_use(folder))
    for name in orphans:
        try:
            (folder / name).unlink()
        except OSError:
            pass
    return orphans

def sweep_killed_workdirs(workdir: Path) -> None:
    """Mark ``workdir`` as this process's and remove the ``triton-embedded-*`` folders beside it whose
    owner was killed: SIGKILL runs no clean-up, and those folders piled up in $TMPDIR. One that still
    holds backends/ was never stopped (every stop removes it; a failed start keeps only its log, which
    its error named); one whose owner is alive is in use."""
    (workdir / "owner.pid").write_text(str(os.getpid()))
    for other in workdir.parent.glob("triton-embedded-*"):
        try:
            owner = int((other / "owner.pid").read_text()) if (other / "backends").is_dir() else None
        except (OSError, ValueError):  # another user's, or from before owner.pid was written
            continue
        if owner is not None and other != workdir and not pid_alive(owner):
            shutil.rmtree(other, ignore_errors=True)



def remove_dead_server_folders(parent: Path) -> list[Path]:
    """Remove every ``triton-embedded-*`` folder in ``parent`` whose owner has ended (``clean``): those a
    killed owner left, and those a failed start, a crash or a hung stop kept for their log (the error named
    it; by now it has been read). A live owner's is in use; another user's is left alone. The removed ones."""
    removed = []
    for other in sorted(parent.glob("triton-embedded-*")):
        try:
            owner = int((other / "owner.pid").read_text())
        except (OSError, ValueError):  # another user's, or from before owner.pid was written
            continue
        if not pid_alive(owner):
            shutil.rmtree(other, ignore_errors=True)
            removed.append(other)
    return removed

def new_server_id() -> str:
    """A name for one tritonserver process (``--id``; ``GET /v2`` answers it as "name")."""
    return f"triton-builder-{os.getpid()}-{secrets.token_hex(4)}"


def answers_as(http_url: str, server_id: str) -> bool:
    """Whether the server answering on ``http_url`` is the one started with ``--id=server_id``: a 200
    from another server on the same port (two serves racing for 8000) is not ours."""
    status, body = http_get(f"http://{http_url}/v2", timeout=1.0)
    if status != 200:
        return False
    try:
        return json.loads(body).get("name") == server_id
    except (ValueError, AttributeError):
        return False


def busy_port_error(log: str, host: str, fixed_ports: Sequence[tuple[str, int | None]],
                    log_path: Path | None) -> ServerError | None:
    """The error for a server that could not bind a port asked for by number (None if the log says
    nothing of the kind): the port was free when checked, and another process took it meanwhile."""
    busy = next((line.strip() for line in log.splitlines() if "already in use" in line), None)
    if busy is None:
        return None
    found = re.search(r":(\d+)'", busy)
    port = int(found.group(1)) if found else None
    option = next((opt for opt, asked in fixed_ports if asked is not None and asked == port), None)
    where = f"{host}:{port}" if port is not None else "one of its ports"
    fix = (f"pass a free port with {option}" if option else
           "choose free ports with --http-port/--grpc-port/--metrics-port")
    return ServerError(f"tritonserver could not bind {where}: another process listens there (another server "
                       f"started at the same time?); {fix}, or stop the other process. Triton said: {busy}\n"
                       f"full log: {log_path}")


def wait_for_start_models(server: "EmbeddedServer") -> dict[str, str]:
    """Wait (within the server's ready deadline) until none of ``server.models`` is loading; returns
    ``{name: "STATE: reason"}`` for each that did not become READY, Triton's reason or its log lines."""
    while True:
        states = {entry.get("name"): entry for entry in server.repository_index()}
        pending = [n for n in server.models if states.get(n, {}).get("state") in (None, "LOADING", "UNLOADING")]
        if not pending:
            break
        server.check_alive()
        if time.monotonic() > server._ready_deadline:
            raise ServerError(f"models still loading after {server.ready_timeout:g} s: {', '.join(pending)}; "
                              f"full log: {server.log_path}")
        time.sleep(0.1)
    failed = {}
    for name in server.models:
        entry = states[name]
        if entry.get("state") != "READY":
            reason = server._real_paths(entry.get("reason") or "") or "\n".join(server._model_log_lines(name)) \
                or "no reason given"
            failed[name] = f"{entry.get('state', 'UNKNOWN')}: {readable(reason)}"
    return failed


def load_error(failed: dict[str, str], log_path: Path | None, every: bool = False,
               left_out: dict[str, str] | None = None) -> ServerError:
    """The error naming each model that failed to load, with Triton's reason, and each model in
    ``left_out`` (not started, with our reason): when nothing loads, every cause is the user's to see."""
    names = ", ".join(f"'{n}'" for n in failed)
    head = ("tritonserver could not load any model of the repository: " if every else
            "tritonserver could not load " + ("model " if len(failed) == 1 else "models "))
    skipped = [f"- {n}: left out, not started: {why}" for n, why in (left_out or {}).items()]
    return ServerError(head + names + ":\n" + "\n".join([f"- {n}: {why}" for n, why in failed.items()] + skipped)
                       + f"\nfull log: {log_path}")
