"""The GPU build of Triton's onnxruntime backend (``triton-builder install-backends --backend onnxruntime-gpu``).

``TRITON_ENABLE_GPU=ON`` against the ``onnxruntime-gpu`` 1.19.2 wheel (NGC 24.10's onnxruntime; on PyPI it is the
CUDA 12 build: its ``libonnxruntime_providers_cuda.so`` needs ``libcudart.so.12``, checked at build time) and a
CUDA toolkit laid out from PyPI wheels - ``nvidia-cuda-runtime-cu12`` (headers, ``libcudart.so.12``) and
``nvidia-cuda-nvcc-cu12`` (only its ``include/crt`` headers, which the runtime's headers include) - with a
``version.txt``, which is all CMake's FindCUDAToolkit needs where there is no nvcc. There is no nvcc on PyPI for
CUDA 12 (the nvcc-cu12 wheels carry ptxas and libnvvm only), so the one CUDA source of the tree, the backend
repository's gather kernel (``src/kernel.cu``, ``RunGatherKernel``), is replaced at build time by a C++ function
that answers ``cudaErrorNotSupported``: the onnxruntime backend never launches it (its input collector is made with
``kernel_buffer_threshold`` 0), and the collector falls back to plain copies where a backend does.

Its folder holds the library, the runtime (``libonnxruntime.so.1.19.2``, the CUDA and shared provider libraries)
and ``libcudart.so.12``; cuBLAS 12, cuDNN 9, cuFFT 11 and cuRAND 10 come from the GPU host (``LD_LIBRARY_PATH``).
It is cached apart from the CPU build and the embedded server uses it only under ``TRITON_BUILDER_BACKENDS=gpu``
(builder/serving/native_backends.py), so a CPU host never loads it by accident.

Usage (native_backends does this)::

    plan = ONNXRUNTIME_GPU.prepare(ONNXRUNTIME_GPU, sources, work, progress)   # BuildPlan
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from builder.serving.native_recipes import (CUDA_VERSION, BackendBuildError, BuildPlan, Progress, Recipe, _extract,
                                            _pip_download, needed_libraries, onnxruntime_plan)

__all__ = ["ONNXRUNTIME_GPU", "ORT_GPU_PROVIDERS", "prepare_onnxruntime_gpu", "patch_gather_kernel",
           "cuda_toolkit"]

CUDA_PLATFORM = "manylinux2014_x86_64"
#: onnxruntime-gpu's providers beside its core library (onnxruntime dlopens them from its own folder)
ORT_GPU_PROVIDERS = ("libonnxruntime_providers_shared.so", "libonnxruntime_providers_cuda.so")
CUDART = "libcudart.so.12"
KERNEL_STUB = """// triton-builder: the gather kernel replaced (no CUDA 12 nvcc on PyPI; builder/serving/native_gpu.py)
#include "kernel.h"

extern "C" cudaError_t
RunGatherKernel(
    const int8_t**, const size_t*, const size_t*, int8_t*, size_t, cudaStream_t)
{
  return cudaErrorNotSupported;
}
"""


def prepare_onnxruntime_gpu(recipe: Recipe, sources: dict[str, Path], work: Path, progress: Progress) -> BuildPlan:
    plan, libraries = onnxruntime_plan(recipe, work, progress, ORT_GPU_PROVIDERS)
    provider = libraries[-1]  # libonnxruntime_providers_cuda.so
    if CUDART not in needed_libraries(provider):
        raise BackendBuildError(f"{recipe.runtime} {recipe.runtime_version()}: its CUDA provider needs "
                                f"{_cudart_of(provider)}, not {CUDART}: this build is for onnxruntime-gpu's CUDA 12 "
                                "wheels")
    toolkit = cuda_toolkit(work, progress, recipe.cuda)
    patch_gather_kernel(sources["backend"])
    return BuildPlan([*plan.cmake_options, f"-DCUDAToolkit_ROOT={toolkit}"],
                     [*plan.runtime_files, toolkit / "lib64" / CUDART])


def _cudart_of(library: Path) -> str:
    return next((n for n in needed_libraries(library) if n.startswith("libcudart.so")), "no libcudart")


def cuda_toolkit(work: Path, progress: Progress, version: str) -> Path:
    """A CUDA toolkit root as FindCUDAToolkit reads one without nvcc: ``version.txt``, ``include/`` (the runtime's
    headers and nvcc's ``crt/``) and ``lib64/libcudart.so`` (the link name) -> ``libcudart.so.12``."""
    root = work / "cuda"
    (root / "lib64").mkdir(parents=True)
    runtime = _pip_download("nvidia-cuda-runtime-cu12", version, work, CUDA_PLATFORM, progress,
                            "the CUDA runtime and its headers")
    nvcc = _pip_download("nvidia-cuda-nvcc-cu12", version, work, CUDA_PLATFORM, progress, "its crt/ headers")
    _unpack_folder(runtime, "nvidia/cuda_runtime/include/", root / "include")
    _unpack_folder(nvcc, "nvidia/cuda_nvcc/include/crt/", root / "include" / "crt")
    _extract(runtime, [f"/lib/{CUDART}"], root / "lib64")
    (root / "lib64" / "libcudart.so").symlink_to(CUDART)
    if not (root / "include" / "cuda_runtime_api.h").is_file():
        raise BackendBuildError(f"{runtime.name} holds no include/cuda_runtime_api.h")
    (root / "version.txt").write_text(f"CUDA Version {version}\n")
    return root


def _unpack_folder(wheel: Path, prefix: str, target: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.startswith(prefix) and not m.endswith(("/", "__init__.py"))]
        if not members:
            raise BackendBuildError(f"{wheel.name} holds no {prefix}")
        for member in members:
            out = target / member[len(prefix):]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(archive.read(member))


def patch_gather_kernel(backend: Path) -> None:
    """The backend repository's CUDA gather kernel as a C++ function answering ``cudaErrorNotSupported`` (no CUDA
    language, so no nvcc); the r24.10 text is checked, so a changed CMakeLists fails loudly."""
    path = backend / "CMakeLists.txt"
    text = path.read_text()
    start = "  add_library(\n    kernel_library_new\n    src/kernel.cu src/kernel.h\n  )\n"
    end = "  set_target_properties(kernel_library_new PROPERTIES CUDA_RESOLVE_DEVICE_SYMBOLS ON)\n"
    if start not in text or end not in text or text.index(end) < text.index(start):
        raise BackendBuildError(f"{path}: the backend repository's CMakeLists is not the r24.10 one whose gather "
                                "kernel this build replaces")
    stub = ("  add_library(\n    kernel_library_new\n    src/kernel_stub.cc src/kernel.h\n  )\n"
            "  set_target_properties(kernel_library_new PROPERTIES POSITION_INDEPENDENT_CODE ON)\n"
            "  target_compile_features(kernel_library_new PUBLIC cxx_std_${TRITON_MIN_CXX_STANDARD})\n"
            "  target_link_libraries(kernel_library_new PRIVATE CUDA::cudart)\n")
    path.write_text(text[:text.index(start)] + stub + text[text.index(end) + len(end):])
    (backend / "src" / "kernel_stub.cc").write_text(KERNEL_STUB)


#: said when the GPU build is made or served: what it needs from the host
ONNXRUNTIME_GPU_CAVEAT = ("the GPU build needs an NVIDIA driver and CUDA 12's cuBLAS, cuDNN 9, cuFFT 11 and cuRAND "
                          "10 on LD_LIBRARY_PATH where it serves; the embedded server uses it only under "
                          "TRITON_BUILDER_BACKENDS=gpu")


#: the onnxruntime backend built with TRITON_ENABLE_GPU=ON (`install-backends --backend onnxruntime-gpu`)
ONNXRUNTIME_GPU = Recipe("onnxruntime", "onnxruntime_backend", "onnxruntime-gpu", lambda: "1.19.2",
                         "libtriton_onnxruntime.so", "triton-onnxruntime-backend", prepare_onnxruntime_gpu,
                         default=False, caveat=ONNXRUNTIME_GPU_CAVEAT, cuda=CUDA_VERSION)
