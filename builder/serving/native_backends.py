"""Triton's own C++ backends for the embedded server, built here from their r24.10 sources against the runtime
each NGC 24.10 image ships (``triton-builder install-backends``; ``make setup`` runs it).

The nvidia-pytriton wheel's ``tritonserver`` 2.51 (= NGC 24.10) carries only the python backend. Without more,
standard folders (``onnxruntime_onnx``, ``openvino``, ``pytorch_libtorch``) are served through Python stand-ins
(templates/embedded_standins/model.py). This module builds the real ones once into the cache
(``~/.cache/triton-builder/backends/`` or under ``$TRITON_BUILDER_CACHE``), keyed by the release, the runtime's
version and the server library they link, so a second run costs nothing; ``build_backend_dir``
(builder/serving/install.py) then puts them in the server's backend directory and keeps the stand-in only for a
backend that is not built.

Sources: ``$TRITON_SOURCES_DIR`` laid out as ../shared/third_party (``triton-r24.10/<repo>.tar.gz``,
``onnxruntime-1.19/include/``), else the r24.10 branch archives from GitHub. Tools: cmake, ninja, g++, patchelf
and the rapidjson and googletest sources (Debian packages; scripts/install-system-deps.sh installs them). The
runtime library comes from its PyPI wheel (``pip download``, never installed into this environment).

``$TRITON_BUILDER_BACKENDS=standin`` serves through the stand-ins even where the real backends are built (the
side-by-side benchmark, benchmarks/native_backends.py, uses it).

Usage::

    report = install_backends(progress=print)     # InstallReport: one row per backend, built / cached / failed
    built_backend("onnxruntime")                  # Path of the cached backend folder, or None
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from builder.errors import UserInputError
from builder.processes import CommandError, TimeoutExpired, run_command
from builder.serving.install import find_tritonserver
from builder.side_env import cache_root, install_atomically

__all__ = ["RELEASE", "SOURCES_ENV", "MODE_ENV", "RECIPES", "BackendRow", "InstallReport", "install_backends",
           "built_backend", "served_kinds", "backend_home"]

RELEASE = "r24.10"
SOURCES_ENV = "TRITON_SOURCES_DIR"
MODE_ENV = "TRITON_BUILDER_BACKENDS"
ARCHIVE_URL = "https://github.com/triton-inference-server/{repo}/archive/refs/heads/" + RELEASE + ".tar.gz"
ORT_HEADER_URL = ("https://raw.githubusercontent.com/microsoft/onnxruntime/v{version}/include/onnxruntime/core/"
                  "session/onnxruntime_c_api.h")
CONFIGURE_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 1800
DOWNLOAD_TIMEOUT_S = 600
Progress = Callable[[str], object]


class BackendBuildError(Exception):
    """One backend could not be built: the message is one line naming the missing piece or the first error."""


@dataclass(frozen=True)
class Recipe:
    backend: str  #: Triton's backend name (the folder under --backend-directory)
    repository: str  #: the triton-inference-server repository holding its sources
    runtime: str  #: the runtime's PyPI package
    runtime_version: str  #: the version NGC 24.10 ships
    library: str  #: the backend library cmake builds
    target: str  #: its cmake target

    @property
    def runtime_label(self) -> str:
        return f"{self.runtime} {self.runtime_version}"


RECIPES: dict[str, Recipe] = {
    "onnxruntime": Recipe("onnxruntime", "onnxruntime_backend", "onnxruntime", "1.19.2", "libtriton_onnxruntime.so",
                          "triton-onnxruntime-backend"),
}


@dataclass
class BackendRow:
    backend: str
    status: str  #: "built", "cached" or "failed"
    runtime: str
    seconds: float = 0.0
    home: str = ""
    reason: str = ""

    def line(self) -> str:
        if self.status == "failed":
            return f"{self.backend:<12} FAILED  {self.reason} (served through the Python stand-in)"
        how = f"built in {self.seconds:.0f} s" if self.status == "built" else "already built (cached)"
        return f"{self.backend:<12} {self.status:<7} Triton {RELEASE} backend against {self.runtime}, {how}: {self.home}"


@dataclass
class InstallReport:
    rows: list[BackendRow] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.status != "failed" for r in self.rows)

    def lines(self) -> list[str]:
        return [row.line() for row in self.rows] + [f"total {self.seconds:.0f} s"]


def _server_tag() -> str:
    """The hash of the server library the backends link (libtritonserver-<hash>.so of nvidia-pytriton)."""
    return _server_library().name.split("-", 1)[1].split(".")[0]


def _server_library() -> Path:
    install = find_tritonserver()
    found = sorted(install.libs_dir.glob("libtritonserver-*.so"))
    if not found:
        raise BackendBuildError(f"no libtritonserver-*.so in {install.libs_dir}: reinstall nvidia-pytriton==0.7.0")
    return found[0]


def backend_home(recipe: Recipe) -> Path:
    return cache_root() / "backends" / f"{recipe.backend}-{RELEASE}-{recipe.runtime}{recipe.runtime_version}-cpu-{_server_tag()}"


def built_backend(name: str) -> Path | None:
    """The cached folder of backend ``name`` (library and runtime beside it), or None when it is not built, or
    when ``$TRITON_BUILDER_BACKENDS=standin``."""
    recipe = RECIPES.get(name)
    if recipe is None or os.environ.get(MODE_ENV, "").strip().lower() == "standin":
        return None
    try:
        home = backend_home(recipe)
    except Exception:  # noqa: BLE001 - no server to key it by: nothing is built for it either
        return None
    return home if (home / "ready").is_file() and (home / recipe.library).is_file() else None


def served_kinds(backends: tuple[str, ...], native: list[str]) -> dict[str, str]:
    """{backend: how the embedded server runs it}: Triton's C++ backend (``native``: those it found built, with
    their runtime) or the Python stand-in."""
    out = {}
    for name in backends:
        if name in native:
            out[name] = f"Triton's C++ backend ({RELEASE}, {RECIPES[name].runtime_label})"
        elif name in RECIPES:
            out[name] = "Python stand-in (not built here: `triton-builder install-backends` builds Triton's own)"
        else:
            out[name] = "Python stand-in (Triton's own is not built by triton-builder yet)"
    return out


def _check_mode() -> None:
    mode = os.environ.get(MODE_ENV, "").strip().lower()
    if mode not in ("", "native", "standin"):
        raise UserInputError(f"${MODE_ENV}={mode!r}: use native (Triton's C++ backends where built; the default) or "
                             "standin (the Python stand-ins)")


def install_backends(names: list[str] | None = None, *, progress: Progress = lambda m: None,
                     force: bool = False) -> InstallReport:
    """Build each backend of ``names`` (default: all in ``RECIPES``) into the cache unless it is there (``force``:
    build again). A backend that fails is a row with a one-line reason; the others still build."""
    _check_mode()
    wanted = list(RECIPES) if not names else list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in RECIPES]
    if unknown:
        raise UserInputError(f"backend {unknown[0]!r} is not one triton-builder builds; supported: "
                             f"{', '.join(RECIPES)} (add one with a Recipe in builder/serving/native_backends.py)")
    report, start = InstallReport(), time.monotonic()
    for name in wanted:
        recipe = RECIPES[name]
        began = time.monotonic()
        try:
            home = backend_home(recipe)
            if (home / "ready").is_file() and not force:
                report.rows.append(BackendRow(name, "cached", recipe.runtime_label, home=str(home)))
                continue
            progress(f"building Triton's {name} backend ({RELEASE}) against {recipe.runtime_label} ...")

            def fill(staging: Path) -> None:
                _build(recipe, staging, progress)
                _write_record(staging, recipe, time.monotonic() - began)

            install_atomically(home, fill, f"{RELEASE} {recipe.runtime_label}")
            report.rows.append(BackendRow(name, "built", recipe.runtime_label, time.monotonic() - began, str(home)))
        except (BackendBuildError, CommandError, TimeoutExpired, OSError) as err:
            report.rows.append(BackendRow(name, "failed", recipe.runtime_label, time.monotonic() - began,
                                          reason=_one_line(err)))
    report.seconds = time.monotonic() - start
    return report


def _one_line(err: BaseException) -> str:
    if isinstance(err, CommandError):
        first = next((l.strip() for l in err.output.splitlines() if re.search(r"\berror\b", l, re.I)), "")
        return f"{Path(err.cmd[0]).name} failed (exit {err.returncode}): {first or ' '.join(err.output.split())[-300:]}"
    return " ".join(str(err).split())


def _write_record(home: Path, recipe: Recipe, seconds: float) -> None:
    record = {"backend": recipe.backend, "release": RELEASE, "runtime": recipe.runtime,
              "runtime_version": recipe.runtime_version, "server_library": _server_library().name,
              "seconds": round(seconds, 1), "built_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    (home / "build.json").write_text(json.dumps(record, indent=2) + "\n")


# -- the build ------------------------------------------------------------------------------------------------

def _missing_tools() -> list[str]:
    missing = [f"{tool} (apt-get install {package})" for tool, package in
               (("cmake", "cmake"), ("ninja", "ninja-build"), ("g++", "g++"), ("patchelf", "patchelf"))
               if shutil.which(tool) is None]
    if not Path("/usr/include/rapidjson/document.h").is_file():
        missing.append("the rapidjson headers /usr/include/rapidjson (apt-get install rapidjson-dev)")
    if not (Path("/usr/src/googletest") / "CMakeLists.txt").is_file():
        missing.append("the googletest sources /usr/src/googletest (apt-get install googletest)")
    return missing


def _build(recipe: Recipe, staging: Path, progress: Progress) -> None:
    missing = _missing_tools()
    if missing:
        raise BackendBuildError(f"missing {'; '.join(missing)} (scripts/install-system-deps.sh installs them all)")
    work = Path(tempfile.mkdtemp(prefix=f"triton-builder-{recipe.backend}-build-"))
    try:
        sources = {repo: _source(repo, work) for repo in (recipe.repository, "backend", "core", "common")}
        runtime = _runtime_library(recipe, work, progress)
        header = _ort_header(recipe, work)
        build = work / "build"
        run_command(["cmake", "-S", sources[recipe.repository], "-B", build, "-G", "Ninja",
                     "-DCMAKE_BUILD_TYPE=Release", "-DTRITON_ENABLE_GPU=OFF",
                     f"-DTRITON_ONNXRUNTIME_INCLUDE_PATHS={header}", f"-DTRITON_ONNXRUNTIME_LIB_PATHS={runtime.parent}",
                     "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
                     f"-DFETCHCONTENT_SOURCE_DIR_REPO-COMMON={sources['common']}",
                     f"-DFETCHCONTENT_SOURCE_DIR_REPO-CORE={sources['core']}",
                     f"-DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND={sources['backend']}",
                     "-DFETCHCONTENT_SOURCE_DIR_GOOGLETEST=/usr/src/googletest"], CONFIGURE_TIMEOUT_S, check=True)
        progress(f"  compiling {recipe.library} (cmake + ninja, {os.cpu_count() or 1} jobs) ...")
        run_command(["cmake", "--build", build, "-j", str(os.cpu_count() or 1), "--target", recipe.target],
                    BUILD_TIMEOUT_S, check=True)
        library = staging / recipe.library
        shutil.copy2(build / recipe.library, library)
        # the backend links libtritonserver.so; the wheel's server loaded it as libtritonserver-<hash>.so
        run_command(["patchelf", "--replace-needed", "libtritonserver.so", _server_library().name, library],
                    120, check=True)
        run_command(["patchelf", "--set-rpath", "$ORIGIN", library], 120, check=True)
        shutil.copy2(runtime, staging / runtime.name)
        for alias in _aliases(runtime.name):
            (staging / alias).symlink_to(runtime.name)
        staging.chmod(0o755)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _aliases(name: str) -> list[str]:
    """libonnxruntime.so.1.19.2 -> [libonnxruntime.so.1, libonnxruntime.so] (the soname and the link name)."""
    stem, _, version = name.partition(".so.")
    return [f"{stem}.so.{version.split('.')[0]}", f"{stem}.so"] if version else []


def _source(repo: str, work: Path) -> Path:
    """The unpacked r24.10 sources of ``repo``: from $TRITON_SOURCES_DIR, else GitHub."""
    given = os.environ.get(SOURCES_ENV)
    target = work / "src"
    target.mkdir(exist_ok=True)
    if given:
        archive = Path(given) / f"triton-{RELEASE}" / f"{repo}.tar.gz"
        if not archive.is_file():
            raise BackendBuildError(f"${SOURCES_ENV}={given}: no {archive.relative_to(given)} there (lay it out as "
                                    f"../shared/third_party is: triton-{RELEASE}/<repo>.tar.gz)")
        _unpack(archive, target)
        return target / repo
    archive = work / f"{repo}.tar.gz"
    _download(ARCHIVE_URL.format(repo=repo), archive, f"the {repo} sources ({RELEASE})")
    _unpack(archive, target)
    (target / f"{repo}-{RELEASE}").rename(target / repo)
    return target / repo


def _unpack(archive: Path, target: Path) -> None:
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")  # no links or paths out of the folder


def _download(url: str, target: Path, what: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=60) as answer, open(target, "wb") as out:
            shutil.copyfileobj(answer, out)
    except OSError as err:
        raise BackendBuildError(f"could not download {what} from {url} ({err}); without internet, set ${SOURCES_ENV} "
                                f"to a folder laid out as ../shared/third_party") from None


def _ort_header(recipe: Recipe, work: Path) -> Path:
    """The folder holding onnxruntime_c_api.h of the runtime's minor release (the wheels ship no header)."""
    minor = ".".join(recipe.runtime_version.split(".")[:2])
    given = os.environ.get(SOURCES_ENV)
    if given:
        folder = Path(given) / f"onnxruntime-{minor}" / "include"
        if not (folder / "onnxruntime_c_api.h").is_file():
            raise BackendBuildError(f"${SOURCES_ENV}={given}: no onnxruntime-{minor}/include/onnxruntime_c_api.h there")
        return folder
    folder = work / "include"
    folder.mkdir()
    _download(ORT_HEADER_URL.format(version=recipe.runtime_version), folder / "onnxruntime_c_api.h",
              f"the onnxruntime {minor} C API header")
    return folder


def _runtime_library(recipe: Recipe, work: Path, progress: Progress) -> Path:
    """libonnxruntime.so.<version> out of the runtime's wheel (downloaded, never installed), with its aliases."""
    download = work / "wheel"
    progress(f"  fetching the {recipe.runtime_label} wheel for its C library (pip download, not installed) ...")
    try:
        run_command([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                     "--only-binary=:all:", "--platform", "manylinux_2_27_x86_64", "--python-version", "3.11",
                     f"{recipe.runtime}=={recipe.runtime_version}", "-d", download], DOWNLOAD_TIMEOUT_S, check=True)
    except CommandError as err:
        raise BackendBuildError(f"`pip download {recipe.runtime}=={recipe.runtime_version}` failed (is PyPI "
                                f"reachable?): {' '.join(err.output.split())[-200:]}") from None
    wheels = sorted(download.glob("*.whl"))
    if not wheels:
        raise BackendBuildError(f"pip download left no {recipe.runtime} wheel in {download}")
    name = f"libonnxruntime.so.{recipe.runtime_version}"
    libs = work / "runtime"
    libs.mkdir()
    with zipfile.ZipFile(wheels[0]) as wheel:
        member = next((m for m in wheel.namelist() if m.endswith(f"/capi/{name}")), None)
        if member is None:
            raise BackendBuildError(f"{wheels[0].name} holds no onnxruntime/capi/{name}")
        with wheel.open(member) as src, open(libs / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    for alias in _aliases(name):
        (libs / alias).symlink_to(name)
    return libs / name
