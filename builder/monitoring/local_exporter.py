"""``LocalExporter``: the batch-size exporter (``builder._assets.monitoring.exporter``) serving
``/metrics`` on 127.0.0.1 for one Triton HTTP endpoint, as a subprocess or in this process.

Usage::

    from builder.monitoring.local_exporter import LocalExporter   # also in builder.monitoring.prometheus

    with LocalExporter("127.0.0.1:8000") as exporter:    # a free port; returns once it listens
        print(exporter.address, exporter.metrics_url)    # "127.0.0.1:<port>" for a scrape config
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path

from builder.core import assets
from builder.core.errors import ServerError
from builder.core.processes import LocalService, free_port, port_open, refuse_taken_ports
from builder.serving import control_key

__all__ = ["LocalExporter"]


class LocalExporter(LocalService):
    """``monitoring/exporter.py`` serving ``/metrics`` on 127.0.0.1, for one Triton HTTP endpoint.

    ``in_process=False`` (default) runs ``python -m builder._assets.monitoring.exporter --triton-url ...``
    as a subprocess (what a deployment runs); ``in_process=True`` serves from a daemon thread of
    this process. ``port=None`` picks a free port. ``address`` is ``host:port`` for a scrape config.
    The control key of the Triton it reads (the repository index is restricted: builder/serving/control_key.py)
    goes to it in its environment, or in-process as an argument.
    """

    label = "the exporter"
    error = ServerError
    port_option = "port"  # how a refused requested port is named (a CLI sets its flag)
    stop_timeout = 10.0
    poll_interval = 0.05

    def __init__(self, triton_url: str, port: int | None = None, host: str = "127.0.0.1",
                 in_process: bool = False, timeout: float = 3.0, ready_timeout: float = 20.0):
        super().__init__(host, ready_timeout)
        self.triton_url = triton_url
        self.in_process = in_process
        self.timeout = float(timeout)
        self._requested_port = port
        self._port: int | None = None
        self._httpd = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise ServerError("the exporter was not started; call start() first")
        return self._port

    @property
    def address(self) -> str:
        return f"{'127.0.0.1' if self.host in ('0.0.0.0', '') else self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.address}/metrics"

    def is_running(self) -> bool:
        if self.in_process:
            return self._httpd is not None
        return super().is_running()

    def _module(self):
        return importlib.import_module(assets.EXPORTER_MODULE)

    def start(self) -> "LocalExporter":
        if not self.in_process:
            return super().start()
        with self._lock:
            if self.is_running():
                return self
            refuse_taken_ports(self.host, self._fixed_ports())
            exporter = self._module()
            args = exporter.build_arg_parser().parse_args(
                ["--triton-url", self.triton_url, "--port", str(self._requested_port or 0),
                 "--address", self.host, "--timeout", str(self.timeout)])
            try:
                _, self._httpd, _ = exporter.serve(args, control_key=self._control_key())
            except OSError as err:
                raise ServerError(f"the exporter could not bind {self.host}:{self._requested_port}: {err}") from None
            self._port = self._httpd.server_address[1]
            return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop the server (SIGTERM to the subprocess, SIGKILL after 10 s). Idempotent."""
        with self._lock:
            if self._httpd is not None:
                self._httpd.shutdown()
                self._httpd.server_close()
                self._httpd = None
            super().stop(timeout)

    # -- LocalService hooks ------------------------------------------------------------------

    def _auto_ports(self) -> bool:
        return self._requested_port is None

    def _fixed_ports(self) -> list[tuple[str, int | None]]:
        return [(self.port_option, self._requested_port)]

    def _pick_ports(self) -> None:
        self._port = self._requested_port or free_port(self.host)
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix="triton-builder-exporter-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)

    def _command(self) -> list[str]:
        return [sys.executable, "-m", assets.EXPORTER_MODULE, "--triton-url", self.triton_url,
                "--port", str(self._port), "--address", self.host, "--timeout", str(self.timeout)]

    def _cwd(self) -> Path:
        # `python -m` puts it first on sys.path, so not a folder that may hold another `builder/`
        return assets.monitoring_dir()

    def _control_key(self) -> str | None:
        return control_key.key_for(self.triton_url.split("://")[-1].rstrip("/"))

    def _env(self) -> dict[str, str]:
        key = self._control_key()
        return dict(os.environ, PYTHONUNBUFFERED="1", **({"TRITON_BUILDER_CONTROL_KEY": key} if key else {}))

    def _ready(self) -> bool:
        return port_open(self.host if self.host not in ("0.0.0.0", "") else "127.0.0.1", self._port)

    def _output(self) -> str:
        return self.read_log()[-4000:]

    def _address_in_use(self, code: int) -> str | None:
        return self._output() if "Address already in use" in self._output() else None

    def _exit_error(self, code: int) -> Exception:
        return ServerError(f"the exporter exited with code {code} while starting:\n{self._output()}")

    def _ports_error(self, busy, attempts: int) -> Exception:
        return self._exit_error(self.returncode)

    def _timeout_error(self) -> Exception:
        return ServerError(f"the exporter did not listen on {self.address} within {self.ready_timeout:g} s")

    def _cleanup(self) -> None:
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None
