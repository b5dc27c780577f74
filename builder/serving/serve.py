"""``triton-builder serve``: start an ``EmbeddedServer``, announce its URLs, block until SIGINT/SIGTERM
(announcing a server that stops answering: builder/serving/hang_watch.py), stop it and return an exit
code (non-zero if the server died on its own, had to be killed at the stop, or its log reports a crash).

Usage::

    from builder.serving.serve import serve_forever
    code = serve_forever(Path("model_repository"))
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Callable, Sequence

from builder.core.errors import ServerDiedError, UserInputError
from builder.core.host import host_warnings
from builder.core.processes import stop_signals
from builder.repository.layout import latest_version, model_dir
from builder.repository.metadata import read_metadata
from builder.repository.signing import verify_repository
from builder.repository.triton_releases import EMBEDDED_RELEASE, triton_release
from builder.serving import control_key
from builder.serving.backends import EMBEDDED_BACKENDS, STANDIN_BACKENDS, model_dirs
from builder.serving.embedded import EmbeddedServer
from builder.serving.hang_watch import HANG_PROBE_INTERVAL_S, HANG_PROBE_MISSES, HangWatch
from builder.serving.native_backends import served_kinds
from builder.serving.running import announced
from builder.serving.server_log import describe_exit as _describe_exit
from builder.serving.watch import WATCH_INTERVAL_S, RepositoryWatch
from builder.storage.s3_location import is_s3_url
from builder.storage.served import s3_host_warnings

__all__ = ["checked_server", "serve_forever"]


def _print_flush(*args, **kwargs) -> None:
    print(*args, **kwargs, flush=True)


def serve_forever(
    repository: Path | str,
    *,
    announce: Callable[[str], object] = _print_flush,
    poll_interval: float = 0.2,
    public_key: str | Path | None = None,
    require_signature: bool = False,
    current_host: dict | None = None,
    hang_probe_interval: float = HANG_PROBE_INTERVAL_S,
    hang_probe_misses: int = HANG_PROBE_MISSES,
    watch: bool = True,
    watch_interval: float = WATCH_INTERVAL_S,
    **server_args,
) -> int:
    """Start an ``EmbeddedServer``, announce it, block until SIGINT/SIGTERM, stop it; return an exit code.
    ``server_args`` are the server's own (``EmbeddedServer``'s keyword arguments: ports, host, log_path,
    model_control, load_models, extra_args, ready_timeout; builder.serve documents them for users).

    Returns 0 after a clean stop on a signal, and ``ServerDiedError.exit_code`` (2) if the server
    process ended on its own (after announcing its exit code and last log lines), or if the stop
    found it failed: it did not end on SIGTERM in time and was killed, or its log reports a crash (the
    log is kept and named). While serving, ``/v2/health/live`` is probed every ``hang_probe_interval``
    s; ``hang_probe_misses`` probes in a row without an answer are announced once (the server is left
    running: an overloaded one recovers, and a hung one is the user's to stop). Start-up failures
    raise ``UserInputError``/``ServerError`` as ``EmbeddedServer.start`` does. Serving the whole
    repository (no ``load_models``), a model that fails to load is announced with Triton's reason and
    the others are served; it fails (exit 2) only if none loads. Models asked for must all load. ``announce`` gets one
    line at a time (the default prints and flushes). Signal handlers are installed only when
    called from the main thread, and the previous ones are restored on return. Each served model
    whose build measured on a different host (ISA class, usable cores, GPU; builder/core/host.py) gets a
    warning line saying what to run (``current_host`` injects this host's profile). With ``watch`` (the
    default; explicit model control on a local repository), a model folder that changes while it serves - a
    new version, a rollback, a tuned config - is loaded again with the server's own key, without a restart or
    a dropped request (builder/serving/watch.py); ``rollback`` finds the server through its record
    (builder/serving/running.py) and says which version it answers with.
    """
    server = checked_server(repository, public_key=public_key, require_signature=require_signature, **server_args)
    temporary_log = server_args.get("log_path") is None
    with stop_signals() as received:
        try:
            server.start()
            metas = latest_metadata(repository, server.models)  # read once for the three kinds of line
            warnings = served_host_warnings(repository, server.models, current_host, metas) + \
                served_release_warnings(repository, server.models, metas) + \
                python_backend_notes(repository, server.models, metas)
            follows = watch and server.model_control == "explicit" and server.remote is None
            _announce_started(server, announce, warnings, temporary_log=temporary_log, follows=follows)
            watcher = RepositoryWatch(server, announce, watch_interval, whole_repository=server.load_models is None) \
                if follows else None
            with HangWatch(server, announce, hang_probe_interval, hang_probe_misses), announced(server, repository):
                while not received:
                    if watcher is not None:
                        watcher.poll()
                    if not server.is_running():
                        announce(
                            f"tritonserver {_describe_exit(server.returncode)} on its own; last log lines:\n"
                            f"{server.log_tail()}\nfull log: {server.log_path}"
                        )
                        return ServerDiedError.exit_code
                    time.sleep(poll_interval)
            announce(f"received {signal.Signals(received[0]).name}; stopping tritonserver (pid {server.pid}) ...")
            code = server.stop()
            if server.stop_failure is not None:  # a hung or crashed server: its log is the only record
                announce(server.stop_failure)
                return ServerDiedError.exit_code
            announce(f"tritonserver stopped (exit code {code}); "
                     + ("nothing failed, so its log was removed with its temp folder" if temporary_log
                        else f"log: {server.log_path}"))
            return 0
        finally:
            server.stop()


def checked_server(repository: Path | str, *, public_key: str | Path | None = None, require_signature: bool = False,
                   **server_args) -> EmbeddedServer:
    """The ``EmbeddedServer`` that ``serve_forever`` runs (``server_args``: its keyword arguments), not started
    yet, after the checks it makes first: a
    repository with nothing to serve is refused, and (with a public key, or $TRITON_BUILDER_PUBLIC_KEY)
    every version's signature is verified before anything loads. Serving the whole repository (no
    ``load_models``), a model that fails to load leaves the others served (``server.failed`` names it)."""
    load_models = server_args.get("load_models")
    _refuse_empty(repository, load_models)
    verify_repository(repository, public_key, require_signature)
    # one bad model (a published variant) must not take down the rest
    return EmbeddedServer(repository, keep_going=load_models is None, **server_args)


def _refuse_empty(repository: Path | str, load_models: Sequence[str] | None) -> None:
    """A server with nothing to serve is a mistake in --repository (a model folder, or one not built
    into yet), not a running service to leave up."""
    folder = Path(repository)
    if is_s3_url(str(repository)) or not folder.is_dir():
        return
    if (folder / "config.pbtxt").is_file():
        raise UserInputError(f"--repository {folder}: this is a model folder (it holds config.pbtxt); pass the "
                             f"repository above it: --repository {folder.parent}")
    if load_models or model_dirs(folder):
        return
    raise UserInputError(f"--repository {folder}: no models in it; build one into it first "
                         f"(triton-builder build SPEC.yaml --repository {folder})")


def served_host_warnings(repository: Path | str, models: Sequence[str], current_host: dict | None = None,
                         metas: dict[str, dict | None] | None = None) -> list[str]:
    """compare_hosts for each model's latest version in ``repository`` (models without metadata: none);
    for an ``s3://`` repository, its newest served complete version's metadata.yaml in the bucket.
    ``metas``: latest_metadata's, when the caller has read them already."""
    if is_s3_url(str(repository)):
        return s3_host_warnings(str(repository), list(models), current_host)
    metas = latest_metadata(repository, models) if metas is None else metas
    out = []
    for name in models:
        if metas.get(name) is not None:
            out += host_warnings(metas[name], name, current_host)
    return out


def latest_metadata(repository: Path | str, models: Sequence[str]) -> dict[str, dict | None]:
    """{model: its latest version's metadata.yaml, or None} of a local repository ({} for ``s3://``)."""

    if is_s3_url(str(repository)):
        return {}
    return {name: _latest_metadata(Path(repository), name) for name in models}


def _latest_metadata(repository: Path, name: str) -> dict | None:
    folder = model_dir(repository, name)
    number = latest_version(folder) if folder.is_dir() else None
    meta_path = folder / str(number) / "metadata.yaml"
    return read_metadata(meta_path) if number is not None and meta_path.is_file() else None


def served_release_warnings(repository: Path | str, models: Sequence[str],
                            metas: dict[str, dict | None] | None = None) -> list[str]:
    """One line per served model whose latest version was built for another Triton release than the
    embedded server's (metadata ``artifact.triton_release``): what is served here is not that release."""

    metas = latest_metadata(repository, models) if metas is None else metas
    out = []
    for name in models:
        release = ((metas.get(name) or {}).get("artifact") or {}).get("triton_release")
        if release and release != EMBEDDED_RELEASE:
            out.append(f"{name}: built for Triton {release}; this embedded server is Triton {EMBEDDED_RELEASE} with this "
                       f"environment's runtimes. `triton-builder validate REPO/{name} --triton-release {release}` "
                       f"replays it under {release}'s own runtimes; serve it on that release's image (docker compose)")
    return out


def python_backend_notes(repository: Path | str, models: Sequence[str],
                         metas: dict[str, dict | None] | None = None) -> list[str]:
    """One line per served model whose latest version is a python-backend wrapper (target python, or the
    layout every build published before standard folders became the default): served here as it is, but
    the stock NGC image needs the derived one for it; a build republishes it standard."""
    metas = latest_metadata(repository, models) if metas is None else metas
    out = []
    for name in models:
        meta = metas.get(name) or {}
        if (meta.get("artifact") or {}).get("backend") == "python" and meta.get("model_name") == name:
            spec = (meta.get("spec") or {}).get("path") or "SPEC"
            out.append(f"{name}: a python-backend model (model.py wrapping the model file; the layout of earlier "
                       f"releases, or --target python): it serves here, but the stock NGC image cannot load it "
                       f"(docker/triton/python-backend.compose.yml builds one that can); `triton-builder build {spec} "
                       f"--repository {repository}` republishes it as a standard folder that both serve")
    return out


def _announce_started(server: EmbeddedServer, announce: Callable[[str], object], warnings: Sequence[str] = (),
                      temporary_log: bool = False, follows: bool = False) -> None:
    announce(f"Triton server (embedded: Triton {triton_release(EMBEDDED_RELEASE).triton} = NGC {EMBEDDED_RELEASE}, "
             f"backends: {', '.join(EMBEDDED_BACKENDS)}) is ready, pid {server.pid}")
    for backend, how in served_kinds(STANDIN_BACKENDS, server.native_backends).items():  # which are Triton's own, which stand-ins
        if backend not in server.native_backends:
            how += ": it loads the same standard folders with this environment's runtime"
        announce(f"  backend  {backend}: {how}")
    announce(f"  HTTP     {server.http_url}   (http://{server.http_url}/v2/health/ready)")
    announce(f"  gRPC     {server.grpc_url}")
    announce(f"  metrics  {server.metrics_url}")
    announce(f"  log      {server.log_path}"
             + ("   (removed at a clean stop; kept, and named, if the server fails)" if temporary_log else ""))
    announce(control_key.announcement(server.control_key))
    announce(f"  serving  {', '.join(server.models) if server.models else '(no models)'}")
    for name, reason in server.left_out.items():
        announce(f"  left out {name}: {reason}")
    for name, reason in server.failed.items():
        announce(f"  FAILED   {name} (not served; fix it and restart to serve it): "
                 + reason.replace("\n", "\n           "))
    for line in warnings:
        announce(f"  warning  {line}")
    if follows:
        announce("  watch    a new version, a rollback or a tuned config written into the repository is loaded "
                 "by this server within seconds (no restart)")
    announce("Stop with Ctrl-C (SIGINT) or SIGTERM.")
