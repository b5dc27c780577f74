"""A local S3-compatible endpoint (moto's server) on 127.0.0.1: the stand-in for S3/MinIO in tests,
benchmarks and local trials. No MinIO is installable on the build machines (registries only), and
``moto[server]`` from PyPI speaks the same S3 API on loopback.

Usage::

    with MotoS3Server() as s3:                     # a free port on 127.0.0.1; returns once it answers
        s3.create_bucket("models")                 # credentials: the AWS_* variables of the caller
        url = s3.repository_url("models", "prod")  # "s3://127.0.0.1:<port>/models/prod"
    # stopped here (SIGTERM to its process group, SIGKILL after 5 s; also at interpreter exit); its
    # temp folder goes too (pass log_path= to keep the log)

It holds objects in memory only, and gets SIGTERM if the thread that started it dies. It accepts any credentials, but boto3 and Triton still need some
in their environment: the caller sets ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (this module
never invents any).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from builder.core.errors import ServerError, UserInputError
from builder.core.processes import LocalService, free_port, http_get

__all__ = ["MotoS3Server"]

INSTALL_HINT = "pip install 'moto[server]' (in triton-builder's dev extra: pip install -e '.[dev]')"


class MotoS3Server(LocalService):
    """moto's S3 server as a child process in its own session; a context manager, or start/stop."""

    label = "the moto S3 server"
    error = ServerError
    stop_timeout = 5.0

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, log_path: Path | str | None = None,
                 ready_timeout: float = 30.0):
        if ready_timeout <= 0:
            raise UserInputError(f"ready_timeout must be positive, got {ready_timeout}")
        super().__init__(host, ready_timeout)
        self._requested_port = port
        self._port: int | None = None
        self._workdir: Path | None = None
        self.log_path: Path | None = Path(log_path).resolve() if log_path else None

    @property
    def port(self) -> int:
        if self._port is None:
            raise ServerError("the moto S3 server was not started; call start() first")
        return self._port

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>`` (for boto3's ``endpoint_url``)."""
        return f"http://{self.host}:{self.port}"

    def repository_url(self, bucket: str, prefix: str) -> str:
        """The ``s3://HOST:PORT/BUCKET/PREFIX`` URL triton-builder and Triton take."""
        return f"s3://{self.host}:{self.port}/{bucket}/{prefix.strip('/')}"

    def _prepare(self) -> None:
        try:
            import moto.server  # noqa: F401
        except ImportError:
            raise ServerError(f"the local S3 endpoint needs moto's server: {INSTALL_HINT}") from None
        self._workdir = Path(tempfile.mkdtemp(prefix="triton-builder-moto-"))
        if self.log_path is None:
            self.log_path = self._workdir / "moto.log"
        self._port = self._requested_port or free_port(self.host)

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self._port)]

    def _cwd(self) -> Path | None:
        return self._workdir

    def _env(self) -> dict[str, str]:
        return dict(os.environ, PYTHONUNBUFFERED="1")

    def _ready(self) -> bool:
        status, _ = http_get(f"{self.endpoint_url}/moto-api/", timeout=1)
        return status is not None and status < 500

    def _exit_error(self, code: int) -> Exception:
        return ServerError(f"the moto S3 server exited with code {code} while starting: {self._log_tail()}")

    def _timeout_error(self) -> Exception:
        return ServerError(f"the moto S3 server did not answer on {self.endpoint_url} within "
                           f"{self.ready_timeout:g} s: {self._log_tail()}")

    def _log_tail(self, lines: int = 10) -> str:
        return " | ".join(self.read_log(0).strip().splitlines()[-lines:]) or "(no output)"

    def client(self):
        """A boto3 S3 client for this endpoint (credentials from the caller's environment)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url,
                            region_name=os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def _cleanup(self) -> None:
        if self._workdir is not None:  # its temp folder (and the log, unless log_path put it elsewhere)
            shutil.rmtree(self._workdir, ignore_errors=True)
