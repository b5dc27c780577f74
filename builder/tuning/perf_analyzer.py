"""Triton's own load generator, perf_analyzer: where it is, and installing it on first use.

The binary comes from the ``tritonclient==2.51.0`` manylinux1 wheel (2.51 = the embedded server's
release; 2.52-2.60 need glibc 2.38, 2.61+ ship no binary): only the one file
``tritonclient-2.51.0.data/data/bin/perf_analyzer`` is taken out of it. The wheel is never installed
(it would downgrade protobuf/grpcio). The binary needs ``libb64.so.0d`` and ``libcudart.so.12``, which
the nvidia-pytriton wheel already bundles under hashed names in ``site-packages/nvidia_pytriton.libs``:
a ``lib-<tag>/`` folder beside the binary (one per nvidia-pytriton install) links them under the
names it asks for, and goes first on its ``LD_LIBRARY_PATH``.

Layout: ``~/.cache/triton-builder/perf_analyzer/2.51.0/`` (or under $TRITON_BUILDER_CACHE) holding
``bin/perf_analyzer``, ``lib-<tag>/`` and ``ready`` (written last, after ``perf_analyzer --version``
answered). ``$TRITON_BUILDER_PERF_ANALYZER`` names another binary instead (nothing is installed then).
``make setup`` installs it (scripts/install-perf-analyzer.sh).

Usage::

    found = find_perf_analyzer()                # PerfAnalyzer or None; never downloads
    tool = install_perf_analyzer(progress=say)  # found, or downloaded now; PerfAnalyzerMissing if it cannot
    run_command(tool.command(["-m", "digits_cnn", ...]), 60, env=tool.environment())
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from builder.core.errors import BuilderError
from builder.core.processes import CommandError, TimeoutExpired, run_command
from builder.core.side_env import WheelDownloadError, cache_root, download_wheel, install_atomically

VERSION = "2.51.0"
BINARY_ENV = "TRITON_BUILDER_PERF_ANALYZER"
WHEEL_MEMBER = f"tritonclient-{VERSION}.data/data/bin/perf_analyzer"
#: the name the binary asks for -> the file in nvidia_pytriton.libs that provides it
LIBRARIES = {"libb64.so.0d": "libb64-*.so.0d", "libcudart.so.12": "libcudart-*.so.12*"}
INSTALL_TIMEOUT_S = 300


class PerfAnalyzerMissing(BuilderError):
    """perf_analyzer is not installed and could not be installed; the message says how to do it by hand."""

    exit_code = 2


@dataclass(frozen=True)
class PerfAnalyzer:
    binary: Path
    lib_dir: Path | None  #: holds libb64.so.0d and libcudart.so.12 (None: the system provides them)
    version: str = VERSION

    def command(self, args: list[str]) -> list[str]:
        return [str(self.binary), *[str(a) for a in args]]

    def environment(self) -> dict[str, str]:
        """This environment with ``lib_dir`` first on LD_LIBRARY_PATH."""
        env = dict(os.environ)
        if self.lib_dir is not None:
            env["LD_LIBRARY_PATH"] = os.pathsep.join([str(self.lib_dir)] + (
                [env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
        return env

    def describe(self) -> str:
        return f"perf_analyzer {self.version} ({self.binary})"


def install_dir() -> Path:
    return cache_root() / "perf_analyzer" / VERSION


def manual_steps() -> str:
    """How to install it by hand (what install_perf_analyzer does)."""
    home = install_dir()
    return (f"on a machine with PyPI access: `pip download --no-deps --only-binary=:all: --platform manylinux1_x86_64 "
            f"--python-version 3.11 tritonclient=={VERSION}`, then `unzip -j tritonclient-{VERSION}-*.whl "
            f"{WHEEL_MEMBER} -d {home}/bin` and `touch {home}/ready` (libb64.so.0d and libcudart.so.12 are linked "
            f"from nvidia-pytriton's bundled libraries on first use; without it, `apt-get install libb64-0d` and the "
            f"CUDA runtime), or set ${BINARY_ENV} to a perf_analyzer binary; scripts/install-perf-analyzer.sh "
            "does all of this")


def _bundled_libs() -> Path | None:
    """``site-packages/nvidia_pytriton.libs`` of the installed nvidia-pytriton wheel, if any."""
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    libs = Path(list(spec.submodule_search_locations)[0]).parent / "nvidia_pytriton.libs"
    return libs if libs.is_dir() else None


def lib_dir_for(home: Path) -> Path:
    """``home/lib-<tag>``: one folder of links per nvidia-pytriton install (each virtualenv links its
    own copy; a removed virtualenv cannot leave another's links dangling)."""
    bundled = _bundled_libs()
    tag = hashlib.sha1(str(bundled).encode()).hexdigest()[:10] if bundled is not None else "system"
    return home / f"lib-{tag}"


def link_libraries(lib_dir: Path) -> list[str]:
    """Link the libraries the binary needs into ``lib_dir``; the names that could not be provided."""
    lib_dir.mkdir(parents=True, exist_ok=True)
    bundled = _bundled_libs()
    missing = []
    for name, pattern in LIBRARIES.items():
        target = lib_dir / name
        found = sorted(glob.glob(str(bundled / pattern))) if bundled is not None else []
        if not found:
            if not target.exists():
                missing.append(name)
            continue
        if target.is_symlink() or target.exists():
            if target.resolve() == Path(found[0]).resolve():
                continue
            target.unlink()
        target.symlink_to(found[0])
    return missing


def find_perf_analyzer() -> PerfAnalyzer | None:
    """The installed binary (or $TRITON_BUILDER_PERF_ANALYZER's), None if there is none. Never downloads."""
    given = os.environ.get(BINARY_ENV)
    home = install_dir()
    if given:
        path = Path(given)
        if not (path.is_file() and os.access(path, os.X_OK)):
            return None
        lib_dir = lib_dir_for(home)
        return PerfAnalyzer(path, lib_dir if not link_libraries(lib_dir) else None)
    binary = home / "bin" / "perf_analyzer"
    if (home / "ready").is_file() and binary.is_file() and os.access(binary, os.X_OK):
        lib_dir = lib_dir_for(home)
        link_libraries(lib_dir)  # this environment's nvidia-pytriton (created on first use from it)
        return PerfAnalyzer(binary, lib_dir)
    return None


def install_perf_analyzer(progress: Callable[[str], object] = lambda m: None) -> PerfAnalyzer:
    """The installed perf_analyzer, downloading it first if needed (the wheel from PyPI, once).

    Raises ``PerfAnalyzerMissing`` naming what failed and the manual steps.
    """
    found = find_perf_analyzer()
    if found is not None:
        return found
    given = os.environ.get(BINARY_ENV)
    if given:
        raise PerfAnalyzerMissing(f"${BINARY_ENV} names {given}, which is not an executable file: point it at "
                                  f"a perf_analyzer binary, or unset it to use the one triton-builder installs")

    home = install_dir()
    progress(f"installing perf_analyzer {VERSION} into {home} (once; only the binary from the tritonclient "
             f"{VERSION} wheel) ...")

    def fill(staging: Path) -> None:
        staging.chmod(0o755)
        download = staging / "download"
        try:
            found = download_wheel(f"tritonclient=={VERSION}", download, "manylinux1_x86_64", INSTALL_TIMEOUT_S)
        except WheelDownloadError as err:
            raise PerfAnalyzerMissing(str(err)) from None
        (staging / "bin").mkdir()
        binary = staging / "bin" / "perf_analyzer"
        with zipfile.ZipFile(found) as wheel, wheel.open(WHEEL_MEMBER) as src, open(binary, "wb") as dst:
            shutil.copyfileobj(src, dst)
        binary.chmod(0o755)
        shutil.rmtree(download)
        lib_dir = lib_dir_for(staging)
        missing = link_libraries(lib_dir)
        if missing:
            raise PerfAnalyzerMissing(f"{', '.join(missing)} not found in nvidia_pytriton.libs (is nvidia-pytriton "
                                      "installed?); `apt-get install libb64-0d` provides libb64.so.0d")
        tool = PerfAnalyzer(binary, lib_dir)
        answer = run_command(tool.command(["--version"]), 60, env=tool.environment())
        if answer.returncode != 0 or "Perf Analyzer Version" not in answer.stdout + answer.stderr:
            raise PerfAnalyzerMissing(f"the extracted binary does not run: {(answer.stderr or answer.stdout)[-300:]}")

    try:
        install_atomically(home, fill, VERSION)
    except (CommandError, TimeoutExpired, OSError, KeyError, zipfile.BadZipFile, PerfAnalyzerMissing) as err:
        reason = " ".join(str(err).split())[-400:]
        raise PerfAnalyzerMissing(f"could not install perf_analyzer {VERSION} into {home}: {reason}. To install it "
                                  f"by hand: {manual_steps()}") from None
    found = find_perf_analyzer()
    if found is None:
        raise PerfAnalyzerMissing(f"perf_analyzer was installed into {home} but cannot be found there; "
                                  f"remove {home} and try again, or install it by hand: {manual_steps()}")
    return found
