"""Triton's own C++ backends for the embedded server (onnxruntime, openvino, pytorch), built here from their r24.10
sources against the runtime each NGC 24.10 image ships where a wheel of it exists (``triton-builder
install-backends``; ``make setup`` runs it; the recipes: builder/serving/native_recipes.py).

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
side-by-side benchmark, ``benchmarks/served_side_by_side.py native``, uses it). ``gpu`` serves onnxruntime folders
through the GPU build of the onnxruntime backend (``install-backends --backend onnxruntime-gpu``; its own cache
folder, builder/serving/native_gpu.py) where it is built: never the default, so a CPU host does not load it.

Each row of the report lists the library's NEEDED entries (its ELF dynamic section: what the loader must find).

Usage::

    report = install_backends(progress=print)     # InstallReport: one row per backend, built / cached / failed
    install_backends(["onnxruntime-gpu"])         # the GPU build, only when named
    built_backend("onnxruntime")                  # Path of the cached backend folder, or None
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from builder.core.errors import UserInputError
from builder.core.processes import CommandError, TimeoutExpired, run_command
from builder.core.side_env import cache_root, install_atomically
from builder.serving.install import find_tritonserver
from builder.serving.native_gpu import ONNXRUNTIME_GPU
from builder.serving.native_recipes import (CPU_RECIPES, SOURCES_ENV, BackendBuildError, Recipe, download,
                                            needed_libraries)

__all__ = ["RELEASE", "SOURCES_ENV", "MODE_ENV", "RECIPES", "BackendRow", "InstallReport", "install_backends",
           "built_backend", "served_kinds", "backend_home", "backend_files"]

#: every backend install-backends builds, by name
RECIPES: dict[str, Recipe] = {**CPU_RECIPES, "onnxruntime-gpu": ONNXRUNTIME_GPU}

RELEASE = "r24.10"
MODE_ENV = "TRITON_BUILDER_BACKENDS"
ARCHIVE_URL = "https://github.com/triton-inference-server/{repo}/archive/refs/heads/" + RELEASE + ".tar.gz"
CONFIGURE_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 1800
Progress = Callable[[str], object]


@dataclass
class BackendRow:
    backend: str
    status: str  #: "built", "cached" or "failed"
    runtime: str
    seconds: float = 0.0
    home: str = ""
    reason: str = ""
    needed: list[str] = field(default_factory=list)  #: the library's DT_NEEDED entries (built and cached rows)

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
        out = []
        for row in self.rows:
            out.append(row.line())
            if row.needed:
                out.append(f"{'':<13}NEEDED {', '.join(row.needed)}")
        return out + [f"total {self.seconds:.0f} s"]


def _server_tag() -> str:
    """The hash of the server library the backends link (libtritonserver-<hash>.so of nvidia-pytriton)."""
    return _server_library().name.split("-", 1)[1].split(".")[0]


@functools.cache  # one wheel per process: every server start asks, for each backend
def _server_library() -> Path:
    install = find_tritonserver()
    found = sorted(install.libs_dir.glob("libtritonserver-*.so"))
    if not found:
        raise BackendBuildError(f"no libtritonserver-*.so in {install.libs_dir}: reinstall nvidia-pytriton==0.7.0")
    return found[0]


def backend_home(recipe: Recipe) -> Path:
    device = f"cuda{recipe.cuda}" if recipe.cuda else "cpu"
    return (cache_root() / "backends"
            / f"{recipe.backend}-{RELEASE}-{recipe.runtime}{recipe.runtime_version()}-{device}-{_server_tag()}")


#: {Triton backend: its GPU build's recipe}, served under $TRITON_BUILDER_BACKENDS=gpu
GPU_BUILDS = {"onnxruntime": "onnxruntime-gpu"}


def _mode() -> str:
    return os.environ.get(MODE_ENV, "").strip().lower()


def _cached_home(recipe: Recipe) -> Path | None:
    try:
        home = backend_home(recipe)
    except Exception:  # noqa: BLE001 - no server to key it by: nothing is built for it either
        return None
    return home if _is_built(home, recipe) else None


def _serving(name: str) -> tuple[Recipe, Path | None] | None:
    """The recipe whose build serves backend ``name`` (its GPU build under ``gpu`` where built) and its folder."""
    recipe = RECIPES.get(name)
    if recipe is None or _mode() == "standin":
        return None
    if _mode() == "gpu" and name in GPU_BUILDS:
        gpu = RECIPES[GPU_BUILDS[name]]
        home = _cached_home(gpu)
        if home is not None:
            return gpu, home
    return recipe, _cached_home(recipe)


def built_backend(name: str) -> Path | None:
    """The cached folder of backend ``name`` (library and runtime beside it; a recipe's name such as
    ``onnxruntime-gpu`` gives its own build), or None when it is not built, or when
    ``$TRITON_BUILDER_BACKENDS=standin``. Under ``gpu`` the onnxruntime backend is its GPU build where built."""
    serving = _serving(name)
    return serving[1] if serving else None


def _is_built(home: Path, recipe: Recipe) -> bool:
    return (home / "ready").is_file() and (home / recipe.library).is_file()


def backend_files(name: str) -> list[Path] | None:
    """What goes into backend ``name``'s folder when a server starts: the built library and its runtime from the
    cache, and what is linked from this environment (pytorch: its libtorch); None when it is not built."""
    home = built_backend(name)
    if home is None:
        return None
    return [p for p in sorted(home.iterdir()) if p.name.startswith("lib")] + RECIPES[name].linked_at_start()


def served_kinds(backends: tuple[str, ...], native: list[str]) -> dict[str, str]:
    """{backend: how the embedded server runs it}: Triton's C++ backend (``native``: those it found built, with
    their runtime) or the Python stand-in."""
    out = {}
    for name in backends:
        recipe = RECIPES.get(name)
        if name in native:
            recipe = (_serving(name) or (recipe,))[0]  # under gpu: the GPU build where it is built
            out[name] = f"Triton's C++ backend ({RELEASE}, {recipe.runtime_label})" + \
                (f"; note: {recipe.caveat}" if recipe.caveat else "")
        elif recipe is not None:
            verb = "triton-builder install-backends" + ("" if recipe.default else f" --backend {name}")
            out[name] = f"Python stand-in (not built here: `{verb}` builds Triton's own)"
        else:
            out[name] = "Python stand-in (Triton's own is not built by triton-builder yet)"
    return out


def _check_mode() -> None:
    mode = _mode()
    if mode not in ("", "native", "gpu", "standin"):
        raise UserInputError(f"${MODE_ENV}={mode!r}: use native (Triton's C++ backends where built; the default), "
                             "gpu (native, onnxruntime through its GPU build where built) or standin (the Python "
                             "stand-ins)")


def install_backends(names: list[str] | None = None, *, progress: Progress = lambda m: None,
                     force: bool = False) -> InstallReport:
    """Build each backend of ``names`` (default: the recipes marked default) into the cache unless it is there (``force``:
    build again). A backend that fails is a row with a one-line reason; the others still build."""
    _check_mode()
    wanted = [n for n, r in RECIPES.items() if r.default] if not names else list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in RECIPES]
    if unknown:
        raise UserInputError(f"backend {unknown[0]!r} is not one triton-builder builds; supported: "
                             f"{', '.join(RECIPES)} (add one with a Recipe in builder/serving/native_recipes.py)")
    report, start = InstallReport(), time.monotonic()
    for name in wanted:
        recipe = RECIPES[name]
        began = time.monotonic()
        try:
            home = backend_home(recipe)
            if _is_built(home, recipe) and not force:
                report.rows.append(BackendRow(name, "cached", recipe.runtime_label, home=str(home),
                                              needed=_needed(home / recipe.library)))
                continue
            progress(f"building Triton's {name} backend ({RELEASE}) against {recipe.runtime_label} ...")
            if recipe.caveat:
                progress(f"  note: {recipe.caveat}")

            def fill(staging: Path) -> None:
                _build(recipe, staging, progress)
                _write_record(staging, recipe, time.monotonic() - began)

            install_atomically(home, fill, f"{RELEASE} {recipe.runtime_label}")
            report.rows.append(BackendRow(name, "built", recipe.runtime_label, time.monotonic() - began, str(home),
                                          needed=_needed(home / recipe.library)))
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


def _needed(library: Path) -> list[str]:
    try:
        return needed_libraries(library)
    except (OSError, ValueError):  # not an ELF library: listed as nothing, the server's load says the rest
        return []


def _write_record(home: Path, recipe: Recipe, seconds: float) -> None:
    record = {"backend": recipe.backend, "release": RELEASE, "runtime": recipe.runtime,
              "runtime_version": recipe.runtime_version(), "cuda": recipe.cuda or None,
              "server_library": _server_library().name, "needed": _needed(home / recipe.library),
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
        plan = recipe.prepare(recipe, sources, work, progress)
        build = work / "build"
        run_command(["cmake", "-S", sources[recipe.repository], "-B", build, "-G", "Ninja",
                     "-DCMAKE_BUILD_TYPE=Release", f"-DTRITON_ENABLE_GPU={'ON' if recipe.cuda else 'OFF'}",
                     *plan.cmake_options,
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
        for item in plan.runtime_files:
            if item.is_symlink():
                (staging / item.name).symlink_to(os.readlink(item))
            else:
                shutil.copy2(item, staging / item.name)
        staging.chmod(0o755)
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
    download(ARCHIVE_URL.format(repo=repo), archive, f"the {repo} sources ({RELEASE})")
    _unpack(archive, target)
    (target / f"{repo}-{RELEASE}").rename(target / repo)
    return target / repo


def _unpack(archive: Path, target: Path) -> None:
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")  # no links or paths out of the folder


