"""Which runtimes each NGC Triton release ships: the one table behind ``build --triton-release R``,
``validate --triton-release R``, docker-compose.yml, the k8s manifests and ``triton-builder releases``.

Sources (re-check them when adding a row; one ``TritonRelease(...)`` line per release):

- server version, onnxruntime and OpenVINO per release: TRITON_VERSION_MAP in Triton's ``build.py`` on the
  release branch (https://github.com/triton-inference-server/server/blob/rYY.MM/build.py)
- libtorch (NVIDIA's PyTorch build in the image) and the image's Python:
  ``docs/introduction/compatibility.md`` on the same branch, and the release notes
  (https://docs.nvidia.com/deeplearning/triton-inference-server/release-notes/rel-YY-MM.html)
- whether the python backend's stub reads numpy 2 arrays: python_backend's CMakeLists.txt (pybind11 2.10
  until r24.10, which reads numpy 2's itemsize as 0 - pybind11 issue 5009; 2.12+ from r24.11, PR 384)
- TensorRT: only 24.10's is taken from a source (its release notes); the others are left unknown
- what each onnxruntime loads (IR version, ai.onnx opset) and each OpenVINO reads (IR opsets): measured
  with the real packages from PyPI in side environments (docs/benchmarks.md, "release limits"); the
  runtime gate replays with the same packages

The newest row is the default everywhere (``DEFAULT_RELEASE``: builds, validate's gate in the main job,
docker-compose.yml, k8s); the embedded tritonserver (nvidia-pytriton 0.7.0) is 2.51.0 = 24.10
(``EMBEDDED_RELEASE``), the newest server binary that runs here.

Usage::

    release = triton_release("26.07")
    release.onnxruntime, release.max_ir_version, release.max_opset    # '1.27.0', 13, 26
    print(format_releases())                                          # the table, as `triton-builder releases`
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.core.errors import UserInputError

#: onnxruntime release -> (newest ONNX IR version, newest ai.onnx opset) it loads (measured: see above)
ONNXRUNTIME_LIMITS = {"1.19.2": (10, 21), "1.20.1": (10, 21), "1.24.4": (13, 25), "1.27.0": (13, 26),
                      "1.28.0": (13, 26)}

#: OpenVINO release -> the newest operation set (``opsetN`` of an IR's layers) it reads (measured: see above)
OPENVINO_MAX_OPSET = {"2024.4.0": 14, "2026.1.0": 16, "2026.2.0": 16, "2026.3.0": 16}


@dataclass(frozen=True)
class TritonRelease:
    release: str  # the NGC container tag, YY.MM
    triton: str  # the server version
    onnxruntime: str  # the onnxruntime backend's
    openvino: str  # the openvino backend's
    pytorch: str  # NVIDIA's PyTorch build (the libtorch backend)
    python: str  # the image's Python (what python-backend models run with)
    stub_numpy2: bool  # the python backend's stub reads numpy 2 arrays
    tensorrt: str | None = None  # None: not found in NVIDIA's sources

    @property
    def image(self) -> str:
        return f"nvcr.io/nvidia/tritonserver:{self.release}-py3"

    @property
    def max_ir_version(self) -> int:
        """The newest ONNX IR version the release's onnxruntime backend loads."""
        return ONNXRUNTIME_LIMITS[self.onnxruntime][0]

    @property
    def max_opset(self) -> int:
        """The newest default-domain (ai.onnx) opset the release's onnxruntime backend implements."""
        return ONNXRUNTIME_LIMITS[self.onnxruntime][1]

    @property
    def libtorch(self) -> tuple[int, int]:
        """(major, minor) of the libtorch backend's PyTorch: ``2.5.0a0+e000cf0ad9`` -> (2, 5)."""
        return torch_minor(self.pytorch)


#: NGC release -> the runtimes it ships (see the sources above); add one line per release
RELEASES: dict[str, TritonRelease] = {r.release: r for r in (
    TritonRelease("24.10", "2.51.0", "1.19.2", "2024.4.0", "2.5.0a0+e000cf0ad9", "3.10", False, "10.5.0.18"),
    TritonRelease("24.11", "2.52.0", "1.19.2", "2024.4.0", "2.6.0a0", "3.12", True),
    TritonRelease("26.05", "2.69.0", "1.24.4", "2026.1.0", "2.12.0a0", "3.12", True),
    TritonRelease("26.06", "2.70.0", "1.24.4", "2026.2.0", "2.12.0a0", "3.12", True),
    TritonRelease("26.07", "2.71.0", "1.27.0", "2026.2.0", "2.13.0a0", "3.12", True),
    TritonRelease("26.08", "2.72.0", "1.28.0", "2026.3.0", "2.14.0a0", "3.12", True),
)}

#: the newest release in the table: what builds, docker-compose.yml and k8s target unless told otherwise
def release_order(release: str) -> tuple[int, int]:
    """``26.07`` -> (26, 7): newest last."""
    year, month = release.split(".")
    return int(year), int(month)


DEFAULT_RELEASE = max(RELEASES, key=release_order)
COMPOSE_RELEASE = DEFAULT_RELEASE  # docker-compose.yml's image tag (a unit test keeps the two in step)
#: the release of the embedded tritonserver (nvidia-pytriton 0.7.0's Triton 2.51.0): what `serve` runs here
EMBEDDED_RELEASE = "24.10"

#: the onnxruntime that docker/triton/Dockerfile pip-installs into a release's image for python-backend
#: models (its ARG ONNXRUNTIME_VERSION for that FROM; a test keeps the Dockerfile in step): 24.10's Python
#: 3.10 image got 1.20.1; newer images get the release's own onnxruntime backend version
PYTHON_BACKEND_ONNXRUNTIME = {"24.10": "1.20.1"}


def python_backend_onnxruntime(release: TritonRelease) -> str:
    return PYTHON_BACKEND_ONNXRUNTIME.get(release.release, release.onnxruntime)


def torch_minor(version: str) -> tuple[int, int]:
    """``2.13.0+cpu`` / ``2.5.0a0+e000cf0ad9`` -> (2, 13) / (2, 5)."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def libtorch_failure(saved_by: str, release: TritonRelease) -> str | None:
    """Why a TorchScript file saved by torch ``saved_by`` may not load on ``release``'s libtorch backend
    (a newer torch writes operators and schemas an older libtorch lacks), or None."""
    if torch_minor(saved_by) <= release.libtorch:
        return None
    usable = [r.release for r in RELEASES.values() if r.libtorch >= torch_minor(saved_by)]
    newer = (f"build for --triton-release {usable[0]} or newer (libtorch {RELEASES[usable[0]].pytorch})" if usable
             else "no release in the table ships a libtorch that new")
    return (f"TorchScript saved by torch {saved_by} is newer than Triton {release.release}'s libtorch "
            f"{release.pytorch} (pytorch_libtorch backend), which may not load it: {newer}, or export with "
            f"torch {release.libtorch[0]}.{release.libtorch[1]} in the build environment, or leave the torchscript "
            "variants out (--variants onnx,...)")


def format_releases() -> str:
    """The table as text, newest first, the defaults marked."""
    head = ("release", "triton", "onnxruntime (IR, opset)", "openvino (opset)", "libtorch", "python",
            "stub numpy 2", "tensorrt")
    rows = []
    for key in sorted(RELEASES, key=release_order, reverse=True):
        r = RELEASES[key]
        marks = [m for m, on in (("default", key == DEFAULT_RELEASE), ("embedded", key == EMBEDDED_RELEASE)) if on]
        rows.append((key + (f" ({', '.join(marks)})" if marks else ""), r.triton,
                     f"{r.onnxruntime} ({r.max_ir_version}, {r.max_opset})",
                     f"{r.openvino} (opset{OPENVINO_MAX_OPSET.get(r.openvino, '?')})", r.pytorch, r.python,
                     "yes" if r.stub_numpy2 else "no", r.tensorrt or "unknown"))
    widths = [max(len(str(row[i])) for row in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + (f"\n\nimage: {RELEASES[DEFAULT_RELEASE].image} by default; pick another with "
                               "--triton-release R (build, validate, k8s) or TRITON_RELEASE=R (docker compose)")


@dataclass(frozen=True)
class Runtime:
    onnxruntime: str
    max_ir_version: int
    max_opset: int
    label: str  # e.g. "onnxruntime 1.19.2 (Triton 24.10, onnxruntime backend)"


def onnx_runtime_for(release: TritonRelease, backend: str) -> Runtime:
    """The onnxruntime that runs an ONNX version with ``backend`` (python | onnxruntime) under ``release``."""
    if backend == "python":
        version = python_backend_onnxruntime(release)
        where = "python backend, docker/triton image"
    else:
        version, where = release.onnxruntime, f"{backend} backend"
    ir, opset = ONNXRUNTIME_LIMITS.get(version, (release.max_ir_version, release.max_opset))
    return Runtime(version, ir, opset, f"onnxruntime {version} (Triton {release.release}, {where})")


def triton_release(release: str) -> TritonRelease:
    """The table's row for ``release`` (YY.MM, an NGC tag such as ``24.10`` or ``24.10-py3``)."""
    key = release.split("-")[0].strip()
    if key not in RELEASES:
        raise UserInputError(f"--triton-release {release}: not in triton-builder's runtime table "
                             f"(known: {', '.join(sorted(RELEASES))}); add its row to "
                             "builder/repository/triton_releases.py from NVIDIA's release notes")
    return RELEASES[key]
