"""The shared shape of the Prometheus-family binaries we run locally (prometheus, alertmanager):
one port on 127.0.0.1, a temp work folder holding the rendered config, the data and the log,
readiness on ``/-/ready``. Subclasses render their config in ``_prepare`` (calling
``_make_workdir``) and build ``_command``; everything else lives here.

Usage::

    class LocalThing(ConfiguredService):
        label, config_name = "thing", "thing.yml"

        def _prepare(self):
            self._binary = find_thing()
            self._make_workdir()
            self.config_path.write_text(...)

        def _command(self):
            return [self._binary, f"--config.file={self.config_path}", f"--web.listen-address={self.host}:{self._port}"]
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from builder.core.errors import ServerError
from builder.core.processes import LocalService, free_port, http_get


def find_binary(label: str, env_var: str, names: tuple[str, ...], binary: str | os.PathLike | None,
                install_hint: str) -> str:
    """Path of a service binary: ``binary``, else ``$env_var``, else the first of ``names`` on PATH;
    ``ServerError`` naming what was looked for and how to install it."""
    wanted = binary or os.environ.get(env_var)
    if wanted:
        path = shutil.which(str(wanted))
        if path is None:
            raise ServerError(f"{label} binary {wanted} not found or not executable; {install_hint}")
        return path
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    on_path = " or ".join(f"`{name}`" for name in names)
    raise ServerError(f"{label} is not installed (no {on_path} on PATH); {install_hint}")


class ConfiguredService(LocalService):
    """A LocalService with one HTTP port, a temp work folder (config, data, log) and ``/-/ready``."""

    error = ServerError
    log_header = True
    config_name = "config.yml"  # the rendered config's file name in the work folder
    port_option = "port"  # how a refused requested port is named (a CLI sets its flag, e.g. "--port")

    def __init__(self, host: str, ready_timeout: float, port: int | None, keep_data: bool) -> None:
        super().__init__(host, ready_timeout)
        self.keep_data = keep_data
        self.workdir: Path | None = None
        self._binary: str | None = None
        self._requested_port = port
        self._port: int | None = None

    def _make_workdir(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"triton-builder-{self.label}-"))

    def _config_note(self) -> str:
        """Where the config came from, for start errors."""
        return f"config: {self.config_path}"

    # -- LocalService hooks ------------------------------------------------------------------

    def _auto_ports(self) -> bool:
        return self._requested_port is None

    def _pick_ports(self) -> None:
        self._port = self._requested_port or free_port(self.host)

    def _fixed_ports(self) -> list[tuple[str, int | None]]:
        return [(self.port_option, self._requested_port)]

    def _cwd(self) -> Path:
        return self.workdir

    def _ready(self) -> bool:
        return http_get(self.url + "/-/ready", timeout=1.0)[0] == 200

    def _address_in_use(self, code: int) -> str | None:
        busy = [line for line in self.read_log().splitlines() if "address already in use" in line]
        return busy[0] if busy and self._requested_port is None else None

    def _exit_error(self, code: int) -> Exception:
        return ServerError(f"{self.label} exited with code {code} while starting:\n{self.log_tail()}\n"
                           f"{self._config_note()}")

    def _timeout_error(self) -> Exception:
        return ServerError(f"{self.label} was not ready on {self.url} within {self.ready_timeout:g} s; "
                           f"last log lines:\n{self.log_tail()}")

    def _ports_error(self, busy, attempts: int) -> Exception:
        return ServerError(f"{self.label} could not bind {self.host}:{self._port}: {busy}")

    def _cleanup(self) -> None:
        if self.workdir is not None and not self.keep_data:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- state -------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise ServerError(f"{self.label} was not started; call start() first")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def config_path(self) -> Path:
        if self.workdir is None:
            raise ServerError(f"{self.label} was not started; call start() first")
        return self.workdir / self.config_name

    @property
    def log_path(self) -> Path:
        if self.workdir is None:
            raise ServerError(f"{self.label} was not started; call start() first")
        return self.workdir / f"{self.label}.log"

    def read_log(self, since: int | None = None) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except (OSError, ServerError):
            return ""
