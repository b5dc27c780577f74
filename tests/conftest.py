"""Shared fixtures. Heavy work (a full build) is done once per session and reused read-only."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# one model-control key for the session (builder/serving/control_key.py): a server a test starts and a verb it
# runs as a separate process (tune, check --url) must share it, as an operator's shell does; the tests of the
# per-start random key remove it themselves
os.environ.setdefault("TRITON_BUILDER_CONTROL_KEY", secrets.token_urlsafe(32))


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m builder ...` as a user would; returns the completed process."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=cwd or ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


def load_script(path: Path, name: str):
    """A script under scripts/ imported as a module (its functions tested directly)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(module: str, extra: str = "dev"):
    """Import ``module`` for a test, or skip it where it is missing - except in CI (CI=true), where
    the dev install must provide it, so a missing package is a failure and not a silent skip."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        message = f"{module} is not installed (pip install -e '.[{extra}]', or `make setup`)"
        if in_ci():
            pytest.fail(message + " -- CI is set, so this is a failure")
        pytest.skip(message)


def require_command(command: str, package: str) -> str:
    """The path of a system command the tests need, or a skip - a failure in CI, whose setup
    (scripts/install-system-deps.sh) installs the Debian ``package`` that provides it."""
    path = shutil.which(command)
    if path:
        return path
    message = f"{command} not found on PATH: run scripts/install-system-deps.sh (Debian package `{package}`)"
    if in_ci():
        pytest.fail(message + " -- CI is set, so this is a failure")
    pytest.skip(message + "; set CI=true to make this a failure")


@contextlib.contextmanager
def served_model_py(stand_in, module_name: str = "served_model_py"):
    """templates/python_backend/model.py imported outside Triton, with ``stand_in`` as its
    triton_python_backend_utils: the served code's own logic, without a server."""
    from builder.repository.served_replay import import_model_py

    yield import_model_py(ROOT / "templates/python_backend/model.py", stand_in, module_name)



def ec_key_pair(folder: Path, name: str = "signing", password: bytes | None = None) -> tuple[Path, Path]:
    """A new elliptic-curve signing key as <folder>/<name>.pem (PKCS8, encrypted with ``password`` when
    given) and its public half as <name>.pub."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture
def aws_mock(monkeypatch):
    """moto's in-process S3 (extras dev, s3), with credentials of its own and no endpoint of the host's."""
    moto = require("moto", "dev")
    require("boto3", "s3")
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unit-test-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "unit-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with moto.mock_aws():
        yield

def edit_spec(folder: Path, **changes) -> Path:
    """Rewrite folder/spec.yaml with top-level keys changed (None removes a key); returns its path."""
    path = folder / "spec.yaml"
    data = yaml.safe_load(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def quiet():
    return lambda message: None


@pytest.fixture(scope="session")
def built_repository(tmp_path_factory) -> Path:
    """digits_cnn and bert_tiny built once (no benchmark) into a session repository."""
    from builder.pipeline import build

    repo = tmp_path_factory.mktemp("session_repo") / "model_repository"
    for spec in ("digits/spec.yaml", "bert_tiny/spec.yaml"):
        build(EXAMPLES / spec, repo, variants=["onnx", "torchscript"], benchmark_seconds=0,
              progress=lambda m: None)
    return repo


@pytest.fixture
def digits_copy(tmp_path) -> Path:
    """A writable copy of the digits example: tests edit its spec freely."""
    target = tmp_path / "digits"
    shutil.copytree(EXAMPLES / "digits", target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


# --- the fast inner loop (`make test-fast` = `pytest -m "not slow" tests/unit`) --------------------------------
# A test is marked `slow` when it builds a model, starts a real server or a CLI process that does real work, or
# waits out timeouts; the full suite (`make test`, CI) runs everything. Two ways a test gets the mark:
#   - here, automatically: it uses (directly or through another fixture) one of SLOW_FIXTURES below;
#   - in its module: `@pytest.mark.slow(reason=...)` on a test that builds in its body (or `pytestmark`).
# A new fixture that builds a model or starts a server belongs in SLOW_FIXTURES, keyed "<file>::<fixture>";
# tests/unit/test_fast_selection.py fails when a fixture of tests/ calls build( and is not listed here.
SLOW_FIXTURES = {
    "conftest.py::built_repository": "builds digits_cnn and bert_tiny (session fixture)",
    "test_variants.py::digits_build": "builds digits with every variant (module fixture)",
    "test_signing.py::signed": "builds and signs digits (module fixture)",
    "test_select.py::variants_repository": "builds digits' onnx and torchscript variants (module fixture)",
    "test_select_provenance.py::two_builds": "builds digits twice (module fixture)",
    "test_select_provenance.py::signed": "builds and signs digits (module fixture)",
    "test_compression.py::pruned_build": "builds a pruned digits variant (module fixture)",
    "test_compression_outputs.py::embedding_first_build": "builds a compressed two-output model (module fixture)",
    "test_openvino.py::tiny_build": "builds a model with its OpenVINO variants (module fixture)",
    "test_openvino_input_names.py::cast_build": "builds a model with its OpenVINO variant (module fixture)",
    "test_gpu_path.py::gpu_build": "builds digits for target gpu (module fixture)",
    "test_precision_guards.py::half_build": "builds a float16 model (module fixture)",
    "test_precision_guards.py::double_build": "builds a float64 model (module fixture)",
    "test_regression.py::two_versions": "builds digits twice (module fixture)",
    "test_rollback.py::built": "builds a tiny model five times, two of them signed (module fixture)",
    "test_rollback.py::monitored": "builds a monitored tiny model twice (module fixture)",
    "test_lifecycle_guards.py::mlflow": "installs and starts an MLflow server (module fixture)",
}


def fixture_key(fixturedef) -> str:
    """SLOW_FIXTURES' key of a fixture definition: "<file name>::<fixture name>"."""
    return f"{Path(fixturedef.func.__code__.co_filename).name}::{fixturedef.argname}"


def slow_fixtures_of(item) -> list[str]:
    """The SLOW_FIXTURES keys among the fixtures ``item`` uses, directly or through other fixtures."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    used = []
    for name in item.fixturenames:
        definitions = info.name2fixturedefs.get(name) or ()
        if definitions and fixture_key(definitions[-1]) in SLOW_FIXTURES:  # [-1]: the one this test gets
            used.append(fixture_key(definitions[-1]))
    return used


def pytest_collection_modifyitems(config, items):
    for item in items:
        for key in slow_fixtures_of(item):
            item.add_marker(pytest.mark.slow(reason=f"uses {key.split('::')[1]}: {SLOW_FIXTURES[key]}"))
