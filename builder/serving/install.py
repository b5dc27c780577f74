"""Where the embedded Triton server's pieces are: the ``tritonserver`` binary and python backend of
the nvidia-pytriton wheel, the backend directory built from them, and the environment to run it in.

Usage::

    install = find_tritonserver()          # ServerError naming every missing piece otherwise
    backends = build_backend_dir(install, workdir / "backends")
    env = server_environment(install)      # LD_LIBRARY_PATH and PATH for the binary and the stub
    workdir = make_workdir()               # a temp dir whose path the stub's command line can take
    served = stub_safe_repository(repository, workdir) or repository   # a symlink if its path has spaces

The python backend starts each model's stub through ``bash -c "STUB MODEL_PATH SHM_NAME ..."``,
unquoted: a model or backend path with a space (or another shell character) splits into wrong
arguments, the stub dies (``std::invalid_argument stol``) and the server waits for it forever.

How it runs the binary (facts measured with nvidia-pytriton 0.7.0):

- The backend directory is built in a temp folder: ``<tmp>/backends/python/`` links
  ``libtriton_python.so``, ``triton_python_backend_utils.py`` and the ``triton_python_backend_stub``
  built for the running Python (``pytriton/tritonserver/python_backend_stubs/3.X/``);
  ``<tmp>/backends/{onnxruntime,pytorch,openvino}/model.py`` are Python-based stand-ins for Triton's C++
  backends, so standard model folders (``onnxruntime_onnx`` + model.onnx, ...) load unchanged.
- ``LD_LIBRARY_PATH`` starts with ``<site-packages>/nvidia_pytriton.libs`` and this interpreter's
  ``LIBDIR`` (the stub links ``libpython3.X.so``; another one on the system would win otherwise), and
  ``PATH`` starts with ``dirname(sys.executable)`` so the stub imports this environment's packages.
- All addresses are ``127.0.0.1`` by default, on free ports asked from the OS (port 0); if the server
  still reports an address in use, the start is retried on new ports.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from builder.core import assets
from builder.core.errors import ServerError, UserInputError
from builder.serving.backends import STANDIN_BACKENDS

__all__ = ["INSTALL_HINT", "TritonInstall", "find_tritonserver", "build_backend_dir", "server_environment"]

INSTALL_HINT = "pip install nvidia-pytriton==0.7.0"


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of the wheel's Triton server are."""

    binary: Path  #: ``pytriton/tritonserver/bin/tritonserver``
    python_backend_dir: Path  #: holds ``libtriton_python.so`` and ``triton_python_backend_utils.py``
    stub: Path  #: ``triton_python_backend_stub`` for the running Python version
    libs_dir: Path  #: ``site-packages/nvidia_pytriton.libs`` (the binary's bundled shared libraries)
    python_libdir: Path | None  #: this interpreter's LIBDIR (``libpython3.X.so``), if it exists

    @property
    def backend_library(self) -> Path:
        return self.python_backend_dir / "libtriton_python.so"

    @property
    def backend_utils(self) -> Path:
        return self.python_backend_dir / "triton_python_backend_utils.py"


def find_tritonserver() -> TritonInstall:
    """Find the ``tritonserver`` binary and python backend in the installed nvidia-pytriton wheel.

    Raises ``ServerError`` naming every missing piece and how to install it.
    """
    if not sys.platform.startswith("linux"):
        raise ServerError(
            f"the embedded Triton server runs on Linux only (this is {sys.platform}); "
            "use docker compose on a Linux host instead"
        )
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerError(f"the embedded Triton server needs the nvidia-pytriton wheel, which is not installed: {INSTALL_HINT}")
    package = Path(list(spec.submodule_search_locations)[0])
    root = package / "tritonserver"
    binary = root / "bin" / "tritonserver"
    backend = root / "backends" / "python"
    pyver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stubs_root = root / "python_backend_stubs"
    stub = stubs_root / pyver / "triton_python_backend_stub"
    libs = package.parent / "nvidia_pytriton.libs"

    missing = []
    if not binary.is_file():
        missing.append(f"the server binary {binary}")
    elif not os.access(binary, os.X_OK):
        missing.append(f"execute permission on {binary}")
    for piece in (backend / "libtriton_python.so", backend / "triton_python_backend_utils.py"):
        if not piece.is_file():
            missing.append(f"the python backend file {piece}")
    if not stub.is_file():
        have = sorted(p.name for p in stubs_root.iterdir() if (p / "triton_python_backend_stub").is_file()) if stubs_root.is_dir() else []
        missing.append(
            f"the python backend stub for Python {pyver} ({stub}; stubs found for: {', '.join(have) or 'none'})"
        )
    if not libs.is_dir():
        missing.append(f"the bundled libraries folder {libs}")
    if missing:
        raise ServerError(
            "the embedded Triton server from nvidia-pytriton is incomplete; missing "
            + "; ".join(missing)
            + f". Reinstall it with: {INSTALL_HINT}"
        )
    libdir = sysconfig.get_config_var("LIBDIR")
    python_libdir = Path(libdir) if libdir and Path(libdir).is_dir() else None
    return TritonInstall(binary, backend, stub, libs, python_libdir)


def build_backend_dir(install: TritonInstall, backends: Path, native: dict[str, list[Path]] | None = None) -> Path:
    """``<backends>/python/`` linking (or copying) the backend library, its utils and the stub; and
    ``<backends>/{onnxruntime,pytorch,openvino}/``: for a backend in ``native`` (name -> the files of Triton's
    C++ backend built by builder/serving/native_backends.py, its library first), links to them; for the others the
    stand-in ``model.py`` (a Python-based backend: Triton runs it with the python backend's library) and
    ``served_model.py`` beside it."""

    target = backends / "python"
    target.mkdir(parents=True, exist_ok=True)
    # a copy, not a link: Triton resolves the library's real path for Python-based backends and refuses one
    # outside the backend directory ("backend library name 'libtriton_python.so' escapes backend directory")
    shutil.copy2(install.backend_library, target / "libtriton_python.so")
    for src, name in ((install.backend_utils, "triton_python_backend_utils.py"),
                      (install.stub, "triton_python_backend_stub")):
        _link(src, target / name)
    for backend in STANDIN_BACKENDS:
        folder = backends / backend
        folder.mkdir(parents=True, exist_ok=True)
        if native and backend in native:
            for item in native[backend]:
                _link(item, folder / item.name)
            continue
        _link(assets.standin_backend_model(), folder / "model.py")
        _link(assets.python_backend_model(), folder / "served_model.py")
    return backends


def _link(src: Path, dst: Path) -> None:
    try:
        dst.symlink_to(src)
    except OSError:
        shutil.copy2(src, dst)


def server_environment(install: TritonInstall) -> dict[str, str]:
    """This environment with the wheel's libraries and this interpreter's LIBDIR first on
    ``LD_LIBRARY_PATH`` and its bin folder first on ``PATH`` (the stub imports this environment's packages)."""
    env = dict(os.environ)
    lib_dirs = [str(install.libs_dir)]
    if install.python_libdir is not None:
        lib_dirs.append(str(install.python_libdir))
    if env.get("LD_LIBRARY_PATH"):
        lib_dirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_dirs)
    bin_dir = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join([bin_dir] + ([env["PATH"]] if env.get("PATH") else []))
    return env


def shell_safe(path: Path | str) -> bool:
    """Whether ``path`` passes through an unquoted shell command line unchanged (as the stub's does)."""
    return shlex.quote(str(path)) == str(path)


def require_stub_safe_tmpdir() -> None:
    """``UserInputError`` naming TMPDIR if its path would break the stub's command line (the backend dir
    is made in it); `run` asks before it builds, not when it starts the server."""
    if not shell_safe(tempfile.gettempdir()):
        raise UserInputError(f"TMPDIR {tempfile.gettempdir()!r}: tritonserver's python backend starts its stub "
                             "through a shell command line that splits this path; set TMPDIR to a folder "
                             "whose path has no spaces or shell characters (e.g. TMPDIR=/tmp)")


def make_workdir(prefix: str = "triton-embedded-") -> Path:
    """A new temp dir (``require_stub_safe_tmpdir``)."""
    require_stub_safe_tmpdir()
    return Path(tempfile.mkdtemp(prefix=prefix))


def stub_safe_repository(repository: Path, workdir: Path) -> Path | None:
    """``<workdir>/repository``, a symlink to ``repository``, when the stub's command line cannot take
    the repository's own path (a space, a quote...); None when it can."""
    if shell_safe(repository):
        return None
    link = workdir / "repository"
    link.symlink_to(repository, target_is_directory=True)
    return link
