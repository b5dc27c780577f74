"""Run a real Triton server without docker, from the ``tritonserver`` binary in the nvidia-pytriton wheel.

The wheel (``pip install nvidia-pytriton==0.7.0``) ships Triton 2.51 with only the *python* backend.
So this server runs python-backend models (and ensembles made only of them) on any Linux machine,
with no GPU and no docker. Models that need another backend (onnxruntime, tensorrt, pytorch, ...)
are left out, each with a reason (``EmbeddedServer.left_out``), and the rest are still served.

Usage::

    from pathlib import Path
    from builder.serving.embedded import EmbeddedServer, serve_forever, unsupported_models

    unsupported_models(Path("model_repository"))   # {"resnet_onnx": "platform onnxruntime_onnx needs ..."}

    with EmbeddedServer(Path("model_repository")) as server:   # start(): returns once ready
        print(server.http_url, server.grpc_url, server.metrics_url, server.log_path)
        print(server.models, server.left_out)      # served models; {name: reason} left out
        server.unload_model("resnet_python")
        server.load_model("resnet_python")         # ServerError quoting Triton's reason on failure
        server.check_alive()                       # ServerDiedError if the process has ended
    # stopped here: SIGTERM to its process group, SIGKILL after 15 s (also at interpreter exit)

    # What ``triton-builder serve`` runs: announces the URLs, blocks until SIGINT/SIGTERM,
    # stops the server and returns an exit code (non-zero if the server died on its own).
    code = serve_forever(Path("model_repository"))

How it runs the binary (facts measured with nvidia-pytriton 0.7.0):

- The backend directory is built in a temp folder: ``<tmp>/backends/python/`` links
  ``libtriton_python.so``, ``triton_python_backend_utils.py`` and the ``triton_python_backend_stub``
  built for the running Python (``pytriton/tritonserver/python_backend_stubs/3.X/``).
- ``LD_LIBRARY_PATH`` starts with ``<site-packages>/nvidia_pytriton.libs`` and this interpreter's
  ``LIBDIR`` (the stub links ``libpython3.X.so``; another one on the system would win otherwise), and
  ``PATH`` starts with ``dirname(sys.executable)`` so the stub imports this environment's packages.
- All addresses are ``127.0.0.1`` by default, on free ports asked from the OS (port 0); if the server
  still reports an address in use, the start is retried on new ports.
- ``--exit-on-error=false`` is always passed, so a model that fails to load does not kill the
  server; ``start()`` then checks every model it asked for and raises ``ServerError`` with Triton's
  own reason. In ``none``/``poll`` mode Triton tries every model, so ``--strict-readiness=false``
  is added when some are left out (otherwise ``/v2/health/ready`` would never say ready).
- Log lines about NVML, DCGM, CudaDriverHelper and pinned memory are expected without a GPU;
  they are dropped from the log excerpts quoted in errors.

The server runs in its own process group (it does not get the terminal's Ctrl-C); ``stop()`` ends
the whole group, python-backend stub processes included. ``stop()`` is registered with ``atexit``,
which runs on normal interpreter exit and on KeyboardInterrupt, not on SIGKILL or an unhandled
SIGTERM: callers that must survive those install handlers, as ``serve_forever`` does.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from builder.errors import ServerDiedError, ServerError, UserInputError
from builder.repository.config import parse_config
from builder.processes import free_ports, group_alive, killpg, stop_signals

__all__ = [
    "EMBEDDED_BACKENDS",
    "PLATFORM_BACKENDS",
    "TritonInstall",
    "find_tritonserver",
    "unsupported_models",
    "EmbeddedServer",
    "serve_forever",
]

#: Backends the embedded server has. Ensembles are run by the server core and need no backend.
EMBEDDED_BACKENDS: tuple[str, ...] = ("python",)

#: The backend Triton needs for each ``platform:`` value.
PLATFORM_BACKENDS: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "pytorch_libtorch": "pytorch",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
    "openvino": "openvino",
}

INSTALL_HINT = "pip install nvidia-pytriton==0.7.0"
_ALTERNATIVE = "serve its python-backend variant or use docker compose on a GPU host"
_MODEL_CONTROL_MODES = ("explicit", "none", "poll")
_STOP_TIMEOUT_S = 15.0
_PORT_ATTEMPTS = 5
# Expected on machines without a GPU; never the reason anything failed.
_NOISE = ("NVML", "DCGM", "CudaDriverHelper", "pinned memory", "pinned_memory")


# --------------------------------------------------------------------------------------------
# Locating the binary


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of the wheel's Triton server are."""

    binary: Path  #: ``pytriton/tritonserver/bin/tritonserver``
    python_backend_dir: Path  #: holds ``libtriton_python.so`` and ``triton_python_backend_utils.py``
    stub: Path  #: ``triton_python_backend_stub`` for the running Python version
    libs_dir: Path  #: ``site-packages/nvidia_pytriton.libs`` (the binary's bundled shared libraries)
    python_libdir: Path | None  #: this interpreter's LIBDIR (``libpython3.X.so``), if it exists

    @property
    def backend_library(self) -> Path:
        return self.python_backend_dir / "libtriton_python.so"

    @property
    def backend_utils(self) -> Path:
        return self.python_backend_dir / "triton_python_backend_utils.py"


def find_tritonserver() -> TritonInstall:
    """Find the ``tritonserver`` binary and python backend in the installed nvidia-pytriton wheel.

    Raises ``ServerError`` naming every missing piece and how to install it.
    """
    if not sys.platform.startswith("linux"):
        raise ServerError(
            f"the embedded Triton server runs on Linux only (this is {sys.platform}); "
            "use docker compose on a Linux host instead"
        )
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerError(f"the embedded Triton server needs the nvidia-pytriton wheel, which is not installed: {INSTALL_HINT}")
    package = Path(list(spec.submodule_search_locations)[0])
    root = package / "tritonserver"
    binary = root / "bin" / "tritonserver"
    backend = root / "backends" / "python"
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stubs_root = root / "python_backend_stubs"
    stub = stubs_root / pyver / "triton_python_backend_stub"
    libs = package.parent / "nvidia_pytriton.libs"

    missing = []
    if not binary.is_file():
        missing.append(f"the server binary {binary}")
    elif not os.access(binary, os.X_OK):
        missing.append(f"execute permission on {binary}")
    for piece in (backend / "libtriton_python.so", backend / "triton_python_backend_utils.py"):
        if not piece.is_file():
            missing.append(f"the python backend file {piece}")
    if not stub.is_file():
        have = sorted(p.name for p in stubs_root.iterdir() if (p / "triton_python_backend_stub").is_file()) if stubs_root.is_dir() else []
        missing.append(
            f"the python backend stub for Python {pyver} ({stub}; stubs found for: {', '.join(have) or 'none'})"
        )
    if not libs.is_dir():
        missing.append(f"the bundled libraries folder {libs}")
    if missing:
        raise ServerError(
            "the embedded Triton server from nvidia-pytriton is incomplete; missing "
            + "; ".join(missing)
            + f". Reinstall it with: {INSTALL_HINT}"
        )
    libdir = sysconfig.get_config_var("LIBDIR")
    python_libdir = Path(libdir) if libdir and Path(libdir).is_dir() else None
    return TritonInstall(binary, backend, stub, libs, python_libdir)


# --------------------------------------------------------------------------------------------
# Which models the embedded server can serve


def _model_dirs(repository: Path) -> list[Path]:
    """Model folders of a repository, as Triton sees them (hidden entries skipped)."""
    return sorted(p for p in Path(repository).iterdir() if p.is_dir() and not p.name.startswith("."))


def unsupported_models(repository: Path) -> dict[str, str]:
    """``{model_name: reason}`` for every model in ``repository`` the embedded server cannot serve.

    Reads each ``<repository>/<model>/config.pbtxt`` into ``ModelConfig``. A model is left out when
    its platform or backend is not in ``EMBEDDED_BACKENDS``, when its config is missing or does not
    parse, when its ``name:`` differs from its folder, or when it is an ensemble with a step that
    is left out or not in the repository.
    """
    repository = Path(repository)
    if not repository.is_dir():
        raise UserInputError(f"model repository {repository} is not a directory; pass the folder holding one sub-folder per model")
    reasons: dict[str, str] = {}
    ensembles: dict[str, list[str]] = {}
    names = []
    for folder in _model_dirs(repository):
        name = folder.name
        names.append(name)
        cfg_path = folder / "config.pbtxt"
        if not cfg_path.is_file():
            reasons[name] = f"no config.pbtxt in {folder}; the embedded server needs one that says backend: \"python\""
            continue
        try:
            config = parse_config(cfg_path.read_text(encoding="utf-8"), str(cfg_path))
        except (UserInputError, UnicodeDecodeError, OSError) as err:
            reasons[name] = str(err)
            continue
        if config.name and config.name != name:
            reasons[name] = f"{cfg_path} says name: \"{config.name}\" but the folder is '{name}'; Triton needs them equal"
            continue
        platform, backend = config.platform, config.backend
        if platform == "ensemble":
            ensembles[name] = [step.model_name for step in config.ensemble_scheduling.step]
            continue
        needed = backend or PLATFORM_BACKENDS.get(platform, "")
        if needed in EMBEDDED_BACKENDS:
            continue
        if not platform and not backend:
            reasons[name] = f"{cfg_path} names neither backend nor platform; the embedded server only runs backend: \"python\" models"
        elif platform and not backend and platform not in PLATFORM_BACKENDS:
            reasons[name] = f"platform {platform} needs a backend the embedded server does not have; {_ALTERNATIVE}"
        elif platform:
            reasons[name] = f"platform {platform} needs the '{needed}' backend, which the embedded server does not have; {_ALTERNATIVE}"
        else:
            reasons[name] = f"backend '{backend}' is not in the embedded server (it has only {', '.join(EMBEDDED_BACKENDS)}); {_ALTERNATIVE}"

    # Ensembles: left out if any step is; repeat until nothing changes (ensembles of ensembles).
    changed = True
    while changed:
        changed = False
        for name, steps in ensembles.items():
            if name in reasons:
                continue
            for step in steps:
                if step not in names:
                    reasons[name] = f"ensemble step model '{step}' is not in the repository"
                elif step in reasons:
                    reasons[name] = f"ensemble step model '{step}' is left out ({reasons[step]})"
                else:
                    continue
                changed = True
                break
    return {name: reasons[name] for name in names if name in reasons}


# --------------------------------------------------------------------------------------------
# Helpers


def _is_noise(line: str) -> bool:
    stripped = line.strip()
    if not stripped or stripped[0] in "+|" or any(word in line for word in _NOISE):
        return True
    return stripped.endswith("]") and stripped[0] in "IW"  # a header line whose table was dropped


def _readable(line: str) -> str:
    """Triton quotes messages with literal ``\\n``; show them as indented lines."""
    parts = [part.rstrip() for part in line.replace("\\n", "\n").splitlines() if part.strip()]
    return "\n    ".join(parts)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"exited with code {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"exited with code {code}"
    return f"exited with code {code}"


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_status(url: str, timeout: float = 1.0) -> int | None:
    """HTTP status of a GET (proxies ignored), or None if nothing answered."""
    try:
        with _NO_PROXY.open(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, OSError):
        return None


class _AddressInUse(Exception):
    pass


# --------------------------------------------------------------------------------------------
# The server


class EmbeddedServer:
    """A real ``tritonserver`` process serving ``repository``; use as a context manager or start/stop.

    Arguments:
        repository: the model repository (one folder per model with ``config.pbtxt``), or an
            ``s3://`` URL (see builder/storage/s3.py; AWS credentials from the environment).
        http_port, grpc_port, metrics_port: fixed ports; ``None`` picks free ones (and retries on
            new ones if the server still finds one taken).
        host: the address every endpoint listens on. Clients connect to 127.0.0.1 if it is 0.0.0.0.
        log_path: the server's log file (stdout and stderr); default ``<temp dir>/tritonserver.log``,
            kept after ``stop()`` so callers can point users at it.
        model_control: ``"explicit"`` (default: loads ``load_models``, or every supported model, and
            allows ``load_model``/``unload_model``), ``"none"`` (loads everything at start) or
            ``"poll"`` (also reloads changed models every 5 s unless extra_args sets
            ``--repository-poll-secs``).
        load_models: explicit mode only: the models to load at start.
        extra_args: more ``tritonserver`` arguments, passed last.
        ready_timeout: seconds to wait for the server (and its models) to be ready.

    After ``start()``: ``models`` lists the models it loaded at start, ``left_out`` maps each model
    it cannot serve to the reason.
    """

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
        from builder.storage.s3 import is_s3_url, parse_s3_url
        self.remote = parse_s3_url(repository, "repository") if is_s3_url(repository) else None
        self.repository = self.remote if self.remote is not None else Path(repository).expanduser().resolve()
        self.host = host
        self.model_control = model_control
        self.load_models = list(load_models) if load_models is not None else None
        self.extra_args = tuple(str(a) for a in extra_args)
        self.ready_timeout = float(ready_timeout)
        self.log_path: Path | None = Path(log_path).expanduser().resolve() if log_path is not None else None
        self.left_out: dict[str, str] = {}
        self.models: list[str] = []
        self.install: TritonInstall | None = None
        self._requested_ports = (http_port, grpc_port, metrics_port)
        self._ports: tuple[int, int, int] | None = None
        self._proc: subprocess.Popen | None = None
        self._workdir: Path | None = None
        self._log_offset = 0
        self._lock = threading.RLock()
        self._atexit_registered = False

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "EmbeddedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

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
                from builder.storage.served import inspect_repository
                install = find_tritonserver()
                available, self.left_out, _ = inspect_repository(self.remote)
            else:
                if not self.repository.is_dir():
                    raise UserInputError(f"model repository {self.repository} is not a directory")
                install = find_tritonserver()
                self.left_out = unsupported_models(self.repository)
                available = [p.name for p in _model_dirs(self.repository)]
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

            self._workdir = Path(tempfile.mkdtemp(prefix="triton-embedded-"))
            if self.log_path is None:
                self.log_path = self._workdir / "tritonserver.log"
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            backend_dir = self._build_backend_dir(install, self._workdir / "backends")
            env = self._environment(install)
            auto_ports = any(p is None for p in self._requested_ports)
            attempts = _PORT_ATTEMPTS if auto_ports else 1
            try:
                for attempt in range(1, attempts + 1):
                    self._ports = self._choose_ports()
                    self._launch(install, backend_dir, env)
                    try:
                        self._wait_started()
                        break
                    except _AddressInUse as busy:
                        if attempt == attempts:
                            raise ServerError(
                                f"tritonserver could not bind its ports after {attempts} tries: {busy}; log: {self.log_path}"
                            ) from None
                        self._terminate()
            except BaseException:
                self.stop()
                raise
            if not self._atexit_registered:
                atexit.register(self.stop)
                self._atexit_registered = True
            return self

    def stop(self, timeout: float = _STOP_TIMEOUT_S) -> int | None:
        """Stop the server: SIGTERM to its process group, SIGKILL after ``timeout`` s. Idempotent.

        Returns the server's exit code (None if it was never started).
        """
        with self._lock:
            code = self._terminate(timeout)
            if self._atexit_registered:
                atexit.unregister(self.stop)
                self._atexit_registered = False
            if self._workdir is not None:
                shutil.rmtree(self._workdir / "backends", ignore_errors=True)
            return code

    def _terminate(self, timeout: float = _STOP_TIMEOUT_S) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        pgid = proc.pid  # start_new_session=True: the server leads its own process group
        if proc.poll() is None:
            killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                killpg(pgid, signal.SIGKILL)
                proc.wait(5)
        # python-backend stubs left behind (e.g. the server was SIGKILLed): give them a moment, then kill
        deadline = time.monotonic() + 3.0
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if group_alive(pgid):
            killpg(pgid, signal.SIGKILL)
        return proc.returncode

    # -- process state -----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The server's process id (also its process group id), or None before ``start()``."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has ended, else None."""
        return self._proc.poll() if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

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
        if self.host in ("0.0.0.0", ""):
            return "127.0.0.1"
        if self.host == "::":
            return "[::1]"
        return f"[{self.host}]" if ":" in self.host else self.host

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

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size if self.log_path else 0
        except OSError:
            return 0

    def read_log(self, since: int | None = None) -> str:
        """The server's log text from byte ``since`` (default: the start of the current run)."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset if since is None else since)
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 20, since: int | None = None) -> str:
        """The last ``lines`` meaningful log lines (GPU-less noise and tables dropped), indented."""
        kept = [_readable(line) for line in self.read_log(since).splitlines() if not _is_noise(line)]
        return "\n".join("  " + line for line in kept[-lines:]) or "  (log is empty)"

    def _model_log_lines(self, name: str, since: int | None = None) -> list[str]:
        """Log lines about model ``name`` that say it failed."""
        found = []
        for line in self.read_log(since).splitlines():
            if _is_noise(line):
                continue
            about = f"'{name}'" in line or f"/{name}/" in line
            if about and ("fail" in line.lower() or "error" in line.lower()):
                found.append(_readable(line))
        return found

    def _startup_error_lines(self) -> str:
        text = self.read_log()
        errors = [_readable(l) for l in text.splitlines() if not _is_noise(l) and (l.startswith("E") or l.lower().startswith("error"))]
        if errors:
            return "\n".join("  " + line for line in errors[-15:])
        return self.log_tail()

    # -- start-up internals ------------------------------------------------------------------

    @staticmethod
    def _build_backend_dir(install: TritonInstall, backends: Path) -> Path:
        target = backends / "python"
        target.mkdir(parents=True, exist_ok=True)
        for src, name in (
            (install.backend_library, "libtriton_python.so"),
            (install.backend_utils, "triton_python_backend_utils.py"),
            (install.stub, "triton_python_backend_stub"),
        ):
            dst = target / name
            try:
                dst.symlink_to(src)
            except OSError:
                shutil.copy2(src, dst)
        return backends

    @staticmethod
    def _environment(install: TritonInstall) -> dict[str, str]:
        env = dict(os.environ)
        lib_dirs = [str(install.libs_dir)]
        if install.python_libdir is not None:
            lib_dirs.append(str(install.python_libdir))
        if env.get("LD_LIBRARY_PATH"):
            lib_dirs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_dirs)
        bin_dir = os.path.dirname(sys.executable)
        env["PATH"] = os.pathsep.join([bin_dir] + ([env["PATH"]] if env.get("PATH") else []))
        return env

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

    def _command(self, install: TritonInstall, backend_dir: Path) -> list[str]:
        http, grpc, metrics = self._ports_or_raise()
        cmd = [
            str(install.binary),
            f"--model-repository={self.remote.triton_url() if self.remote is not None else self.repository}",
            f"--backend-directory={backend_dir}",
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            f"--model-control-mode={self.model_control}",
            "--exit-on-error=false",
        ]
        if self.model_control == "explicit":
            cmd += [f"--load-model={name}" for name in self.models]
        else:
            if self.left_out:
                cmd.append("--strict-readiness=false")
            if self.model_control == "poll" and not any(a.startswith("--repository-poll-secs") for a in self.extra_args):
                cmd.append("--repository-poll-secs=5")
        return cmd + list(self.extra_args)

    def _launch(self, install: TritonInstall, backend_dir: Path, env: dict[str, str]) -> None:
        cmd = self._command(install, backend_dir)
        self._log_offset = self._log_size()
        with open(self.log_path, "ab") as log:
            log.write(("# triton-builder: " + " ".join(cmd) + "\n").encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(self._workdir),
                start_new_session=True,
            )

    def _wait_started(self) -> None:
        """Wait for live, check the start-up models, then wait for ready; all within ready_timeout."""
        deadline = time.monotonic() + self.ready_timeout
        live_url = f"http://{self.http_url}/v2/health/live"
        while True:
            code = self._proc.poll()
            if code is not None:
                busy = [l.strip() for l in self.read_log().splitlines() if "already in use" in l]
                if busy and self._port_was_chosen(busy[0]):
                    raise _AddressInUse(busy[0])
                raise ServerError(
                    f"tritonserver {_describe_exit(code)} while starting:\n{self._startup_error_lines()}\nfull log: {self.log_path}"
                )
            if _http_status(live_url) == 200:
                break
            if time.monotonic() > deadline:
                raise ServerError(
                    f"tritonserver was not live on {self.http_url} within {self.ready_timeout:g} s; "
                    f"last log lines:\n{self.log_tail()}\nfull log: {self.log_path}"
                )
            time.sleep(0.1)

        # Models loaded at start: Triton opens HTTP only after trying them all.
        while True:
            states = {entry.get("name"): entry for entry in self.repository_index()}
            pending = [n for n in self.models if states.get(n, {}).get("state") in (None, "LOADING", "UNLOADING")]
            failed = {n: states.get(n, {}) for n in self.models if n not in pending and states[n].get("state") != "READY"}
            if failed:
                parts = []
                for name, entry in failed.items():
                    reason = entry.get("reason") or "\n".join(self._model_log_lines(name)) or "no reason given"
                    parts.append(f"- {name}: {entry.get('state', 'UNKNOWN')}: {_readable(reason)}")
                raise ServerError(
                    "tritonserver could not load "
                    + ("model " if len(parts) == 1 else "models ")
                    + ", ".join(f"'{n}'" for n in failed)
                    + ":\n"
                    + "\n".join(parts)
                    + f"\nfull log: {self.log_path}"
                )
            if not pending:
                break
            self.check_alive()
            if time.monotonic() > deadline:
                raise ServerError(
                    f"models still loading after {self.ready_timeout:g} s: {', '.join(pending)}; full log: {self.log_path}"
                )
            time.sleep(0.1)
        self.wait_until_ready(max(0.5, deadline - time.monotonic()))

    # -- talking to the server ---------------------------------------------------------------

    def client(self, network_timeout: float = 60.0):
        """A new ``tritonclient.http.InferenceServerClient`` for this server (close it when done)."""
        import tritonclient.http as httpclient

        self._ports_or_raise()
        return httpclient.InferenceServerClient(self.http_url, connection_timeout=5.0, network_timeout=network_timeout)

    def _call(self, what: str, fn: Callable, network_timeout: float = 60.0):
        from tritonclient.utils import InferenceServerException

        self.check_alive()
        client = self.client(network_timeout)
        try:
            return fn(client)
        except InferenceServerException as err:
            self.check_alive()
            raise ServerError(f"tritonserver at {self.http_url}: {what} failed: {err.message()}") from None
        except OSError as err:
            self.check_alive()
            raise ServerError(f"tritonserver at {self.http_url} did not answer ({what}): {err}") from None
        finally:
            client.close()

    def is_ready(self) -> bool:
        """Whether ``/v2/health/ready`` answers 200."""
        return self.is_running() and _http_status(f"http://{self.http_url}/v2/health/ready") == 200

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

    def repository_index(self) -> list[dict]:
        """``/v2/repository/index``: one ``{"name", "version", "state", "reason"}`` dict per model."""
        return self._call("repository index", lambda c: c.get_model_repository_index())

    def model_state(self, name: str) -> tuple[str | None, str]:
        """``(state, reason)`` of a model from the repository index; state None if it is not there."""
        for entry in self.repository_index():
            if entry.get("name") == name:
                return entry.get("state"), entry.get("reason", "")
        return None, ""

    def model_ready(self, name: str) -> bool:
        """Whether model ``name`` is ready for inference."""
        return self._call(f"readiness of model '{name}'", lambda c: c.is_model_ready(name))

    def load_model(self, name: str, config_json: str | None = None, timeout: float = 120.0) -> None:
        """Load (or reload) model ``name``, optionally with a JSON config override; blocks until done.

        Raises ``ServerError`` quoting Triton's reason (and the log lines about the model) if it
        fails, ``ServerDiedError`` if the server died meanwhile.
        """
        from tritonclient.utils import InferenceServerException

        if name in self.left_out:
            raise ServerError(f"model '{name}' cannot be served by the embedded server: {self.left_out[name]}")
        self.check_alive()
        since = self._log_size()
        client = self.client(network_timeout=timeout)
        try:
            client.load_model(name, config=config_json)
        except InferenceServerException as err:
            self.check_alive()
            reason = _readable((err.message() or "").strip().rstrip(";"))
            if not reason:  # no reason in the answer: quote the log lines about the model
                reason = "\n".join(self._model_log_lines(name, since)) or str(err)
            raise ServerError(f"tritonserver could not load model '{name}': {reason}\nfull log: {self.log_path}") from None
        except OSError as err:
            self.check_alive()
            raise ServerError(f"tritonserver at {self.http_url} did not answer while loading '{name}': {err}") from None
        finally:
            client.close()
        if name not in self.models:
            self.models.append(name)

    def unload_model(self, name: str, wait: bool = True, timeout: float = 60.0, unload_dependents: bool = False) -> None:
        """Unload model ``name``; with ``wait``, return once Triton no longer lists it as ready."""
        self._call(f"unload of model '{name}'", lambda c: c.unload_model(name, unload_dependents=unload_dependents))
        if name in self.models:
            self.models.remove(name)
        if wait:
            deadline = time.monotonic() + timeout
            while self.model_state(name)[0] in ("READY", "UNLOADING"):
                if time.monotonic() > deadline:
                    raise ServerError(f"model '{name}' was still loaded {timeout:g} s after the unload request")
                time.sleep(0.05)

    def wait_for_model(self, name: str, timeout: float = 60.0) -> None:
        """Wait until model ``name`` is READY; ``ServerError`` with Triton's reason if it became UNAVAILABLE."""
        deadline = time.monotonic() + timeout
        while True:
            state, reason = self.model_state(name)
            if state == "READY":
                return
            if state == "UNAVAILABLE" and reason and reason != "unloaded":
                raise ServerError(f"model '{name}' is UNAVAILABLE: {_readable(reason)}\nfull log: {self.log_path}")
            if time.monotonic() > deadline:
                raise ServerError(f"model '{name}' was not ready within {timeout:g} s (state: {state or 'not in the index'})")
            time.sleep(0.1)


# --------------------------------------------------------------------------------------------
# The ``triton-builder serve`` loop


def _print_flush(*args, **kwargs) -> None:
    print(*args, **kwargs, flush=True)


def serve_forever(
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
    announce: Callable[[str], object] = _print_flush,
    poll_interval: float = 0.2,
) -> int:
    """Start an ``EmbeddedServer``, announce it, block until SIGINT/SIGTERM, stop it; return an exit code.

    Returns 0 after a clean stop on a signal, and ``ServerDiedError.exit_code`` (2) if the server
    process ended on its own (after announcing its exit code and last log lines). Start-up failures
    raise ``UserInputError``/``ServerError`` as ``EmbeddedServer.start`` does. ``announce`` gets one
    line at a time (the default prints and flushes). Signal handlers are installed only when
    called from the main thread, and the previous ones are restored on return.
    """
    server = EmbeddedServer(
        repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        host=host,
        log_path=log_path,
        model_control=model_control,
        load_models=load_models,
        extra_args=extra_args,
        ready_timeout=ready_timeout,
    )
    with stop_signals() as received:
        try:
            server.start()
            _announce_started(server, announce)
            while not received:
                if not server.is_running():
                    announce(
                        f"tritonserver {_describe_exit(server.returncode)} on its own; last log lines:\n"
                        f"{server.log_tail()}\nfull log: {server.log_path}"
                    )
                    return ServerDiedError.exit_code
                time.sleep(poll_interval)
            announce(f"received {signal.Signals(received[0]).name}; stopping tritonserver (pid {server.pid}) ...")
            code = server.stop()
            announce(f"tritonserver stopped (exit code {code})")
            return 0
        finally:
            server.stop()


def _announce_started(server: EmbeddedServer, announce: Callable[[str], object]) -> None:
    announce(f"Triton server (embedded, backends: {', '.join(EMBEDDED_BACKENDS)}) is ready, pid {server.pid}")
    announce(f"  HTTP     {server.http_url}   (http://{server.http_url}/v2/health/ready)")
    announce(f"  gRPC     {server.grpc_url}")
    announce(f"  metrics  {server.metrics_url}")
    announce(f"  log      {server.log_path}")
    announce(f"  serving  {', '.join(server.models) if server.models else '(no models)'}")
    for name, reason in server.left_out.items():
        announce(f"  left out {name}: {reason}")
    announce("Stop with Ctrl-C (SIGINT) or SIGTERM.")
