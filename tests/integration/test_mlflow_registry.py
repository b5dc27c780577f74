"""MLflow's model registry with a REAL local `mlflow server` (sqlite backend, served artifacts, 127.0.0.1)
from its cached side virtualenv: register a published version, then validate and serve it by URI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from builder.core.errors import UserInputError
from builder.core.processes import free_ports
from builder.storage import mlflow_registry
from tests.conftest import ROOT, in_ci, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    try:
        mlflow_registry.mlflow_python()
    except Exception as err:  # noqa: BLE001 - no PyPI here
        if in_ci():
            raise
        pytest.skip(f"cannot install mlflow here: {err}")
    with mlflow_registry.MlflowServer(tmp_path_factory.mktemp("mlflow")) as running:
        yield running


def _get(url: str) -> dict:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=30) as response:
        return json.loads(response.read())


def test_register_then_validate_and_serve_by_uri(server, built_repository, tmp_path):
    proc = run_cli("register", str(built_repository / "digits_cnn"), "--registry", server.url, "--alias", "prod")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "registered " in proc.stdout and "as models:/digits_cnn/1 " in proc.stdout
    again = run_cli("register", str(built_repository / "digits_cnn"), "--registry", server.url, "--alias", "prod")
    assert again.returncode == 0, again.stdout + again.stderr
    folder = built_repository / "digits_cnn"
    assert again.stdout.startswith(f"already registered {folder} as models:/digits_cnn/1 "), again.stdout
    assert "\nnote: digits_cnn version 1 is already registered as models:/digits_cnn/1 with the same files" \
        in again.stdout
    # what the registry holds: metrics and tags on the run, the version with its source
    version = _get(f"{server.url}/api/2.0/mlflow/model-versions/get?name=digits_cnn&version=1")["model_version"]
    run = _get(f"{server.url}/api/2.0/mlflow/runs/get?run_id={version['run_id']}")["run"]
    metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert metrics["accuracy"] > 90 and "accuracy_drop" in metrics
    assert json.loads(tags["host"])["machine"] and tags["triton_builder.version"] == "1"
    assert "variants" in tags and tags["triton_builder.model"] == "digits_cnn"

    for uri in ("models:/digits_cnn/1", "models:/digits_cnn@prod"):
        proc = run_cli("validate", uri, "--registry", server.url)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "version 1: OK (hashes match" in proc.stdout

    ports = [str(p) for p in free_ports("127.0.0.1", 3)]
    serve = subprocess.Popen([sys.executable, "-m", "builder", "serve", "--repository", "models:/digits_cnn@prod",
                              "--registry", server.url, "--http-port", ports[0], "--grpc-port", ports[1],
                              "--metrics-port", ports[2]], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    seen = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = serve.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "is ready" in line:
                break
        # the served accuracy gate against the registry version's own reference (was: a local path "models:")
        check = run_cli("check", "digits_cnn", "--repository", "models:/digits_cnn@prod", "--registry", server.url,
                        "--url", f"127.0.0.1:{ports[0]}", "--grpc-url", f"127.0.0.1:{ports[1]}")
    finally:
        serve.send_signal(signal.SIGTERM)
        out, _ = serve.communicate(timeout=60)
    assert any("is ready" in line for line in seen), "".join(seen) + out
    assert check.returncode == 0, check.stdout + check.stderr
    assert "version 1" in check.stdout and "OK" in check.stdout, check.stdout


def test_build_registers_what_it_publishes(server, digits_copy, tmp_path):
    repo = tmp_path / "repo"
    proc = run_cli("build", str(digits_copy / "spec.yaml"), "--repository", str(repo), "--variants", "onnx,onnx_opt",
                   "--publish-variants", "--benchmark-seconds", "0", "--register", "--registry", server.url,
                   "--alias", "staging")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "registered digits_cnn version 1 as models:/digits_cnn/" in proc.stdout
    assert "(alias staging)" in proc.stdout
    registered = [line for line in proc.stdout.splitlines() if line.startswith("registered ")]
    assert len(registered) == 2, proc.stdout  # the main model and its published sibling variant
    found = _get(f"{server.url}/api/2.0/mlflow/registered-models/alias?name=digits_cnn&alias=staging")
    run = _get(f"{server.url}/api/2.0/mlflow/runs/get?run_id={found['model_version']['run_id']}")["run"]
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    assert tags["triton_builder.model"] == "digits_cnn" and tags["variant"] in ("onnx", "onnx_opt")
    # the registered artifacts are the published version: validate by URI checks its hashes
    proc = run_cli("validate", "models:/digits_cnn@staging", "--registry", server.url)
    assert proc.returncode == 0 and "version 1: OK (hashes match" in proc.stdout, proc.stdout + proc.stderr


def test_register_stage_failing_after_publish_names_the_manual_fix(built_repository, tmp_path):
    from builder.core.processes import free_port
    from builder.spec.model import load_spec
    from builder.stages import register
    from builder.stages.base import BuildContext, BuildOptions, Status

    dead = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    ctx = BuildContext(spec=load_spec(ROOT / "examples" / "digits" / "spec.yaml"),
                       options=BuildOptions(repository=built_repository, registry=dead), workdir=tmp_path)
    ctx.published = [{"name": "digits_cnn", "version": 1}]
    result = register.run(ctx)
    assert result.status is Status.FAIL
    assert "digits_cnn version 1 is published but not registered" in result.reason
    assert f"triton-builder register {built_repository / 'digits_cnn'} --version 1 --registry {dead}" in result.reason
    ctx.options.registry = None
    assert register.run(ctx).status is Status.SKIPPED


def test_registry_uris_are_checked():
    assert mlflow_registry.parse_registry_uri("models:/m/3") == ("m", "3", None)
    assert mlflow_registry.parse_registry_uri("models:/m@prod") == ("m", None, "prod")
    with pytest.raises(UserInputError, match="give models:/NAME/VERSION or models:/NAME@ALIAS"):
        mlflow_registry.parse_registry_uri("models:/m")
