"""Small process and port helpers shared by every local service we start (tritonserver, Prometheus,
the exporter, nginx, moto, Locust).

This is the ONE module that starts processes: long-running ones are ``LocalService`` subclasses,
one-shot commands go through ``run_command``. Standard library only (builder/tensorrt/plan_build.py
runs inside the NGC image with nothing else installed).

Usage::

    class Echo(LocalService):
        label = "echo server"
        def __init__(self):
            super().__init__(ready_timeout=10)
            self.log_path, self.port = Path("echo.log"), None
        def _auto_ports(self): return True
        def _pick_ports(self): self.port = free_port(self.host)
        def _command(self): return [sys.executable, "-m", "http.server", "-b", self.host, str(self.port)]
        def _ready(self): return port_open(self.host, self.port)

    with Echo() as echo:            # start(): returns once _ready(); stop(): SIGTERM, then SIGKILL
        print(echo.pid, echo.log_tail())

    done = run_command(["nvidia-smi", "-L"], timeout=60)   # CompletedProcess, text output captured
"""

from __future__ import annotations

import atexit
import os
import queue
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Mapping, Sequence

from builder.core.interrupts import stop_signals, terminate_as_interrupt  # noqa: F401 (re-exported)

# the port helpers live in builder.core.ports; re-exported, as every service imports them from here
from builder.core.ports import (  # noqa: F401
    bind_refusal,
    client_host,
    free_port,
    free_ports,
    port_in_use,
    port_open,
    refuse_taken_ports,
)

# local services on 127.0.0.1: a proxy from the environment must not intercept readiness probes
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout: float = 5.0) -> tuple[int | None, bytes]:
    """(status, body) of a GET, proxies ignored; (None, b"") if nothing answered. For readiness
    probes and the small HTTP APIs of the services we start."""
    try:
        with _NO_PROXY.open(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read() if err.fp is not None else b""
    except (urllib.error.URLError, OSError):
        return None, b""


def killpg(pgid: int, sig: int) -> None:
    """Signal a process group; one that is already gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_reaches(send, target: int) -> bool:
    try:
        send(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: alive all the same
        return True
    return True


def group_alive(pgid: int) -> bool:
    return _signal_reaches(os.killpg, pgid)


def pid_alive(pid: int) -> bool:
    return _signal_reaches(os.kill, pid)


def die_with_parent():
    """A ``preexec_fn`` giving the child SIGTERM when the thread that started it dies (Linux
    ``PR_SET_PDEATHSIG``), so a parent killed without cleanup leaves nothing behind; None elsewhere.
    Fork through ``from_lasting_thread``: a child forked by a short-lived thread dies with it."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None

    def preexec() -> None:
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return preexec


_FORKS: "queue.Queue[tuple[Callable, list, threading.Event]]" = queue.Queue()
_FORKER: threading.Thread | None = None
_FORKER_LOCK = threading.Lock()


def _forker() -> None:
    while True:
        fn, result, done = _FORKS.get()
        try:
            result.append((True, fn()))
        except BaseException as err:  # handed to the caller's thread, raised there
            result.append((False, err))
        done.set()


def from_lasting_thread(fn: Callable):
    """``fn()`` run on one daemon thread that lasts as long as this process. PR_SET_PDEATHSIG fires
    when the forking *thread* ends, so children forked from pool threads (replicas start side by
    side) were killed with the pool, and services were left without the signal at all."""
    global _FORKER
    with _FORKER_LOCK:
        if _FORKER is None or not _FORKER.is_alive():  # also after os.fork(): threads do not survive it
            _FORKER = threading.Thread(target=_forker, name="builder-forker", daemon=True)
            _FORKER.start()
    result: list = []
    done = threading.Event()
    _FORKS.put((fn, result, done))
    done.wait()
    ok, value = result[0]
    if not ok:
        raise value
    return value


# -- One-shot commands --

TimeoutExpired = subprocess.TimeoutExpired


class CommandError(RuntimeError):
    """``run_command(..., check=True)``: the command exited non-zero; the message quotes its output."""

    def __init__(self, cmd: Sequence[str], returncode: int, output: str):
        self.cmd, self.returncode, self.output = list(cmd), returncode, output
        detail = " ".join(output.split())[-500:] or "(no output)"
        super().__init__(f"{Path(str(cmd[0])).name} failed (exit {returncode}): {detail}")


def run_command(cmd: Sequence[str], timeout: float, *, cwd: str | os.PathLike | None = None,
                env: Mapping[str, str] | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """Run ``cmd`` to completion with text stdout/stderr captured; the one-shot twin of ``LocalService``.

    Raises ``TimeoutExpired`` (``subprocess.TimeoutExpired``: "Command '...' timed out after N
    seconds"; the process is killed) past ``timeout`` s, ``OSError`` if it cannot be started, and
    with ``check`` a ``CommandError`` quoting its output when it exits non-zero.
    """
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          cwd=None if cwd is None else str(cwd), env=None if env is None else dict(env),
                          stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise CommandError(cmd, done.returncode, (done.stderr or "") + (done.stdout or ""))
    return done


# -- Long-running services --


class AddressInUse(Exception):
    """A service could not bind a port this process chose for it: new ports may help."""


def _stop_procs(procs: Sequence[subprocess.Popen], timeout: float, kill_wait: float = 5.0,
                leftover_grace: float | None = None) -> list[subprocess.Popen]:
    """SIGTERM the process group of each running process, wait up to ``timeout`` s for them all, then
    SIGKILL the groups still running and return those. ``leftover_grace``: also wait that long for anything
    left in a group whose leader ended (0 = SIGKILL it at once; None = leave groups alone). Never raises."""
    alive = [p for p in procs if p.poll() is None]
    for proc in alive:
        killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in alive:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    killed = [proc for proc in procs if proc.poll() is None]
    for proc in killed:
        killpg(proc.pid, signal.SIGKILL)
        try:
            proc.wait(kill_wait)
        except subprocess.TimeoutExpired:
            pass
    if leftover_grace is None:
        return killed
    grace = time.monotonic() + leftover_grace
    for proc in procs:
        while group_alive(proc.pid) and time.monotonic() < grace:
            time.sleep(0.05)
        if group_alive(proc.pid):
            killpg(proc.pid, signal.SIGKILL)
    return killed


def stop_all(services: Sequence["LocalService"], timeout: float) -> None:
    """Stop several services together: one SIGTERM round, one ``timeout``, then SIGKILL."""
    procs = [s._proc for s in services if s._proc is not None]
    _stop_procs(procs, timeout, leftover_grace=0.0)
    for service in services:
        service.stop(timeout=0)


class LocalService:
    """One process this project starts and owns: command, environment, log file, ports, readiness,
    process group, stop and clean-up. Each concrete service is a small subclass.

    Subclasses provide ``_command()`` and usually ``_ready()``; optional hooks: ``_prepare()``
    (once per start, before any launch: temp dirs, config files), ``_pick_ports()`` +
    ``_auto_ports()`` (retry on new ports when ``_address_in_use()`` says so), ``_fixed_ports()``
    (requested ports: one in use is refused up front, ``refuse_taken_ports``), ``_env()``,
    ``_cwd()``, ``_exit_error(code)`` / ``_timeout_error()`` / ``_ports_error(busy, attempts)``
    (the errors raised, of type ``error``), ``_cleanup()`` (after every stop). ``log_path`` is an
    attribute or property naming the file that gets stdout and stderr.

    ``start()`` runs the command in a new session (its own process group; with ``die_with_parent``
    it gets SIGTERM when this process dies, whichever thread started it), waits until ``_ready()`` with the process still
    alive (a port answering for a process that died is not ours) within
    ``ready_timeout`` s and registers ``stop`` with atexit; on any error it stops what it started.
    ``stop()`` sends SIGTERM to the group, SIGKILL after ``timeout`` s; it is idempotent and never
    raises for a process that is already gone.
    """

    label = "process"  #: how messages name the service
    error: type[Exception] = RuntimeError  #: the error start() raises
    stop_timeout = 10.0
    kill_wait = 5.0
    leftover_grace: float | None = None  #: see _stop_procs
    port_attempts = 5
    poll_interval = 0.1
    die_with_parent = True
    log_mode = "ab"
    log_header = False  #: write "# triton-builder: <command>" into the log before each launch
    log_path: Path | None = None

    def __init__(self, host: str = "127.0.0.1", ready_timeout: float = 30.0):
        self.host = host
        self.ready_timeout = float(ready_timeout)
        self._proc: subprocess.Popen | None = None
        self._log_offset = 0
        self._ready_deadline = 0.0
        self._lock = threading.RLock()
        self._atexit_registered = False
        self.killed_at_stop = False  #: the last stop had to SIGKILL it: hung or stuck, a failure to its owner

    # -- hooks ---------------------------------------------------------------------------------

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _prepare(self) -> None:
        pass

    def _shown_command(self, cmd: list[str]) -> list[str]:
        """The command as the log header shows it (a subclass masks secrets it passes as arguments)."""
        return cmd

    def _auto_ports(self) -> bool:
        return False

    def _pick_ports(self) -> None:
        pass

    def _env(self) -> Mapping[str, str] | None:
        return None

    def _cwd(self) -> str | os.PathLike | None:
        return None

    def _ready(self) -> bool:
        return True

    def _fixed_ports(self) -> Sequence[tuple[str, int]]:
        """``(option, port)`` for each port the caller asked for by number. ``start()`` refuses one that
        another process already listens on, before anything is prepared: started anyway, our process
        would fail to bind while the other one answered every readiness probe in its place."""
        return ()

    def _address_in_use(self, code: int) -> str | None:
        return None

    def _exit_error(self, code: int) -> Exception:
        return self.error(f"{self.label} exited with code {code} while starting; last log lines:\n"
                          f"{self.log_tail()}\nfull log: {self.log_path}")

    def _timeout_error(self) -> Exception:
        return self.error(f"{self.label} was not ready within {self.ready_timeout:g} s; last log lines:\n"
                          f"{self.log_tail()}\nfull log: {self.log_path}")

    def _ports_error(self, busy: AddressInUse, attempts: int) -> Exception:
        return self.error(f"{self.label} could not bind its ports after {attempts} tries: {busy}")

    def _cleanup(self) -> None:
        pass

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self):
        """Start the process and return once it is ready; on error nothing is left running."""
        with self._lock:
            if self.is_running():
                return self
            refuse_taken_ports(self.host, self._fixed_ports())
            try:
                self._prepare()
                attempts = self.port_attempts if self._auto_ports() else 1
                for attempt in range(1, attempts + 1):
                    self._pick_ports()
                    self._launch()
                    try:
                        self._wait_ready()
                        break
                    except AddressInUse as busy:
                        self._terminate(self.stop_timeout)
                        if attempt == attempts:
                            raise self._ports_error(busy, attempts) from None
            except BaseException:
                self.stop()
                raise
            if not self._atexit_registered:
                atexit.register(self.stop)
                self._atexit_registered = True
            return self

    def _launch(self) -> None:
        cmd = [str(c) for c in self._command()]
        self._log_offset = self._log_size()
        env = self._env()
        cwd = self._cwd()
        with open(self.log_path, self.log_mode) as log:
            if self.log_header:
                log.write(("# triton-builder: " + " ".join(self._shown_command(cmd)) + "\n").encode())
                log.flush()
            spawn = lambda preexec: subprocess.Popen(  # noqa: E731
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=None if env is None else dict(env), cwd=None if cwd is None else str(cwd),
                start_new_session=True, preexec_fn=preexec)
            self._proc = from_lasting_thread(lambda: spawn(die_with_parent())) if self.die_with_parent \
                else spawn(None)

    def _wait_ready(self) -> None:
        """Poll ``_ready()`` until it is true; ``AddressInUse`` / ``_exit_error`` if the process ends,
        ``_timeout_error`` after ``ready_timeout`` s (the deadline is kept in ``_ready_deadline``)."""
        self._ready_deadline = time.monotonic() + self.ready_timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                busy = self._address_in_use(code)
                if busy:
                    raise AddressInUse(busy)
                raise self._exit_error(code)
            if self._ready():
                if self._proc.poll() is None:
                    return
                continue  # ended while probed: what answered was another process; report the exit
            if time.monotonic() > self._ready_deadline:
                raise self._timeout_error()
            time.sleep(self.poll_interval)

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM to the process group, SIGKILL after ``timeout`` s (default ``stop_timeout``), then
        ``_cleanup()``. Idempotent; returns the exit code (None if never started)."""
        with self._lock:
            code = self._terminate(self.stop_timeout if timeout is None else timeout)
            if self._atexit_registered:
                atexit.unregister(self.stop)
                self._atexit_registered = False
            self._cleanup()
            return code

    def _terminate(self, timeout: float) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        self.killed_at_stop = proc in _stop_procs([proc], timeout, self.kill_wait, self.leftover_grace)
        return proc.poll()

    # -- state and log -------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The process id (also its process group id), or None before ``start()``."""
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has ended, else None."""
        return self._proc.poll() if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _log_size(self) -> int:
        try:
            return Path(self.log_path).stat().st_size if self.log_path else 0
        except OSError:
            return 0

    def read_log(self, since: int | None = None) -> str:
        """The log text from byte ``since`` (default: the start of the current run)."""
        try:
            if not self.log_path:
                return ""
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset if since is None else since)
                return f.read().decode("utf-8", errors="replace")
        except (OSError, RuntimeError):
            return ""

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the log."""
        return "\n".join(self.read_log().splitlines()[-lines:])
