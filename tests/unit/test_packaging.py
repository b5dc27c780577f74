"""Packaging: assets found as package data (never through the checkout) and what the wheel ships.

The wheel installed outside the checkout, building + serving + checking digits from there, is
scripts/wheel-smoke.sh (`make wheel-smoke`, run by .ci/run).
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder import assets

ROOT = Path(__file__).resolve().parents[2]
ASSET_FOLDERS = ("templates", "loadtest", "monitoring")


def _asset_files() -> list[str]:
    """Every file of the top-level asset folders, relative to the repository root."""
    return sorted(p.relative_to(ROOT).as_posix() for folder in ASSET_FOLDERS for p in (ROOT / folder).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


# --------------------------------------------------------------------------------------------
# assets


def test_assets_are_real_files_of_the_installed_package():
    assert (assets.templates_dir() / "config" / "python.pbtxt.j2").is_file()
    assert (assets.templates_dir() / "k8s" / "base" / "kustomization.yaml.j2").is_file()
    assert assets.python_backend_model().name == "model.py" and assets.python_backend_model().is_file()
    assert assets.drift_module() == Path(sys.modules["builder"].__file__).parent / "drift.py"
    assert {"locustfile.py", "shapes.py", "locust.conf"} <= {p.name for p in assets.loadtest_dir().iterdir()}
    assert (assets.monitoring_dir() / "prometheus" / "prometheus.yml").is_file()
    # inside the package (in a checkout builder/_assets/<folder> links to the top-level folder)
    package = Path(sys.modules["builder"].__file__).parent
    found = (assets.templates_dir(), assets.loadtest_dir(), assets.monitoring_dir())
    assert list(found) == [package / "_assets" / folder for folder in ASSET_FOLDERS]


def test_exporter_module_is_importable_from_the_package():
    module = importlib.import_module(assets.EXPORTER_MODULE)
    assert callable(module.build_arg_parser)


def test_no_asset_is_found_relative_to_the_source_tree():
    offenders = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "builder").rglob("*.py"))
                 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if re.search(r"__file__\)?\.(resolve\(\)\.)?parents?\b", line)]
    assert offenders == [], "find assets with builder.assets (importlib.resources), not Path(__file__).parents[N]"


@pytest.mark.slow
def test_wheel_ships_every_asset_file(tmp_path):
    # built from a copy (symlinks kept) so the checkout gets no build/ or egg-info; --no-build-isolation:
    # the venv's setuptools, no download
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "builder", *ASSET_FOLDERS):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        kwargs = {"symlinks": True, "ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree else {}
        copy(ROOT / name, source / name, **kwargs)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("triton_builder-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in _asset_files() if f"builder/_assets/{f}" not in names]
    assert missing == [], f"package-data in pyproject.toml misses {missing}"
    assert "builder/assets.py" in names and "builder/drift.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
