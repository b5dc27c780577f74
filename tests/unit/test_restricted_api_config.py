"""Restricted control APIs, offline (builder/serving/control_key.py): the key (env or random), the
tritonserver flags and the command line the log shows (masked), the headers our client sends, how a
refusal reads, the key handed to tune's clean-up helper in its environment, and the Kubernetes check.
docker-compose.yml: tests/unit/test_compose.py; the rendered manifests: tests/unit/test_k8s_manifests.py;
the real server: tests/integration/test_restricted_api.py."""

from __future__ import annotations

import pytest

from builder.core.errors import UserInputError
from builder.serving import control_key

APIS = "model-repository,shared-memory,logging,trace"


def test_the_key_is_the_variable_or_a_new_random_one(monkeypatch):
    monkeypatch.delenv(control_key.ENV, raising=False)
    first, second = control_key.new_key(), control_key.new_key()
    assert first != second and len(first) >= 32
    monkeypatch.setenv(control_key.ENV, "  my-key.0123_~  ")
    assert control_key.new_key() == "my-key.0123_~"
    for bad in ("short", "has space inside", "a:b=c,d-long-enough", "x" * 257):
        monkeypatch.setenv(control_key.ENV, bad)
        with pytest.raises(UserInputError, match=r"\$TRITON_BUILDER_CONTROL_KEY: use 8 to 256 characters"):
            control_key.new_key()


def test_flags_mask_and_headers():
    assert control_key.server_args("k3y-k3y-k3y") == [
        f"--http-restricted-api={APIS}:triton-builder-control-key=k3y-k3y-k3y",
        f"--grpc-restricted-protocol={APIS}:triton-builder-control-key=k3y-k3y-k3y"]
    assert control_key.masked(["a", "--x=k3y-k3y-k3y"], "k3y-k3y-k3y") == ["a", "--x=***"]
    assert control_key.headers("http", "k") == {"triton-builder-control-key": "k"}
    assert control_key.headers("grpc", "k") == {"triton-grpc-protocol-triton-builder-control-key": "k"}
    assert control_key.headers("grpc", None) is None


def test_a_registered_address_wins_over_the_variable(monkeypatch):
    monkeypatch.setenv(control_key.ENV, "from-the-environment")
    control_key.register(["127.0.0.1:1"], "registered-key")
    try:
        assert control_key.key_for("127.0.0.1:1") == "registered-key"
        assert control_key.key_for("127.0.0.1:2") == "from-the-environment"
    finally:
        control_key.forget(["127.0.0.1:1"])
    assert control_key.key_for("127.0.0.1:1") == "from-the-environment"
    monkeypatch.delenv(control_key.ENV)
    assert control_key.key_for("127.0.0.1:1") is None


def test_the_announcement_never_shows_the_key(monkeypatch):
    monkeypatch.setenv(control_key.ENV, "from-the-environment")
    line = control_key.announcement("from-the-environment")
    assert "from-the-environment" not in line and line.endswith("with the key in $TRITON_BUILDER_CONTROL_KEY")
    line = control_key.announcement("made-for-this-start")
    assert "made-for-this-start" not in line and "(not shown; set $TRITON_BUILDER_CONTROL_KEY before starting" in line


def _server(tmp_path, **kwargs):
    from pathlib import Path

    from builder.serving.embedded import EmbeddedServer
    from builder.serving.install import TritonInstall

    server = EmbeddedServer(tmp_path, control_key="the-secret-key", **kwargs)
    server.install = TritonInstall(Path("/x/tritonserver"), Path("/x"), Path("/x/stub"), Path("/x"), None)
    server._ports, server._backend_dir, server.models = (1, 2, 3), Path("/x/backends"), ["m"]
    server.control_key = "the-secret-key"
    return server


def test_the_server_command_restricts_control_and_the_log_shows_it_masked(tmp_path):
    server = _server(tmp_path, extra_args=["--log-verbose=0"])
    cmd = server._command()
    assert cmd[-3:] == [f"--http-restricted-api={APIS}:triton-builder-control-key=the-secret-key",
                        f"--grpc-restricted-protocol={APIS}:triton-builder-control-key=the-secret-key",
                        "--log-verbose=0"]
    shown = " ".join(server._shown_command(cmd))
    assert "the-secret-key" not in shown and f"--http-restricted-api={APIS}:triton-builder-control-key=***" in shown
    # a caller's own restriction replaces ours
    own = _server(tmp_path, extra_args=["--http-restricted-api=model-repository:k=v"])._command()
    assert [a for a in own if "restricted" in a] == ["--http-restricted-api=model-repository:k=v"]


def test_the_log_header_uses_the_masked_command(tmp_path):
    import sys

    from builder.core.processes import LocalService

    class Secretive(LocalService):
        log_header = True
        log_path = tmp_path / "log"

        def _command(self):
            return [sys.executable, "-c", "pass", "--key=hush-hush-hush"]

        def _shown_command(self, cmd):
            return control_key.masked(cmd, "hush-hush-hush")

    service = Secretive()
    service.start()
    service.stop()
    text = service.log_path.read_text()
    assert "--key=***" in text and "hush-hush-hush" not in text


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_our_client_sends_the_key_with_model_control_only(protocol, monkeypatch):
    from builder.serving.client import TritonClient

    monkeypatch.delenv(control_key.ENV, raising=False)
    seen = {}
    with TritonClient("127.0.0.1:9", protocol, control_key="client-key") as client:
        for name in ("load_model", "unload_model", "get_model_repository_index", "get_model_config"):
            monkeypatch.setattr(client.raw, name, lambda *a, _n=name, **kw: seen.__setitem__(_n, kw.get("headers")) or [])
        client.load_model("m")
        client.unload_model("m")
        client.raw.get_model_repository_index = lambda **kw: seen.__setitem__("index", kw.get("headers")) or \
            ([] if protocol == "http" else _empty_index())
        client.repository_index()
    header = control_key.GRPC_HEADER if protocol == "grpc" else control_key.HEADER
    assert seen["load_model"] == seen["unload_model"] == seen["index"] == {header: "client-key"}


def _empty_index():
    from tritonclient.grpc import service_pb2

    return service_pb2.RepositoryIndexResponse()


@pytest.mark.parametrize("protocol, message", [
    ("grpc", "[StatusCode.UNAVAILABLE] This protocol is restricted, expecting header "
             "'triton-grpc-protocol-triton-builder-control-key'"),
    ("http", "This API is restricted, expecting header 'triton-builder-control-key'"),
])
def test_a_refusal_is_an_answer_that_names_the_variable(protocol, message, monkeypatch):
    from tritonclient.utils import InferenceServerException

    from builder.serving.client import TritonClient

    monkeypatch.delenv(control_key.ENV, raising=False)
    with TritonClient("127.0.0.1:9", protocol) as client:
        err = client._error("unload of model 'm'", InferenceServerException(
            msg=message, status="StatusCode.UNAVAILABLE" if protocol == "grpc" else "403"))
    assert not err.unreachable
    assert "unload of model 'm' failed: " in str(err) and "is restricted" in str(err)
    assert "set $TRITON_BUILDER_CONTROL_KEY to the key it was started with" in str(err)


def test_the_clean_up_helper_gets_the_key_in_its_environment(monkeypatch):
    from builder.core.processes import LocalService
    from builder.serving.control_helper import control_when_back

    started = []
    monkeypatch.setattr(LocalService, "start", lambda self: started.append((self._command(), self._env())))
    control_key.register(["127.0.0.1:7"], "helper-key-0")
    try:
        control_when_back("grpc://127.0.0.1:7", None, unload=["m"])
    finally:
        control_key.forget(["127.0.0.1:7"])
    command, env = started[0]
    assert env[control_key.ENV] == "helper-key-0" and "helper-key-0" not in " ".join(command)


def test_k8s_validation_wants_the_restriction(tmp_path):
    pytest.importorskip("kubernetes_validate")
    import yaml

    from builder.scaleout.k8s import render_manifests, validate_manifests

    render_manifests("s3://models-bucket/prod", tmp_path, model="m")
    path = tmp_path / "base" / "triton-deployment.yaml"
    doc = yaml.safe_load(path.read_text())
    container = doc["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [a for a in container["args"] if "restricted" not in a]
    path.write_text(yaml.safe_dump(doc))
    assert "triton does not restrict model control to $TRITON_BUILDER_CONTROL_KEY from a Secret" in \
        validate_manifests(tmp_path, use_kubectl=False)


def test_the_exporter_sends_the_key_for_the_repository_index_only(monkeypatch):
    """monitoring/exporter.py (a standalone image: it cannot import builder) reads the restricted index."""
    import urllib.request

    from builder.core import assets
    from builder.monitoring.local_exporter import LocalExporter
    import importlib

    exporter = importlib.import_module(assets.EXPORTER_MODULE)
    assert (exporter.CONTROL_KEY_ENV, exporter.CONTROL_HEADER) == (control_key.ENV, control_key.HEADER)
    sent = {}

    class Answer:
        status = 200

        def __init__(self, body):
            self.body = body

        def read(self):
            return self.body

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def urlopen(request, timeout):
        sent[request.full_url.split("/v2/")[1]] = request.get_header(control_key.HEADER.capitalize())
        return Answer(b"[]" if "repository" in request.full_url else b'{"model_stats": []}')

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setenv(control_key.ENV, "exporter-key-0")
    collector = exporter.BatchStatsCollector("127.0.0.1:5")
    collector.fetch_stats(), collector.fetch_index()
    assert sent == {"models/stats": None, "repository/index": "exporter-key-0"}
    # LocalExporter hands it the key of a server this process started, in its environment
    monkeypatch.delenv(control_key.ENV)
    control_key.register(["127.0.0.1:5"], "registered-key-0")
    try:
        local = LocalExporter("http://127.0.0.1:5")
        assert local._env()[control_key.ENV] == "registered-key-0"
        assert control_key.ENV not in LocalExporter("127.0.0.1:6")._env()
    finally:
        control_key.forget(["127.0.0.1:5"])
