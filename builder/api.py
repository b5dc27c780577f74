"""The public Python API: one typed function per CLI verb, exported by ``builder/__init__.py``.

Every function that acts on one model takes its ``name`` first, then the ``repository`` it lives in
(default ``"model_repository"``, as the CLI's). The heavy modules are imported inside the functions,
so ``import builder`` stays cheap. ``loadtest``, ``sweep`` and ``tune`` return dataclasses with the
main figures and ``raw``: the full dict the CLI writes as JSON.

Usage::

    import builder

    result = builder.build("examples/digits/spec.yaml", "model_repository")
    report = builder.validate("digits_cnn", "model_repository")
    with builder.serving_context("model_repository") as server:       # started here, stopped at the end
        checked = builder.check("digits_cnn", "model_repository", url=server.http_url, grpc_url=server.grpc_url)
        load = builder.loadtest("digits_cnn", url=server.http_url, users=4, run_time_s=10)
    print(load.rps, load.p99_ms, load.ok)
    builder.serve("model_repository")                                  # blocks until Ctrl-C, as `serve`
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from builder.core.errors import ServerDiedError, UserInputError, names_parameters
from builder.pipeline import build as _build
from builder.repository.reselect import default_measure, select_for_host
from builder.repository.rollback import rollback_model
from builder.repository.validate import validate_model
from builder.serving.native_backends import install_backends as _install
from builder.serving.running import served_after_rollback
from builder.serving.serve import checked_server, serve_forever
from builder.storage.s3_location import is_s3_url
from builder.storage.s3_rollback import rollback_s3
from builder.storage.served import check_served_at
from builder.tuning.loadtest import run_loadtest
from builder.tuning.results import LoadTestResult, SweepResult, TuneResult
from builder.tuning.sweep import run_sweep
from builder.tuning.tune import run_tune

if TYPE_CHECKING:
    from builder.pipeline import BuildResult
    from builder.repository.reselect import Measure, SelectReport
    from builder.repository.rollback import RollbackReport
    from builder.repository.validate import ValidationReport
    from builder.serving.check import CheckReport
    from builder.serving.embedded import EmbeddedServer
    from builder.serving.native_backends import InstallReport
    from builder.spec.model import ModelSpec

DEFAULT_REPOSITORY = "model_repository"  #: every verb's and function's repository (the CLI's too)
DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}  #: Triton's own, which serve binds and clients assume
Progress = Callable[[str], object]


def _deprecated(message: str) -> None:
    warnings.warn(message, DeprecationWarning, stacklevel=3)


def _looks_like_path(value: object) -> bool:
    """A model name never holds a path separator (builder/spec/model.py validate_model_name); a folder may."""
    return isinstance(value, os.PathLike) or "/" in str(value) or os.sep in str(value)


def _name_first(verb: str, name: str | Path, repository: str | Path) -> tuple[str, str | Path]:
    """``(name, repository)``; the old ``(repository, name)`` order is recognised (a path first and a
    plain name second, or only the swapped pair naming a model folder), swapped, and warned about."""
    if _looks_like_path(repository):
        swapped = False
    elif _looks_like_path(name):
        swapped = True
    else:  # two plain names: the old order where only the swapped pair names a model folder
        swapped = not (Path(repository) / str(name)).is_dir() and (Path(name) / str(repository)).is_dir()
    if swapped:
        _deprecated(f"builder.{verb}(repository, name) is deprecated: name the model first, "
                    f"builder.{verb}({str(repository)!r}, {str(name)!r})")
        return str(repository), name
    return str(name), repository


def _protocol(value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise UserInputError(f"protocol={value!r}: use {', '.join(allowed[:-1])} or {allowed[-1]}")
    return value


def _url(url: str | None, protocol: str) -> str:
    """``url``, else this machine's default port for ``protocol`` (Triton's: 8000 HTTP, 8001 gRPC)."""
    return url or f"127.0.0.1:{DEFAULT_PORTS['grpc' if protocol == 'grpc' else 'http']}"


def _local_repository(name: str, repository: str | Path | None, required: bool = False) -> Path | None:
    """The local folder whose latest version's reference.npz is the payload: ``repository`` if it is a
    folder; None where the default ``model_repository`` does not hold the model (the payload is then
    generated from the model's metadata), or where ``repository`` is None."""
    if repository is None and not required:
        return None
    if repository is None or "://" in str(repository):
        raise UserInputError(f"repository={repository!r}: give the local folder the server serves (a local "
                             "copy of an object-store repository)" + ("" if required else
                                                                     ", or None and a payload= file"))
    path = Path(repository)
    if str(repository) == DEFAULT_REPOSITORY and not required and not (path / name / "config.pbtxt").is_file():
        return None
    if not path.is_dir():
        raise UserInputError(f"repository={str(repository)!r}: not a folder; pass the folder the server serves")
    return path


@names_parameters
def build(spec: str | Path | ModelSpec, repository: str | Path = DEFAULT_REPOSITORY, *,
          variants: list[str] | None = None, target: str | None = None, strict: bool = False,
          publish_variants: bool | None = None, benchmark_seconds: float | None = None,
          progress: Progress | None = None, signing_key: str | Path | None = None, register: bool = False,
          registry: str | None = None, alias: str | None = None, triton_release: str | None = None) -> BuildResult:
    """Build, verify and publish the model of ``spec`` (a YAML path or a ``ModelSpec``) into ``repository``.

    ``variants``: the variants to build (default: the spec's); ``target``: cpu, gpu or python (default:
    the spec's); ``strict``: fail if any variant fails verification; ``publish_variants``: also publish
    the variants that were not selected as models of their own; ``benchmark_seconds``: seconds measured
    per variant (0: no measuring); ``progress``: one line per stage (None: silent); ``signing_key``: a
    PEM private key signing every version; ``register``/``registry``/``alias``: also register the
    versions in MLflow's model registry; ``triton_release``: the NGC release the versions must load on.

    Returns a ``BuildResult`` (``published``: where each version went; ``rows``: the summary table).
    Raises ``BuilderError`` subclasses. Full notes: ``builder.pipeline.build``.
    """

    return _build(spec, repository, variants=variants, target=target, strict=strict,
                  publish_variants=publish_variants, benchmark_seconds=benchmark_seconds, progress=progress,
                  signing_key=signing_key, register=register, registry=registry, alias=alias,
                  triton_release=triton_release)


@names_parameters
def validate(name: str, repository: str | Path = DEFAULT_REPOSITORY, *, version: int | None = None,
             gpu: str | None = None, tensorrt_version: str | None = None, public_key: str | Path | None = None,
             require_signature: bool = False, triton_release: str | None = None, progress: Progress | None = None,
             max_regression: str | None = None, regression_seconds: float = 1.0,
             current_host: dict | None = None) -> ValidationReport:
    """Validate the published versions of model ``name`` in ``repository`` offline: hashes, signatures,
    the stored reference outputs replayed, and the latest version against the one before it.

    ``version``: only that version (default: all); ``public_key``/``require_signature``: verify the
    signatures (and refuse unsigned versions); ``triton_release``: also check that release's runtimes
    can load and reproduce it; ``max_regression`` (e.g. ``"p50=10%,accuracy=0.01"``) and
    ``regression_seconds`` (0: no measuring): the regression gate; ``current_host`` injects this host.

    Returns a ``ValidationReport`` (``ok``, ``lines()``). The old form, a model folder path
    (``validate("model_repository/digits_cnn", 2)``), still works with a ``DeprecationWarning``.
    """

    if isinstance(repository, int) and not isinstance(repository, bool):  # validate(model_path, version)
        _deprecated("builder.validate(model_path, version) is deprecated: builder.validate(name, repository, "
                    "version=N)")
        version, repository = repository, DEFAULT_REPOSITORY
    if _looks_like_path(name) and str(repository) == DEFAULT_REPOSITORY:
        _deprecated(f"builder.validate(model_path) is deprecated: name the model and its repository, "
                    f"builder.validate({Path(name).name!r}, {str(Path(name).parent)!r})")
        folder = Path(name)
    else:
        name, repository = _name_first("validate", name, repository)
        folder = Path(repository) / name
    return validate_model(folder, version, gpu=gpu, tensorrt_version=tensorrt_version, public_key=public_key,
                          require_signature=require_signature, triton_release=triton_release,
                          progress=progress or (lambda message: None), max_regression=max_regression,
                          regression_seconds=regression_seconds, current_host=current_host)


@names_parameters
def check(name: str, repository: str | Path = DEFAULT_REPOSITORY, *, url: str = "127.0.0.1:8000",
          grpc_url: str | None = None, protocol: str = "both", version: int | None = None, timeout: float = 30.0,
          current_host: dict | None = None) -> CheckReport:
    """Check the served model ``name`` against its published version in ``repository`` (a folder or an
    ``s3://`` URL): every stored reference case sent over HTTP and/or gRPC, the answers compared within
    the version's tolerance, and the config Triton loaded compared with the one written.

    ``url``: the server's HTTP address ``HOST:PORT``; ``grpc_url``: its gRPC one (default: the HTTP port
    + 1); ``protocol``: ``"http"``, ``"grpc"`` or ``"both"``; ``version``: the version to check
    (default: the latest); ``timeout``: seconds to wait for the server; ``current_host`` injects this host.

    Returns a ``CheckReport`` (``ok``, ``lines()``). Raises ``ServerError`` if the server or the model
    is not ready, ``UserInputError`` for bad arguments.
    """

    _protocol(protocol, ("http", "grpc", "both"))
    host, _, port = url.rpartition(":")
    if not host or not port.isdigit():
        raise UserInputError(f"url={url!r}: use HOST:PORT, e.g. 127.0.0.1:8000")
    name, repository = _name_first("check", name, repository)
    return check_served_at(name, repository, url=url, grpc_url=grpc_url, protocol=protocol, version=version,
                           timeout=timeout, current_host=current_host)


@names_parameters
def select(name: str, repository: str | Path = DEFAULT_REPOSITORY, *, seconds: float = 2.0, dry_run: bool = False,
           signing_key: str | Path | None = None, public_key: str | Path | None = None,
           measure: Measure | None = None, current_host: dict | None = None,
           progress: Progress | None = None) -> SelectReport:
    """Re-measure the variants of model ``name`` in ``repository`` on this host and publish the winner
    as a new version (nothing when the served one already wins).

    ``seconds``: measuring time per variant; ``dry_run``: say what would be published, publish nothing;
    ``signing_key``: signs the new version (default $TRITON_BUILDER_SIGNING_KEY); ``public_key``:
    verifies the candidates first; ``measure``/``current_host``: injectable (tests).

    Returns a ``SelectReport`` (``winner``, ``published``, ``lines()``). The old order
    ``select(repository, name)`` still works with a ``DeprecationWarning``.
    """

    if not seconds > 0:
        raise UserInputError(f"seconds={seconds}: give the measuring time per variant, > 0")
    name, repository = _name_first("select", name, repository)
    return select_for_host(repository, name, measure=measure or default_measure(seconds), current_host=current_host,
                           dry_run=dry_run, signing_key=signing_key, public_key=public_key,
                           progress=progress or (lambda message: None))


@names_parameters
def rollback(name: str, repository: str | Path = DEFAULT_REPOSITORY, *, to: int | None = None,
             signing_key: str | Path | None = None, public_key: str | Path | None = None,
             progress: Progress | None = None, server_timeout: float = 30.0) -> RollbackReport:
    """Serve an earlier verified version of model ``name`` again, as ``triton-builder rollback``: one atomic
    rewrite of config.pbtxt with ``version_policy { specific { versions: [to] } }`` (version ``to``'s own
    config where it kept a signed copy), recorded in ``<model>/rollout.yaml`` with the history of which
    version served when. ``repository``: a folder or an ``s3://`` URL; ``to``: the version (default: the
    one before the served one); ``signing_key``: signs the record (required where the model is signed;
    default $TRITON_BUILDER_SIGNING_KEY); ``public_key``: checks the version's signature first. A running
    ``triton-builder serve`` of the repository loads the change by itself; this waits up to ``server_timeout``
    s until it answers with version ``to`` and says so in ``served`` (or that no server was found).

    Returns a ``RollbackReport`` (``from_version``, ``to_version``, ``history``, ``served``, ``lines()``). Raises
    ``VerificationError`` (nothing written) when the version fails ``validate`` against that config, and
    ``UserInputError`` for an unknown model or version, or a signed model without a key.
    """

    if to is not None and (isinstance(to, bool) or not isinstance(to, int) or to < 0):
        raise UserInputError(f"to={to!r}: give a version number (an int >= 0), or None for the previous version")
    say = progress or (lambda message: None)
    if is_s3_url(str(repository)):
        if signing_key or public_key:
            raise UserInputError("--signing-key/--public-key: signing is not supported on an s3:// repository; "
                                 "roll back the local repository, then `publish --to` it")
        return rollback_s3(str(repository), name, to, progress=say)
    report = rollback_model(repository, name, to, signing_key=signing_key, public_key=public_key, progress=say)
    report.served = served_after_rollback(Path(repository), name, report.to_version, server_timeout, say)
    return report


def serve(repository: str | Path = DEFAULT_REPOSITORY, *, load_models: Sequence[str] | None = None,
          http_port: int | None = None, grpc_port: int | None = None, metrics_port: int | None = None,
          host: str = "127.0.0.1", log_path: str | Path | None = None, model_control: str = "explicit",
          extra_args: Sequence[str] = (), ready_timeout: float = 60.0, public_key: str | Path | None = None,
          require_signature: bool = False, announce: Progress | None = None,
          current_host: dict | None = None, watch: bool = True) -> int:
    """Serve ``repository`` on the embedded tritonserver and block until SIGINT/SIGTERM, as
    ``triton-builder serve``; returns its exit code (0 after a clean stop). For a server that runs while
    your code does, use ``serving_context``.

    ``load_models``: the models to load (default: all; one that fails to load is announced and the
    others served); ports: default free ones; ``log_path``: keep the server's log there (default: a
    temp file, removed at a clean stop); ``public_key``/``require_signature``: verify signatures
    before anything loads; ``announce``: one line at a time (default: printed); ``watch``: load a model
    folder again when it changes while serving (a new version, a rollback, a tuned config; explicit mode).
    """

    kwargs = {"announce": announce} if announce is not None else {}
    return serve_forever(repository, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, host=host,
                         log_path=log_path, model_control=model_control, load_models=load_models,
                         extra_args=extra_args, ready_timeout=ready_timeout, public_key=public_key,
                         require_signature=require_signature, current_host=current_host, watch=watch, **kwargs)


def install_backends(backends: Sequence[str] | None = None, *, force: bool = False,
                     progress: Progress | None = None) -> InstallReport:
    """Build Triton's own C++ backends (r24.10 sources; the embedded server's release) for the embedded server,
    as ``triton-builder install-backends``: onnxruntime against 1.19.2 and openvino against 2024.4.0 (what NGC
    24.10 ships), pytorch against this environment's torch, into a per-user cache keyed by versions, so a
    second call costs nothing (``force``: build again).
    ``backends``: which ones (default: onnxruntime and pytorch; openvino and ``onnxruntime-gpu`` - the onnxruntime
    backend built for CUDA 12 GPUs against onnxruntime-gpu 1.19.2, served under ``TRITON_BUILDER_BACKENDS=gpu`` -
    only when named). Sources come from
    ``$TRITON_SOURCES_DIR`` when set, else GitHub. ``serve`` and everything that starts the embedded server
    use a built backend from then on; the Python stand-in stays for one that is not built.

    Returns an ``InstallReport``: one row per backend (``built``, ``cached`` or ``failed`` with a one-line
    reason naming the missing piece), ``ok`` and ``lines()``. A failed backend never stops the others.
    """

    return _install(list(backends) if backends is not None else None, force=force,
                    progress=progress or (lambda message: None))


@contextlib.contextmanager
def serving_context(repository: str | Path = DEFAULT_REPOSITORY, *, load_models: Sequence[str] | None = None,
                    http_port: int | None = None, grpc_port: int | None = None, metrics_port: int | None = None,
                    host: str = "127.0.0.1", log_path: str | Path | None = None, model_control: str = "explicit",
                    extra_args: Sequence[str] = (), ready_timeout: float = 60.0,
                    public_key: str | Path | None = None,
                    require_signature: bool = False) -> Iterator[EmbeddedServer]:
    """``with serving_context(repository) as server:`` serves ``repository`` on the embedded tritonserver
    for the block: started (every model loaded, or ``server.failed`` naming those that failed) before
    the block, stopped after it, also on an exception. The same arguments and checks as ``serve``.

    ``server`` is the running ``EmbeddedServer``: ``http_url``, ``grpc_url``, ``metrics_url``
    (``HOST:PORT``), ``models``, ``failed``, ``log_path``, and ``load_model``/``unload_model``.
    Raises ``ServerError`` if it cannot start, and ``ServerDiedError`` after the block if its stop
    failed (it hung and was killed, or its log reports a crash: the message names the kept log).
    """

    server = checked_server(repository, public_key=public_key, require_signature=require_signature,
                            http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port, host=host,
                            log_path=log_path, model_control=model_control, load_models=load_models,
                            extra_args=extra_args, ready_timeout=ready_timeout)
    server.start()
    try:
        yield server
    finally:
        server.stop()
    if server.stop_failure is not None:
        raise ServerDiedError(server.stop_failure)


@names_parameters
def loadtest(name: str, repository: str | Path | None = DEFAULT_REPOSITORY, *, url: str | None = None,
             protocol: str = "http", users: int = 8, run_time_s: float = 30.0, spawn_rate: float | None = None,
             shape: str = "constant", slo_p99_ms: float | None = None, slo_max_failure_ratio: float | None = None,
             workers: int = 0, batch_size: int = 1, payload: str | Path | None = None,
             out_dir: str | Path | None = None, timeout_s: float | None = None,
             locustfile: str | Path | None = None, progress: Progress | None = None) -> LoadTestResult:
    """Load-test the served model ``name`` with Locust (headless, in a subprocess), as ``triton-builder
    loadtest``.

    ``repository``: the local folder the server serves, whose latest reference.npz is the payload (the
    default folder may lack the model, and None never reads one: the payload is then generated from the
    model's metadata); ``payload``: an .npz of requests instead; ``url``: the server's address for
    ``protocol`` (``"http"`` or ``"grpc"``; default this machine's 8000 / 8001); ``users``,
    ``spawn_rate``, ``run_time_s``, ``shape``: the load; ``slo_p99_ms``/``slo_max_failure_ratio``: the
    SLOs; ``workers`` > 0: distributed Locust on this machine; ``out_dir``: the reports (default
    runs/loadtest/<name>); ``timeout_s``: a hard limit on the whole run.

    Returns a ``LoadTestResult``. Raises ``UserInputError`` for bad arguments and ``ServerError`` if the
    server or model cannot be reached before the run.
    """

    _protocol(protocol, ("http", "grpc"))
    summary = run_loadtest(name, _url(url, protocol), protocol, users, run_time_s,
                           out_dir if out_dir is not None else Path("runs") / "loadtest" / name, payload, timeout_s,
                           repository=_local_repository(name, repository), spawn_rate=spawn_rate, shape=shape,
                           slo_p99_ms=slo_p99_ms, slo_max_failure_ratio=slo_max_failure_ratio, workers=workers,
                           batch_size=batch_size, locustfile=locustfile, progress=progress)
    return LoadTestResult.from_summary(summary)


@names_parameters
def sweep(name: str, repository: str | Path | None = DEFAULT_REPOSITORY, *, url: str | None = None,
          protocol: str = "grpc", max_concurrency: int = 16, levels: list[int] | None = None,
          window_s: float = 0.5, max_seconds_per_level: float = 8.0, batch_size: int = 1, engine: str = "auto",
          payload: str | Path | None = None, out_dir: str | Path | None = None,
          progress: Progress | None = None) -> SweepResult:
    """Measure the served model ``name`` at concurrency 1, 2, 4, ... ``max_concurrency`` (or ``levels``),
    each level until stable, as ``triton-builder sweep``.

    ``repository``/``payload``/``url``/``protocol``: as ``loadtest``'s; ``window_s``: one measurement
    window (stability: the last 3 agree within 10 %); ``max_seconds_per_level``: the cap per level;
    ``engine``: ``"perf_analyzer"``, ``"python"`` or ``"auto"`` (perf_analyzer when it can be had);
    ``out_dir``: sweep.csv/.png/.json (default runs/sweep/<name>).

    Returns a ``SweepResult``. Raises ``UserInputError`` for bad arguments, ``ServerError`` if the model
    cannot be reached.
    """

    _protocol(protocol, ("http", "grpc"))
    result = run_sweep(name, _url(url, protocol), protocol, max_concurrency,
                       out_dir if out_dir is not None else Path("runs") / "sweep" / name, payload=payload,
                       repository=_local_repository(name, repository), levels=levels, window_s=window_s,
                       max_seconds_per_level=max_seconds_per_level, batch_size=batch_size, engine=engine,
                       progress=progress)
    return SweepResult.from_result(result)


@names_parameters
def tune(name: str, repository: str | Path = DEFAULT_REPOSITORY, *, p99_budget_ms: float, url: str | None = None,
         protocol: str = "grpc", seconds_per_candidate: float = 10.0, write: bool = False, publish: bool = False,
         delays: Sequence[int] | None = None, instance_counts: Sequence[int] | None = None,
         max_batch_sizes: Sequence[int] | None = None, thread_counts: Sequence[int] | None = None,
         levels: Sequence[int] | None = None, max_concurrency: int | None = None, max_candidates: int = 12,
         window_s: float = 0.5, confirm: bool = True, batch_size: int = 1, tie_margin: float = 0.05,
         usable_cores: int | None = None, engine: str = "auto", signing_key: str | Path | None = None,
         serve_copies: bool = True, payload: str | Path | None = None, out_dir: str | Path | None = None,
         progress: Progress | None = None) -> TuneResult:
    """Search the serving config of model ``name`` (dynamic batching delay, instances, intra-op threads,
    max batch size) on the server that serves ``repository``, for the highest throughput with p99 within
    ``p99_budget_ms``, as ``triton-builder tune``.

    ``write``: the winner into the served config.pbtxt in place; ``publish``: as a new version (one of
    the two; neither: a dry run); ``delays``, ``instance_counts``, ``max_batch_sizes``, ``thread_counts``,
    ``levels``: what to try (default: tune's); ``seconds_per_candidate``, ``window_s``, ``confirm``,
    ``tie_margin``, ``max_candidates``: the search's effort and winner rule; ``serve_copies``: measure
    candidates as copies of the model (False: reload the model itself); ``url``/``protocol``/``engine``/
    ``payload``: as ``sweep``'s; ``out_dir``: tuning.json (default runs/tune/<name>).

    Returns a ``TuneResult``. Raises ``UserInputError`` for bad arguments or a server without model
    control, ``ServerError`` if the model cannot be reached or the server stops answering.
    """

    _protocol(protocol, ("http", "grpc"))
    folder = _local_repository(name, repository, required=True)
    optional = {"delays": delays, "instance_counts": instance_counts, "max_batch_sizes": max_batch_sizes,
                "thread_counts": thread_counts, "levels": levels}
    record = run_tune(name, folder, _url(url, protocol), protocol=protocol, p99_budget_ms=p99_budget_ms,
                      seconds_per_candidate=seconds_per_candidate, write=write, publish=publish,
                      out_dir=out_dir if out_dir is not None else Path("runs") / "tune" / name, payload=payload,
                      max_concurrency=max_concurrency, max_candidates=max_candidates, window_s=window_s,
                      confirm=confirm, batch_size=batch_size, tie_margin=tie_margin, usable_cores=usable_cores,
                      engine=engine, signing_key=signing_key, serve_copies=serve_copies, progress=progress,
                      **{key: value for key, value in optional.items() if value is not None})
    return TuneResult.from_record(record)
