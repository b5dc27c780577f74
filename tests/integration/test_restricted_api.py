"""Restricted control APIs on the real embedded tritonserver (builder/serving/control_key.py): model
control, the repository index, shared memory, logging and trace answer only requests with the server's
key; inference, health, metadata, statistics and model-config stay open; our own clients send the key
(in-process by the server's address, in another process from $TRITON_BUILDER_CONTROL_KEY); the key
never reaches the log; nginx in front passes the header through."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from builder.serving import control_key
from builder.serving.client import TritonClient, TritonError
from builder.serving.embedded import EmbeddedServer
from tests.integration.python_models import python_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "add_one"
REFUSED_HTTP = f"This API is restricted, expecting header '{control_key.HEADER}'"
REFUSED_GRPC = f"This protocol is restricted, expecting header '{control_key.GRPC_HEADER}'"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("restricted") / "repo"
    python_model(repo, MODEL)
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(control_key.ENV, raising=False)  # the random key of each start
        with EmbeddedServer(repo, ready_timeout=90) as served:
            yield served


def _post(url: str, path: str, headers: dict | None = None, body: dict | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{url}{path}", data=json.dumps(body or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _get(url: str, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{url}{path}", timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


def test_http_control_needs_the_key_and_the_rest_stays_open(server):
    key = server.control_key
    assert key and len(key) >= 32
    assert _post(server.http_url, f"/v2/repository/models/{MODEL}/unload") == (403, json.dumps(
        {"error": REFUSED_HTTP}, separators=(",", ":")))
    assert _post(server.http_url, "/v2/repository/index", {control_key.HEADER: "not-the-key"})[0] == 403
    for path in ("/v2/logging", "/v2/trace/setting", "/v2/systemsharedmemory/status"):
        assert _get(server.http_url, path) == 403, path
    for path in ("/v2/health/live", "/v2/health/ready", "/v2", f"/v2/models/{MODEL}", f"/v2/models/{MODEL}/config",
                 f"/v2/models/{MODEL}/stats"):
        assert _get(server.http_url, path) == 200, path
    assert server.model_ready(MODEL)  # the refusals changed nothing
    status, _ = _post(server.http_url, f"/v2/repository/models/{MODEL}/unload", {control_key.HEADER: key})
    assert status == 200
    assert not server.model_ready(MODEL)
    server.load_model(MODEL)  # our own EmbeddedServer methods send the key
    assert server.model_ready(MODEL)


def test_grpc_control_needs_the_key_and_inference_stays_open(server, monkeypatch):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    raw = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as refused:
            raw.unload_model(MODEL)
        assert REFUSED_GRPC in str(refused.value)
        x = np.ones((1, 4), np.float32)
        request = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        request.set_data_from_numpy(x)
        assert (raw.infer(MODEL, [request]).as_numpy("OUTPUT0") == x + 1).all()  # no key needed
        assert raw.is_server_live() and raw.get_model_metadata(MODEL).name == MODEL
        raw.unload_model(MODEL, headers={control_key.GRPC_HEADER: server.control_key})
    finally:
        raw.close()
    # our client: the key of the server this process started at that address, over gRPC too
    with TritonClient(server.grpc_url, "grpc") as client:
        assert client.model_state(MODEL)[0] != "READY"
        client.load_model(MODEL)
        client.wait_for_model(MODEL)
    # a client of a server started elsewhere: no key known (the variable unset) is refused, named, not "down"
    control_key.forget([server.grpc_url])
    monkeypatch.delenv(control_key.ENV, raising=False)
    try:
        with TritonClient(server.grpc_url, "grpc") as client, pytest.raises(TritonError) as err:
            client.unload_model(MODEL)
        assert not err.value.unreachable
        assert REFUSED_GRPC in str(err.value) and f"set ${control_key.ENV}" in str(err.value)
        monkeypatch.setenv(control_key.ENV, server.control_key)  # what `tune --url` in another shell reads
        with TritonClient(server.grpc_url, "grpc") as client:
            assert client.repository_index()
    finally:
        control_key.register([server.grpc_url], server.control_key)
    assert server.model_ready(MODEL)


def test_the_key_is_in_no_log(server):
    log = server.read_log(0)
    assert "--http-restricted-api=model-repository,shared-memory,logging,trace:triton-builder-control-key=***" in log
    assert server.control_key not in log


def test_nginx_passes_the_key_through(server):
    from builder.scaleout.balancer import NginxBalancer, find_nginx

    try:
        find_nginx()
    except Exception as err:  # noqa: BLE001
        pytest.skip(str(err))
    with NginxBalancer([server.http_url], [server.grpc_url]) as lb:
        assert _post(lb.http_url, "/v2/repository/index")[0] == 403
        status, body = _post(lb.http_url, "/v2/repository/index", {control_key.HEADER: server.control_key})
        assert status == 200 and MODEL in body
        with TritonClient(lb.grpc_url, "grpc", control_key=server.control_key) as client:
            assert [e["name"] for e in client.repository_index()] == [MODEL]
        with TritonClient(lb.grpc_url, "grpc", control_key="wrong-key-0") as client, pytest.raises(TritonError):
            client.repository_index()


def test_the_exporter_reads_the_restricted_index_with_the_key(server):
    """monitoring/exporter.py as a subprocess: LocalExporter hands it this server's key in its environment."""
    from builder.monitoring.local_exporter import LocalExporter

    with LocalExporter(server.http_url) as exporter:
        with urllib.request.urlopen(exporter.metrics_url, timeout=30) as answer:
            text = answer.read().decode()
    assert "triton_builder_exporter_up 1.0" in text, text
    assert f'triton_builder_model_ready{{model="{MODEL}",version="1"}} 1.0' in text, text
