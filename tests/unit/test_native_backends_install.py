"""`install-backends` (builder/serving/native_backends.py) without compiling: the cache key and reuse, the
one-line reasons a build fails with (missing tools, sources), and the registry's error. The real build and the
server that loads it: tests/integration/test_native_backends.py."""

from __future__ import annotations

import pytest

from builder.core.errors import UserInputError
from builder.serving import native_backends as nb
from builder.serving.native_gpu import patch_gather_kernel
from builder.serving.native_recipes import BackendBuildError, aliases, needed_libraries


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_BUILDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(nb.MODE_ENV, raising=False)
    return tmp_path / "cache"


def test_an_unknown_backend_lists_the_supported_ones_and_how_to_add_one(cache):
    with pytest.raises(UserInputError, match=r"backend 'tensorflow' is not one triton-builder builds; supported: "
                                             r"onnxruntime, openvino, pytorch, onnxruntime-gpu \(add one with "
                                             r"a Recipe in "
                                             r"builder/serving/native_recipes\.py\)"):
        nb.install_backends(["tensorflow"])


def test_the_cache_is_keyed_by_release_runtime_and_server_and_a_built_one_is_reused(cache):
    recipe = nb.RECIPES["onnxruntime"]
    home = nb.backend_home(recipe)
    assert home.parent == cache / "backends"
    assert home.name.startswith("onnxruntime-r24.10-onnxruntime1.19.2-cpu-")
    assert nb.built_backend("onnxruntime") is None
    home.mkdir(parents=True)
    (home / recipe.library).write_bytes(b"")
    (home / "ready").write_text("r24.10 onnxruntime 1.19.2\n")
    assert nb.built_backend("onnxruntime") == home
    report = nb.install_backends(["onnxruntime"])
    assert [(r.backend, r.status) for r in report.rows] == [("onnxruntime", "cached")] and report.ok
    assert report.lines()[0].startswith("onnxruntime  cached  Triton r24.10 backend against onnxruntime 1.19.2, "
                                        "already built (cached): ")


def test_standin_mode_hides_a_built_backend_and_a_bad_mode_is_refused(cache, monkeypatch):
    home = nb.backend_home(nb.RECIPES["onnxruntime"])
    home.mkdir(parents=True)
    (home / "libtriton_onnxruntime.so").write_bytes(b"")
    (home / "ready").write_text("x\n")
    monkeypatch.setenv(nb.MODE_ENV, "standin")
    assert nb.built_backend("onnxruntime") is None
    monkeypatch.setenv(nb.MODE_ENV, "fast")
    with pytest.raises(UserInputError, match=r"\$TRITON_BUILDER_BACKENDS='fast': use native .* or standin"):
        nb.install_backends()


def test_missing_tools_fail_the_backend_in_one_line_naming_the_packages_and_leave_nothing(cache, monkeypatch):
    real_which = nb.shutil.which
    monkeypatch.setattr(nb.shutil, "which", lambda tool: None if tool in ("cmake", "patchelf") else real_which(tool))
    report = nb.install_backends(["onnxruntime"])
    row = report.rows[0]
    assert not report.ok and row.status == "failed"
    assert row.reason.startswith("missing cmake (apt-get install cmake); patchelf (apt-get install patchelf)")
    assert row.reason.endswith("(scripts/install-system-deps.sh installs them all)") and "\n" not in row.reason
    assert report.lines()[0].startswith("onnxruntime  FAILED  missing cmake") and \
        report.lines()[0].endswith("(served through the Python stand-in)")
    assert nb.built_backend("onnxruntime") is None
    assert [p.name for p in (cache / "backends").iterdir()] == []  # no half-built folder


def test_a_sources_folder_without_the_archive_names_the_file_it_wants(cache, monkeypatch, tmp_path):
    monkeypatch.setattr(nb, "_missing_tools", lambda: [])
    monkeypatch.setenv(nb.SOURCES_ENV, str(tmp_path / "empty"))
    row = nb.install_backends(["onnxruntime"]).rows[0]
    assert row.status == "failed"
    assert row.reason == (f"$TRITON_SOURCES_DIR={tmp_path / 'empty'}: no triton-r24.10/onnxruntime_backend.tar.gz "
                          "there (lay it out as ../shared/third_party is: triton-r24.10/<repo>.tar.gz)")


def test_the_runtime_library_gets_its_soname_and_link_name():
    assert aliases("libonnxruntime.so.1.19.2") == ["libonnxruntime.so.1", "libonnxruntime.so"]
    assert aliases("libfoo.so") == []


def test_served_kinds_says_which_backends_are_tritons_own():
    kinds = nb.served_kinds(("onnxruntime", "openvino"), ["onnxruntime"])
    assert kinds["onnxruntime"] == "Triton's C++ backend (r24.10, onnxruntime 1.19.2)"
    assert kinds["openvino"].startswith("Python stand-in")


def test_a_plain_install_builds_onnxruntime_and_pytorch_and_openvino_only_when_named_with_its_caveat(cache,
                                                                                                    monkeypatch):
    monkeypatch.setattr(nb, "_missing_tools", lambda: ["cmake (apt-get install cmake)"])  # each fails at once
    said = []
    assert [r.backend for r in nb.install_backends(progress=said.append).rows] == ["onnxruntime", "pytorch"]
    assert not any("note:" in line for line in said)
    nb.install_backends(["openvino"], progress=said.append)
    assert any(line.startswith("  note: r24.10's openvino backend reshapes the IR to max_batch_size") for line in said)
    kinds = nb.served_kinds(("openvino",), [])
    assert kinds["openvino"] == ("Python stand-in (not built here: `triton-builder install-backends --backend "
                                 "openvino` builds Triton's own)")


def _fake_build(recipe, library: bytes = b"") -> object:
    home = nb.backend_home(recipe)
    home.mkdir(parents=True)
    (home / recipe.library).write_bytes(library)
    (home / "ready").write_text("x\n")
    return home


def test_the_gpu_build_is_cached_apart_and_served_only_under_gpu_mode(cache, monkeypatch):
    gpu_recipe = nb.RECIPES["onnxruntime-gpu"]
    assert gpu_recipe.backend == "onnxruntime" and not gpu_recipe.default and gpu_recipe.cuda.startswith("12.")
    assert nb.backend_home(gpu_recipe).name.startswith(
        f"onnxruntime-r24.10-onnxruntime-gpu1.19.2-cuda{gpu_recipe.cuda}-")
    gpu = _fake_build(gpu_recipe)
    assert nb.built_backend("onnxruntime") is None  # the GPU build alone never serves by default
    monkeypatch.setenv(nb.MODE_ENV, "gpu")
    assert nb.built_backend("onnxruntime") == gpu
    assert nb.served_kinds(("onnxruntime",), ["onnxruntime"])["onnxruntime"].startswith(
        "Triton's C++ backend (r24.10, onnxruntime-gpu 1.19.2, CUDA 12.6.77); note: the GPU build needs")
    cpu = _fake_build(nb.RECIPES["onnxruntime"])
    assert nb.built_backend("onnxruntime") == gpu and nb.built_backend("onnxruntime-gpu") == gpu
    monkeypatch.delenv(nb.MODE_ENV)
    assert nb.built_backend("onnxruntime") == cpu and nb.built_backend("onnxruntime-gpu") == gpu
    assert nb.served_kinds(("onnxruntime",), ["onnxruntime"])["onnxruntime"] == \
        "Triton's C++ backend (r24.10, onnxruntime 1.19.2)"
    assert [r.status for r in nb.install_backends(["onnxruntime-gpu"]).rows] == ["cached"]


def test_a_row_lists_the_librarys_needed_entries_as_readelf_does(cache, tmp_path):
    import re
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    elf = Path(sys.executable).resolve()
    needed = needed_libraries(elf)
    assert "libc.so.6" in needed
    if shutil.which("readelf"):
        out = subprocess.run(["readelf", "-d", elf], capture_output=True, text=True, check=True).stdout
        assert needed == re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", out)
    (tmp_path / "text.so").write_text("not an ELF file")
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF file"):
        needed_libraries(tmp_path / "text.so")
    _fake_build(nb.RECIPES["onnxruntime"], elf.read_bytes())
    report = nb.install_backends(["onnxruntime"])
    assert report.rows[0].needed == needed
    assert report.lines()[1] == " " * 13 + "NEEDED " + ", ".join(needed)


def test_the_gather_kernel_becomes_a_cpp_function_and_a_changed_cmakelists_is_refused(tmp_path):
    (tmp_path / "src").mkdir()
    cmake = tmp_path / "CMakeLists.txt"
    block = ("  add_library(\n    kernel_library_new\n    src/kernel.cu src/kernel.h\n  )\n\n  enable_language(CUDA)\n"
             "  set_target_properties(kernel_library_new PROPERTIES CUDA_RESOLVE_DEVICE_SYMBOLS ON)\n")
    cmake.write_text(f"if(${{TRITON_ENABLE_GPU}})\n{block}\nendif() # TRITON_ENABLE_GPU\n")
    patch_gather_kernel(tmp_path)
    text = cmake.read_text()
    assert "CUDA" not in text.replace("CUDA::cudart", "") and "src/kernel_stub.cc" in text
    assert "return cudaErrorNotSupported;" in (tmp_path / "src" / "kernel_stub.cc").read_text()
    with pytest.raises(BackendBuildError, match="is not the r24.10 one whose gather kernel this build replaces"):
        patch_gather_kernel(tmp_path)
