"""Which runtimes a Triton release ships: the table behind ``validate --triton-release R``.

Sources (NVIDIA's published release notes and support matrices; re-check them when adding a row):

- Triton release notes, one page per release, e.g.
  https://docs.nvidia.com/deeplearning/triton-inference-server/release-notes/rel-24-10.html
  ("For a complete list of what the container includes, refer to Deep Learning Frameworks Support Matrix")
- Deep Learning Frameworks Support Matrix:
  https://docs.nvidia.com/deeplearning/frameworks/support-matrix/index.html
- the ONNX Runtime / OpenVINO versions a release builds its backends with: TRITON_VERSION_MAP in
  https://github.com/triton-inference-server/server/blob/r24.10/build.py (branch rYY.MM)
- what each onnxruntime release loads (ONNX IR version and default-domain opset):
  https://onnxruntime.ai/docs/reference/compatibility.html

docker-compose.yml pins ``nvcr.io/nvidia/tritonserver:24.10-py3`` (COMPOSE_RELEASE; a unit test
keeps the two in step): builds and the main job gate on that release.

Usage::

    release = triton_release("24.10")
    release.onnxruntime, release.max_ir_version, release.max_opset    # '1.19.2', 10, 21
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.errors import UserInputError

COMPOSE_RELEASE = "24.10"  # docker-compose.yml's x-triton-image tag


@dataclass(frozen=True)
class TritonRelease:
    release: str  # the NGC container tag, YY.MM
    triton: str  # the server version
    onnxruntime: str
    openvino: str
    tensorrt: str
    pytorch: str  # NVIDIA's PyTorch build (libtorch backend)
    max_ir_version: int  # the newest ONNX IR version that onnxruntime release loads
    max_opset: int  # the newest default-domain (ai.onnx) opset it implements


#: NGC release -> the runtimes it ships (see the sources above). Only rows checked against those
#: sources belong here; the embedded tritonserver (nvidia-pytriton 0.7.0) is 2.51.0 = 24.10 too.
RELEASES: dict[str, TritonRelease] = {r.release: r for r in (
    TritonRelease("24.10", "2.51.0", "1.19.2", "2024.4.0", "10.5.0.18", "2.5.0a0+e000cf0ad9", 10, 21),
)}


#: the onnxruntime that docker/triton/Dockerfile pip-installs into the release's image for python-backend
#: models (its ARG ONNXRUNTIME_VERSION; a test keeps the two in step): the embedded/default target's
#: model.py runs THAT onnxruntime, not the release's onnxruntime backend
PYTHON_BACKEND_ONNXRUNTIME = {"24.10": "1.20.1"}

#: OpenVINO release -> the newest operation set (``opsetN`` of an IR's layers) it reads: opset14 came with
#: 2024.0, opset15 with 2024.5 (https://docs.openvino.ai/2024/documentation/openvino-ir-format/operation-sets/
#: available-opsets.html); 24.10's openvino backend is 2024.4 (the table above: re-check with the release notes)
OPENVINO_MAX_OPSET = {"2024.4.0": 14}

#: onnxruntime release -> (newest ONNX IR version, newest ai.onnx opset) it loads
#: (https://onnxruntime.ai/docs/reference/compatibility.html; the replay checks it for real)
ONNXRUNTIME_LIMITS = {"1.19.2": (10, 21), "1.20.1": (10, 21)}


@dataclass(frozen=True)
class Runtime:
    onnxruntime: str
    max_ir_version: int
    max_opset: int
    label: str  # e.g. "onnxruntime 1.19.2 (Triton 24.10, onnxruntime backend)"


def onnx_runtime_for(release: TritonRelease, backend: str) -> Runtime:
    """The onnxruntime that runs an ONNX version with ``backend`` (python | onnxruntime) under ``release``."""
    if backend == "python" and release.release in PYTHON_BACKEND_ONNXRUNTIME:
        version = PYTHON_BACKEND_ONNXRUNTIME[release.release]
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
