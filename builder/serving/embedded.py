"""Run a real Triton server without docker, from the ``tritonserver`` binary in the nvidia-pytriton wheel.

The wheel (``pip install nvidia-pytriton==0.7.0``) ships Triton 2.51 with only the *python* backend.
So this server runs python-backend models (and ensembles made only of them) on any Linux machine,
with no GPU and no docker. Models that need another backend (onnxruntime, tensorrt, pytorch, ...)
are left out, each with a reason (``EmbeddedServer.left_out``), and the rest are still served.

Usage::

    from pathlib import Path
    from builder.serving.embedded import EmbeddedServer

    with EmbeddedServer(Path("model_repository")) as server:   # start(): returns once ready
        print(server.http_url, server.grpc_url, server.metrics_url, server.log_path)
        print(server.models, server.left_out)      # served models; {name: reason} left out
        server.unload_model("resnet_python")
        server.load_model("resnet_python")         # ServerError quoting Triton's reason on failure
        server.check_alive()                       # ServerDiedError if the process has ended
    # stopped here: SIGTERM to its process group, SIGKILL after 15 s (also at interpreter exit);
    # its temp dir goes too, unless the server failed (then the error, or server.stop_failure, names the log)

Beside it: install.py (finding the binary), backends.py (``unsupported_models``), server_log.py
(log excerpts), model_control.py (load, unload, model state), serve.py (``serve_forever``, what
``triton-builder serve`` runs); the process itself is a ``builder.core.processes.LocalService``.

How it runs the binary (nvidia-pytriton 0.7.0; the backend directory, environment and addresses: install.py):

- ``--exit-on-error=false`` is always passed, so a model that fails to load does not kill the
  server; ``start()`` then checks every model it asked for and raises ``ServerError`` with Triton's
  own reason (with ``keep_going``: only if none loaded; the rest go to ``failed``). In ``none``/``poll``
  mode Triton tries every model, so ``--strict-readiness=false`` is added when some are left out, and
  with ``keep_going`` (otherwise ``/v2/health/ready`` would never say ready).
- Model control, the repository index, shared memory, logging and trace need the server's control
  key (builder/serving/control_key.py): ``control_key``, else ``$TRITON_BUILDER_CONTROL_KEY``, else a
  random key made at each start; ``control_key`` holds it, this process's clients of its addresses send
  it, and the command line written to the log shows ``***`` in its place. ``extra_args`` that restrict
  APIs themselves replace these flags (their key is then the caller's to send).
- ``--id`` is a name unique to this process: the readiness probe (``GET /v2``) accepts only it, so
  another server answering on our port (it won a race for the port) is never taken for ours.
- Log lines about NVML, DCGM, CudaDriverHelper and pinned memory are expected without a GPU;
  they are dropped from the log excerpts quoted in errors.
- A repository path with a space (or another shell character) is served through a symlink
  ``<tmp>/repository``: the python backend's stub command line cannot take it (install.py).
  Messages and log excerpts name the real folder. A process that crashes while the server starts
  (such a stub did: the server waits for it forever) ends the start at once, with the log's lines.

The server runs in its own process group (it does not get the terminal's Ctrl-C); ``stop()`` ends
the whole group, python-backend stub processes included. ``stop()`` is registered with ``atexit``,
which runs on normal interpreter exit and on KeyboardInterrupt; if this process is killed (SIGKILL),
the server gets SIGTERM (``die_with_parent``, whichever thread started it) and takes its stubs along.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from builder.core.errors import ServerDiedError, ServerError, UserInputError
from builder.core.processes import LocalService, client_host, free_ports, http_get
from builder.serving import control_key as control, server_log, startup
from builder.serving.backends import (EMBEDDED_BACKENDS, PLATFORM_BACKENDS, STANDIN_BACKENDS, model_dirs,
                                      unsupported_models)
from builder.serving.client import TritonClient
from builder.serving.install import (TritonInstall, build_backend_dir, find_tritonserver, make_workdir,
                                     server_environment, stub_safe_repository)
from builder.serving.model_control import ModelControl
from builder.serving.native_backends import backend_files
from builder.serving.server_log import describe_exit as _describe_exit
from builder.storage.s3 import is_s3_url, parse_s3_url
from builder.storage.served import inspect_repository

if TYPE_CHECKING:
    from builder.serving.client import TritonClient

__all__ = ["EMBEDDED_BACKENDS", "PLATFORM_BACKENDS", "TritonInstall", "find_tritonserver", "unsupported_models",
           "EmbeddedServer"]

_MODEL_CONTROL_MODES = ("explicit", "none", "poll")
_STOP_TIMEOUT_S = 15.0
_PORT_ATTEMPTS = 5


class EmbeddedServer(ModelControl, LocalService):
    """A real ``tritonserver`` process serving ``repository``; use as a context manager or start/stop.

    Arguments:
        repository: the model repository (one folder per model with ``config.pbtxt``), or an
            ``s3://`` URL (see builder/storage/s3.py; AWS credentials from the environment).
        http_port, grpc_port, metrics_port: fixed ports; ``None`` picks free ones (and retries on
            new ones if the server still finds one taken).
        host: the address every endpoint listens on. Clients connect to 127.0.0.1 if it is 0.0.0.0.
        log_path: the server's log file (stdout and stderr), appended to and always kept. Default
            ``<temp dir>/tritonserver.log``: the temp dir is removed when ``stop()`` ends a server that
            started and was still running (nothing to look into), and kept - with the log that the
            raised error names - when the start failed or the server ended on its own; and kept when
            that stop failed (``stop_failure`` names it).
        model_control: ``"explicit"`` (default: loads ``load_models``, or every supported model, and
            allows ``load_model``/``unload_model``), ``"none"`` (loads everything at start) or
            ``"poll"`` (also reloads changed models every 5 s unless extra_args sets
            ``--repository-poll-secs``).
        load_models: explicit mode only: the models to load at start.
        extra_args: more ``tritonserver`` arguments, passed last.
        ready_timeout: seconds to wait for the server (and its models) to be ready.
        keep_going: a model that fails to load at start goes to ``failed`` (name -> Triton's reason)
            and the others are served; the start fails only if none loads. Default: any failure does.
        control_key: the key model control needs (see above); default ``$TRITON_BUILDER_CONTROL_KEY``,
            else a random one for each start. Never printed or logged.

    After ``start()``: ``models`` lists the models it loaded at start, ``left_out`` maps each model
    it cannot serve to the reason, ``failed`` each that failed to load (``keep_going``). After
    ``stop()``: ``stop_failure`` is None, or why that stop was a failure, naming the log it kept.
    """

    label = "tritonserver"
    error = ServerError
    stop_timeout = _STOP_TIMEOUT_S
    port_attempts = _PORT_ATTEMPTS
    leftover_grace = 3.0  # python-backend stubs left behind (e.g. the server was SIGKILLed)
    log_header = True

    def __init__(
        self,
        repository: Path | str,
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        host: str = "127.0.0.1",
        log_path: Path | str | None = None,
        model_control: str = "explicit",
        load_models: Sequence[str] | None = None,
        extra_args: Sequence[str] = (),
        ready_timeout: float = 60.0,
        keep_going: bool = False,
        control_key: str | None = None,
    ):
        if model_control not in _MODEL_CONTROL_MODES:
            raise UserInputError(f"model_control '{model_control}' is not one of: {', '.join(_MODEL_CONTROL_MODES)}")
        if load_models is not None and model_control != "explicit":
            raise UserInputError(
                f"load_models only applies to model_control 'explicit'; in '{model_control}' mode Triton loads every model"
            )
        if isinstance(load_models, str):
            load_models = [load_models]
        if ready_timeout <= 0:
            raise UserInputError(f"ready_timeout must be positive, got {ready_timeout}")
        # an s3:// URL: Triton reads the bucket itself; builder.storage.served judges its models
        self.remote = parse_s3_url(repository, "repository") if is_s3_url(repository) else None
        self.repository = self.remote if self.remote is not None else Path(repository).expanduser().resolve()
        super().__init__(host, ready_timeout)
        self.model_control = model_control
        self.load_models = list(load_models) if load_models is not None else None
        self.extra_args = tuple(str(a) for a in extra_args)
        self.ready_timeout = float(ready_timeout)
        self.log_path: Path | None = Path(log_path).expanduser().resolve() if log_path is not None else None
        self.left_out: dict[str, str] = {}
        self.failed: dict[str, str] = {}
        self.keep_going = keep_going
        self._given_key = control_key
        self.control_key: str | None = None  # set by start(): the key model control needs
        self.server_id = startup.new_server_id()  # --id: the readiness probe accepts only this server
        self.models: list[str] = []
        self.native_backends: list[str] = []  #: backends served by Triton's own C++ library (set at start)
        self.stop_failure: str | None = None
        self.install: TritonInstall | None = None
        self._requested_ports = (http_port, grpc_port, metrics_port)
        self._ports: tuple[int, int, int] | None = None
        self._workdir: Path | None = None
        self._log_in_workdir = self.log_path is None
        self._started = False  # start() returned: the server was ready
        self._backend_dir: Path | None = None
        self._environ: dict[str, str] | None = None
        self._link: Path | None = None  # <workdir>/repository -> a repository path the stub cannot take
        self._bytecode: set[Path] = set()  # __pycache__ folders in the repository before the start
        self._shm: set[str] = set()  # the python backend's /dev/shm files before the start

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "EmbeddedServer":
        """Start the server and return once it and every model it loads at start are ready.

        Raises ``UserInputError`` for a bad repository or model list (before starting anything), and
        ``ServerError`` if the process exits, a model fails to load (quoting Triton's reason), or
        readiness times out. On error nothing is left running.
        """
        with self._lock:
            if self.is_running():
                return self
            if self.remote is not None:
                install = find_tritonserver()
                available, self.left_out, _ = inspect_repository(self.remote)
            else:
                if not self.repository.is_dir():
                    raise UserInputError(f"model repository {self.repository} is not a directory")
                install = find_tritonserver()
                self.left_out = unsupported_models(self.repository)
                available = [p.name for p in model_dirs(self.repository)]
            supported = [name for name in available if name not in self.left_out]
            if self.load_models is None:
                self.models = supported
            else:
                for name in self.load_models:
                    if name not in available:
                        raise UserInputError(
                            f"model '{name}' is not in {self.repository}; models there: {', '.join(available) or 'none'}"
                        )
                    if name in self.left_out:
                        raise UserInputError(f"model '{name}' cannot be served by the embedded server: {self.left_out[name]}")
                self.models = list(dict.fromkeys(self.load_models))
            self.install = install
            self._started = False
            self.stop_failure = None
            self.control_key = self._given_key or control.new_key()
            super().start()
            self._started = True
            control.register([self.http_url, self.grpc_url], self.control_key)
            return self

    def stop(self, timeout: float | None = None) -> int | None:
        """Stop the server (see ``LocalService.stop``). Its temp dir goes, except where it holds the
        log (the default) of a failed start or of a server that died (the error raised names that
        log), or of a server this stop found failed: it had to be SIGKILLed (it did not end on SIGTERM
        within ``timeout`` s: hung) or its log reports a crash; ``stop_failure`` then says which."""
        with self._lock:
            clean = self._started and self.is_running()
            if self._ports is not None:
                control.forget([self.http_url, self.grpc_url])
            code = super().stop(timeout)
            if clean:
                self.stop_failure = self._stop_failure(self.stop_timeout if timeout is None else timeout)
            if self._workdir is not None and ((clean and self.stop_failure is None) or not self._log_in_workdir):
                shutil.rmtree(self._workdir, ignore_errors=True)
            self._started = False
            return code

    def _stop_failure(self, timeout: float) -> str | None:
        """Why the stop that just ended a running server was a failure, naming the log; None if it was not.
        A crash that left the server hung was noticed only here, and its log was its only record."""
        why = []
        if self.killed_at_stop:
            why.append(f"did not stop on SIGTERM within {timeout:g} s: killed; last log lines:\n{self.log_tail(5)}")
        crash = server_log.crash_marks(self.read_log())
        if crash:
            why.append(("its log" if why else "stopped, but its log") + " reports a crash:\n"
                       + "\n".join("  " + line for line in crash))
        return f"tritonserver (pid {self.pid}) " + "\n".join(why) + f"\nlog kept at {self.log_path}" if why else None

    def _prepare(self) -> None:
        self._bytecode = startup.bytecode_dirs(self._local_repository)
        if self.model_control == "poll":  # no bytecode written under the poll, which would reload the model
            startup.precompile_bytecode(self._local_repository)
        self._shm = startup.shm_files()
        self._workdir = make_workdir()
        startup.sweep_killed_workdirs(self._workdir)
        if self._log_in_workdir:
            self.log_path = self._workdir / "tritonserver.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._link = None if self.remote is not None else stub_safe_repository(self.repository, self._workdir)
        if self._link is not None:
            with open(self.log_path, "a") as log:  # so the log's paths are not a mystery
                log.write(f"# triton-builder: model repository {self.repository} is served as {self._link} "
                          "(the python backend's stub command line cannot take its path)\n")
        native = {name: files for name in STANDIN_BACKENDS if (files := backend_files(name)) is not None}
        self.native_backends = sorted(native)
        self._backend_dir = build_backend_dir(self.install, self._workdir / "backends", native)
        self._environ = {**server_environment(self.install), **startup.SERVER_ENVIRONMENT}
        self._environ.pop(control.ENV, None)  # the models' own code (python stubs) need not see it

    @property
    def _local_repository(self) -> Path | None:
        return None if self.remote is not None else self.repository

    def _cleanup(self) -> None:
        startup.remove_new_bytecode(self._local_repository, self._bytecode)
        startup.remove_orphan_shm(self._shm)
        if self._workdir is not None:
            shutil.rmtree(self._workdir / "backends", ignore_errors=True)

    def _env(self) -> dict[str, str] | None:
        return self._environ

    def _cwd(self) -> Path | None:
        return self._workdir

    def _auto_ports(self) -> bool:
        return any(p is None for p in self._requested_ports)

    def _fixed_ports(self) -> list[tuple[str, int]]:
        return list(zip(("--http-port", "--grpc-port", "--metrics-port"), self._requested_ports))

    def _ready(self) -> bool:
        if startup.answers_as(self.http_url, self.server_id):
            return True
        crash = server_log.crash_lines(self.read_log())
        if crash:  # the server would wait for the crashed process forever: fail now, with the log's words
            raise ServerError(f"tritonserver cannot start: a process it started crashed {crash}\n"
                              f"full log: {self.log_path}")
        return False

    def _address_in_use(self, code: int) -> str | None:
        busy = [l.strip() for l in self.read_log().splitlines() if "already in use" in l]
        return busy[0] if busy and self._port_was_chosen(busy[0]) else None

    def _exit_error(self, code: int) -> Exception:
        busy = startup.busy_port_error(self.read_log(), self.host, self._fixed_ports(), self.log_path)
        return busy or ServerError(
            f"tritonserver {_describe_exit(code)} while starting:\n{self._startup_error_lines()}\nfull log: {self.log_path}"
        )

    def _timeout_error(self) -> Exception:
        return ServerError(
            f"tritonserver was not live on {self.http_url} within {self.ready_timeout:g} s; "
            f"last log lines:\n{self.log_tail()}\nfull log: {self.log_path}"
        )

    def _ports_error(self, busy, attempts: int) -> Exception:
        return ServerError(f"tritonserver could not bind its ports after {attempts} tries: {busy}; log: {self.log_path}")

    # -- process state -----------------------------------------------------------------------

    def check_alive(self) -> None:
        """Raise ``ServerDiedError`` (exit code and last log lines) if the server process has ended."""
        if self._proc is None:
            raise ServerError("tritonserver was not started; call start() first")
        code = self._proc.poll()
        if code is not None:
            raise ServerDiedError(
                f"tritonserver {_describe_exit(code)}; last log lines:\n{self.log_tail()}\nfull log: {self.log_path}"
            )

    # -- addresses ---------------------------------------------------------------------------

    def _ports_or_raise(self) -> tuple[int, int, int]:
        if self._ports is None:
            raise ServerError("tritonserver was not started; call start() first")
        return self._ports

    @property
    def http_port(self) -> int:
        return self._ports_or_raise()[0]

    @property
    def grpc_port(self) -> int:
        return self._ports_or_raise()[1]

    @property
    def metrics_port(self) -> int:
        return self._ports_or_raise()[2]

    @property
    def _client_host(self) -> str:
        return client_host(self.host)

    @property
    def http_url(self) -> str:
        """``host:port`` for ``tritonclient.http`` (no scheme)."""
        return f"{self._client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` for ``tritonclient.grpc``."""
        return f"{self._client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """The Prometheus endpoint, ``http://host:port/metrics``."""
        return f"http://{self._client_host}:{self.metrics_port}/metrics"

    # -- log ---------------------------------------------------------------------------------

    def read_log(self, since: int | None = None) -> str:
        """The log text (see ``LocalService.read_log``), naming the real repository folder, not its link."""
        return self._real_paths(super().read_log(since))

    def _real_paths(self, text: str) -> str:
        return text if self._link is None else server_log.real_paths(text, self._link, self.repository)

    def log_tail(self, lines: int = 20, since: int | None = None) -> str:
        """The last ``lines`` meaningful log lines (GPU-less noise and tables dropped), indented."""
        return server_log.meaningful_tail(self.read_log(since), lines)

    def _model_log_lines(self, name: str, since: int | None = None) -> list[str]:
        """Log lines about model ``name`` that say it failed."""
        return server_log.model_log_lines(self.read_log(since), name)

    def _startup_error_lines(self) -> str:
        return server_log.startup_error_lines(self.read_log())

    # -- start-up internals ------------------------------------------------------------------

    def _pick_ports(self) -> None:
        self._ports = self._choose_ports()

    def _choose_ports(self) -> tuple[int, int, int]:
        wanted = list(self._requested_ports)
        free = iter(free_ports(self.host, sum(p is None for p in wanted)))
        return tuple(p if p is not None else next(free) for p in wanted)  # type: ignore[return-value]

    def _port_was_chosen(self, message: str) -> bool:
        """Whether the port an "already in use" message names is one we picked (so new ones may help)."""
        found = re.search(r":(\d+)'", message)
        chosen = [port for port, asked in zip(self._ports_or_raise(), self._requested_ports) if asked is None]
        if found is None:
            return len(chosen) == 3
        return int(found.group(1)) in chosen

    def _command(self) -> list[str]:
        http, grpc, metrics = self._ports_or_raise()
        backend_dir = self._backend_dir
        cmd = [
            str(self.install.binary),
            f"--model-repository={self.remote.triton_url() if self.remote is not None else self._link or self.repository}",
            f"--backend-directory={backend_dir}",
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            f"--model-control-mode={self.model_control}",
            "--exit-on-error=false",
            f"--id={self.server_id}",
        ]
        if self.keep_going or (self.model_control != "explicit" and self.left_out):
            cmd.append("--strict-readiness=false")  # strict, one model that cannot load keeps it unready forever
        if self.model_control == "explicit":
            cmd += [f"--load-model={name}" for name in self.models]
        else:
            if self.model_control == "poll" and not any(a.startswith("--repository-poll-secs") for a in self.extra_args):
                cmd.append("--repository-poll-secs=5")
        own = not any(a.startswith(("--http-restricted-api", "--grpc-restricted-protocol")) for a in self.extra_args)
        return cmd + (control.server_args(self.control_key) if own else []) + list(self.extra_args)

    def _shown_command(self, cmd: list[str]) -> list[str]:
        return control.masked(cmd, self.control_key)

    def _wait_ready(self) -> None:
        """Wait for live, check the start-up models, then wait for ready; all within ready_timeout."""
        super()._wait_ready()  # live (``_ready``), or the exit / address-in-use / timeout errors
        try:
            # Models loaded at start: Triton opens HTTP only after trying them all.
            self.failed = startup.wait_for_start_models(self)
            if self.failed and (not self.keep_going or len(self.failed) == len(self.models)):
                raise startup.load_error(self.failed, self.log_path, self.keep_going and len(self.models) > 1,
                                         self.left_out if self.keep_going else None)
            self.models = [name for name in self.models if name not in self.failed]
            if self.model_control != "poll":  # removed at the stop in poll mode: a removal is a change it reloads
                startup.remove_new_bytecode(self._local_repository, self._bytecode)
            self.wait_until_ready(max(0.5, self._ready_deadline - time.monotonic()))
        except ServerDiedError:  # it bound HTTP, then failed on a port another process holds
            busy = startup.busy_port_error(self.read_log(), self.host, self._fixed_ports(), self.log_path)
            if busy is None:
                raise
            raise busy from None

    # -- talking to the server ---------------------------------------------------------------

    def triton(self, network_timeout: float = 60.0) -> TritonClient:
        """A new ``TritonClient`` (HTTP) for this server (close it, or use ``with``); its errors
        become ``ServerDiedError`` when the process has ended."""

        self._ports_or_raise()
        return TritonClient(self.http_url, "http", network_timeout=network_timeout, connection_timeout=5.0,
                            server="tritonserver", on_error=self.check_alive, control_key=self.control_key)

    def client(self, network_timeout: float = 60.0):
        """A new ``tritonclient.http.InferenceServerClient`` for this server (close it when done)."""
        return self.triton(network_timeout).raw

    def _call(self, what: str, fn: Callable, network_timeout: float = 60.0):
        """``fn(TritonClient)`` after checking the process is alive; the client is closed after."""
        self.check_alive()
        with self.triton(network_timeout) as triton:
            return fn(triton)

    def is_ready(self) -> bool:
        """Whether ``/v2/health/ready`` answers 200."""
        return self.is_running() and http_get(f"http://{self.http_url}/v2/health/ready", timeout=1.0)[0] == 200

    def wait_until_ready(self, timeout: float = 60.0) -> None:
        """Wait for ``/v2/health/ready``; ``ServerDiedError`` if the process ends, ``ServerError`` on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            if self.is_ready():
                return
            if time.monotonic() > deadline:
                raise ServerError(
                    f"tritonserver at {self.http_url} was not ready within {timeout:g} s; "
                    f"last log lines:\n{self.log_tail()}\nfull log: {self.log_path}"
                )
            time.sleep(0.1)
