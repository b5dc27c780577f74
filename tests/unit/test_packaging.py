"""Packaging: assets found as package data (never through the checkout), what the wheel ships, the
dependency ranges and lock, and the error a verb gives when its extra is not installed.

The wheel installed outside the checkout, building + serving + checking digits from there, is
scripts/wheel-smoke.sh (`make wheel-smoke`, run by .ci/run).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

from builder.core import assets
from builder.cli import main
from builder.core.errors import UserInputError
from builder.core.extras import require

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
    assert assets.drift_module() == Path(sys.modules["builder"].__file__).parent / "monitoring" / "drift.py"
    assert {"locustfile.py", "shapes.py", "triton_target.py", "locust.conf"} <= {p.name for p in assets.loadtest_dir().iterdir()}
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
    assert offenders == [], "find assets with builder.core.assets (importlib.resources), not Path(__file__).parents[N]"


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
    assert "builder/core/assets.py" in names and "builder/monitoring/drift.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


# --------------------------------------------------------------------------------------------
# dependencies


def test_dependencies_are_ranges_and_extras_exist():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base, extras = project["dependencies"], project["optional-dependencies"]
    assert not [r for r in base if "==" in r], "pyproject: ranges for a user's stack; exact pins only in the lock"
    torch = next(r for r in base if r.startswith("torch"))
    assert "<2.14" in torch, "no torch newer than 2.13.x: anything else downloads GB of CUDA wheels here"
    assert any(r.startswith("tritonclient[http,grpc]") for r in base)
    assert {"s3", "k8s", "gpu", "dev"} <= set(extras)
    assert any(r.startswith("boto3") for r in extras["s3"])
    assert any(r.startswith("kubernetes-validate") for r in extras["k8s"])
    assert not any(r.startswith("onnxruntime") for r in extras["gpu"]), "the gpu extra must not fight onnxruntime"
    assert any("s3" in r and "k8s" in r for r in extras["dev"]), "dev includes the s3 and k8s extras"


def test_lock_has_no_local_versions_nor_placeholders():
    lines = [line.strip() for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert not [line for line in lines if "+" in line], "no local-version labels (+cpu): only PyTorch's index has them"
    names = {re.split(r"[=<>!~]", line)[0].lower().replace("_", "-") for line in lines}
    assert "torch==2.13.0" in lines
    assert not names & {"perf-analyzer", "cuda-python"}, "tritonclient[http,grpc] needs neither"


def _supported_pythons() -> list[str]:
    """The minor versions requires-python admits (3.0-3.29)."""
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    return [f"3.{minor}" for minor in range(30) if requires.contains(f"3.{minor}.0")]


def _python_env(version: str) -> dict[str, str]:
    return {"python_version": version, "python_full_version": f"{version}.0", "extra": ""}


def _lock() -> list[Requirement]:
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines()]
    return [Requirement(line) for line in lines if line]


def _lock_for(version: str) -> dict[str, Version]:
    return {canonicalize_name(r.name): Version(str(r.specifier)[2:]) for r in _lock()
            if r.marker is None or r.marker.evaluate(_python_env(version))}


def test_requires_python_is_bounded_and_matches_the_readme_and_make_venv():
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert any(spec.operator in ("<", "<=") for spec in requires), \
        "requires-python needs an upper bound: pip must refuse a Python the lock cannot install on (3.13)"
    supported = _supported_pythons()
    claimed = re.search(r"Needs Debian or Ubuntu, Python (3)\.(\d+)-3\.(\d+)", (ROOT / "README.md").read_text())
    assert claimed, "README's install paragraph names the Python range"
    assert supported == [f"3.{m}" for m in range(int(claimed[2]), int(claimed[3]) + 1)], (supported, claimed[0])
    make_venv = re.search(r'supported\(\) \{ case "\$1" in ([\d.|]+)\)', (ROOT / "scripts" / "make-venv.sh").read_text())
    assert make_venv and make_venv[1].split("|") == supported, "scripts/make-venv.sh accepts what requires-python does"


def test_lock_pins_each_package_exactly_once_for_every_supported_python():
    lock = _lock()
    for r in lock:
        assert len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==", f"exact pins only: {r}"
        if r.marker is not None:
            names = set(re.findall(r"\b([a-z_]+)\s*[<>=!]", str(r.marker)))
            assert names <= {"python_version", "python_full_version"}, f"python_version markers only: {r}"
    for version in _supported_pythons():
        seen = [canonicalize_name(r.name) for r in lock
                if r.marker is None or r.marker.evaluate(_python_env(version))]
        assert sorted(n for n in set(seen) if seen.count(n) > 1) == [], f"pinned twice on Python {version}"
        # a package whose version differs by Python (two lines or more) is pinned on each; one marked line
        # alone is a package only some Pythons need (tomli, exceptiongroup on 3.10)
        all_names = [canonicalize_name(r.name) for r in lock]
        split = {n for n in all_names if all_names.count(n) > 1}
        assert sorted(split - set(seen)) == [], f"pinned for other Pythons but not for {version}"


def test_installed_lock_members_requirements_hold_on_every_supported_python():
    """The pins agree with what the locked packages ask for on each Python: read offline from the metadata of
    the packages installed here, for each one installed at its locked version. sigstore 4.5.1 asks for
    importlib-resources~=5.7 on Python < 3.11, which a single importlib_resources==7.1.0 pin broke on 3.10;
    pytest asks for tomli and exceptiongroup there, which were not pinned."""
    installed = {canonicalize_name(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    problems, checked = [], 0
    for version in _supported_pythons():
        pins = _lock_for(version)
        for name, pin in pins.items():
            dist = installed.get(name)
            if dist is None or Version(dist.version).public != pin.public:
                continue
            checked += 1
            for line in dist.requires or []:
                req = Requirement(line)
                if req.marker is not None and not req.marker.evaluate(_python_env(version)):
                    continue
                wanted = pins.get(canonicalize_name(req.name))
                if wanted is None:
                    problems.append(f"Python {version}: {name} {pin} needs {req}, which the lock does not pin")
                elif not req.specifier.contains(wanted, prereleases=True):
                    problems.append(f"Python {version}: {name} {pin} needs {req}, the lock pins {wanted}")
    if not checked:
        pytest.skip("none of the locked packages is installed at its locked version")
    assert problems == [], "\n".join(problems)


# --------------------------------------------------------------------------------------------
# a verb whose extra is missing says which extra to install


@pytest.fixture
def without(monkeypatch):
    """``without("boto3")``: importing that module fails as if its package were not installed."""
    def hide(*modules: str) -> None:
        for name in list(sys.modules):
            if name.split(".")[0] in modules:
                monkeypatch.delitem(sys.modules, name)
        for name in modules:
            monkeypatch.setitem(sys.modules, name, None)
    return hide


def test_require_names_the_extra(without):
    without("boto3")
    with pytest.raises(UserInputError, match=r"^an s3:// repository needs boto3: pip install 'triton-builder\[s3\]'$"):
        require("boto3", "an s3:// repository")
    assert UserInputError.exit_code == 2


def test_require_leaves_other_missing_modules_alone():
    with pytest.raises(ModuleNotFoundError):
        require("triton_builder_no_such_module", "nothing")


def test_s3_store_without_boto3(without):
    from builder.storage.s3 import S3Store

    without("boto3", "botocore")
    with pytest.raises(UserInputError, match=r"needs boto3: pip install 'triton-builder\[s3\]'"):
        S3Store("s3://bucket/models").client


def test_publish_without_boto3_says_install_the_s3_extra(without, tmp_path, capsys):
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text('name: "m"\n')
    without("boto3", "botocore")
    assert main(["publish", "--repository", str(tmp_path), "--to", "s3://bucket/models"]) == 2
    assert "pip install 'triton-builder[s3]'" in capsys.readouterr().err


@pytest.mark.parametrize("verb", [["check", "m"], ["serve"]])
def test_s3_repository_without_boto3_says_install_the_s3_extra(without, verb, capsys):
    without("boto3", "botocore")
    assert main([*verb, "--repository", "s3://bucket/models"]) == 2
    err = capsys.readouterr().err
    assert "needs boto3: pip install 'triton-builder[s3]'" in err and "Traceback" not in err


def test_k8s_without_kubernetes_validate_says_install_the_k8s_extra(without, tmp_path, capsys):
    without("kubernetes_validate")
    out = tmp_path / "k8s"
    assert main(["k8s", "--repository-url", "s3://bucket/models", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the 'k8s' verb needs kubernetes-validate: pip install 'triton-builder[k8s]'" in err
    assert "--no-validate" in err
    assert not out.exists(), "nothing is written before the check"
    # rendering alone needs no extra
    assert main(["k8s", "--repository-url", "s3://bucket/models", "--out", str(out), "--no-validate"]) == 0
    assert (out / "base" / "kustomization.yaml").is_file()
