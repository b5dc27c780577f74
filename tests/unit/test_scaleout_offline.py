"""Scale-out without servers: s3:// URLs, publishing to object storage (never overwriting, a version
visible only once complete), the marker logic `serve` honours, nginx's config, and the Kubernetes
manifests rendered and validated offline.

S3 here is moto's in-process mock (``moto.mock_aws``), the stand-in for S3/MinIO: nothing listens on
a port. The credentials are throwaway values set by each test.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from builder.core.errors import UserInputError
from builder.repository.layout import publish_version
from builder.storage.s3 import (MARKER, S3Store, parse_s3_url, pin_versions, policy_versions,
                                       publish_repository)
from tests.conftest import run_cli

URL = "s3://models/prod"  # AWS form: moto's mock answers for AWS's endpoint, nothing goes out

CONFIG = """name: "m"
backend: "python"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 4 ] }
version_policy: { latest { num_versions: 1 } }
"""


@pytest.fixture
def s3(aws_mock):
    store = S3Store(URL)
    store.client.create_bucket(Bucket="models")
    return store


def _add_version(repo: Path, body: str = "weights-1") -> int:
    """A small, valid version (files + metadata.yaml with their sha256) through the atomic local publish."""
    with publish_version(repo, "m") as draft:
        (draft.folder / "model.py").write_text("# python backend model\n")
        (draft.folder / "model.onnx").write_text(body)
        hashes = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in draft.folder.iterdir()}
        (draft.folder / "metadata.yaml").write_text(yaml.safe_dump({"model_name": "m", "version": draft.version,
                                                                    "files_sha256": hashes}))
        (draft.folder / "__pycache__").mkdir()
        (draft.folder / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"junk")
        draft.config_text = CONFIG
    return draft.version


def _keys(store: S3Store) -> dict[str, str]:
    listing = store.client.list_objects_v2(Bucket="models", Prefix="prod/")
    return {o["Key"]: o["ETag"] for o in listing.get("Contents", [])}


# --------------------------------------------------------------------------------------------
# URLs


@pytest.mark.parametrize("url, bucket, prefix, endpoint", [
    ("s3://models/prod", "models", "prod", None),
    ("s3://models/a/b/", "models", "a/b", None),
    ("s3://127.0.0.1:9000/models/prod", "models", "prod", "http://127.0.0.1:9000"),
    ("s3://http://minio.local:9000/models/prod", "models", "prod", "http://minio.local:9000"),
    ("s3://https://minio.local:9443/my.bucket/x_y-z", "my.bucket", "x_y-z", "https://minio.local:9443"),
])
def test_s3_urls_parse(url, bucket, prefix, endpoint):
    location = parse_s3_url(url, "--to")
    assert (location.bucket, location.prefix, location.endpoint) == (bucket, prefix, endpoint)
    assert parse_s3_url(location.url) == location


@pytest.mark.parametrize("url, why", [
    ("models/prod", "not an s3:// URL"),
    ("https://models/prod", "not an s3:// URL"),
    ("s3://", "bucket name is missing"),
    ("s3://models", "PREFIX inside bucket 'models' is required"),
    ("s3://models/", "PREFIX inside bucket 'models' is required"),
    ("s3://Models_Upper/prod", "not a valid bucket name"),
    ("s3://127.0.0.1:99999/models/prod", "port '99999'"),
    ("s3://127.0.0.1:http/models/prod", "port 'http'"),
    ("s3://:9000/models/prod", "not HOST:PORT"),
    ("s3://models/pro d", "spaces are not allowed"),
    ("s3://models/prod?versionId=1", "query strings"),
    ("s3://models/a//b", "empty path segment"),
    ("s3://models/../etc", "prefix segment '..'"),
    ("s3://key:secret@127.0.0.1:9000/models/prod", "credentials never go in the URL"),
])
def test_bad_s3_urls_are_refused_with_the_fix(url, why):
    with pytest.raises(UserInputError) as err:
        parse_s3_url(url, "--to")
    message = str(err.value)
    assert why in message and "--to" in message
    if "credentials" not in why:
        assert "s3://HOST:PORT/BUCKET/PREFIX" in message  # says what to write instead


def test_triton_url_follows_the_endpoint(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    assert parse_s3_url("s3://models/prod").triton_url() == "s3://models/prod"
    assert parse_s3_url("s3://127.0.0.1:9000/models/prod").triton_url() == "s3://http://127.0.0.1:9000/models/prod"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://minio.example:9443/")
    assert parse_s3_url("s3://models/prod").triton_url() == "s3://https://minio.example:9443/models/prod"
    assert parse_s3_url("s3://models/prod").triton_url(from_env=False) == "s3://models/prod"


def test_cli_refuses_bad_urls_with_exit_code_2(tmp_path):
    result = run_cli("publish", "--repository", str(tmp_path), "--to", "s3://bucket-only")
    assert result.returncode == 2
    assert "--to 's3://bucket-only'" in result.stderr and "PREFIX" in result.stderr
    result = run_cli("serve", "--repository", "s3://127.0.0.1:notaport/models/prod")
    assert result.returncode == 2 and "port 'notaport'" in result.stderr


def test_embedded_server_refuses_a_bad_url_before_starting_anything():
    from builder.serving.embedded import EmbeddedServer

    with pytest.raises(UserInputError, match="repository 's3://models'"):
        EmbeddedServer("s3://models")


# --------------------------------------------------------------------------------------------
# Version policy: the config is the switch


def test_policy_versions_and_pinning():
    assert policy_versions(CONFIG, [1, 2, 3]) == [3]
    latest2 = CONFIG.replace("num_versions: 1", "num_versions: 2")
    assert policy_versions(latest2, [1, 2, 3]) == [2, 3]
    assert policy_versions(CONFIG.replace("latest { num_versions: 1 }", "all { }"), [1, 3]) == [1, 3]
    no_policy = "\n".join(line for line in CONFIG.splitlines() if "version_policy" not in line)
    assert policy_versions(no_policy, [1, 2]) == [2]  # Triton's default: latest 1
    pinned = pin_versions(CONFIG, [3, 2])
    assert "specific" in pinned and policy_versions(pinned, [1, 2, 3, 4]) == [2, 3]
    assert 'backend: "python"' in pinned and "max_batch_size: 8" in pinned
    with pytest.raises(UserInputError, match="no complete version"):
        pin_versions(CONFIG, [])


# --------------------------------------------------------------------------------------------
# Publishing


def test_publish_uploads_verifies_marks_and_writes_config_last(s3, tmp_path):
    repo = tmp_path / "repo"
    _add_version(repo)
    order = []
    real_put = s3.client.put_object

    def recording_put(**kwargs):
        order.append(kwargs["Key"])
        return real_put(**kwargs)

    s3.client.put_object = recording_put
    results = publish_repository(repo, URL, client=s3.client)
    assert [(r.model, r.version, r.status) for r in results] == [("m", 1, "published")]
    assert order[-1] == "prod/m/config.pbtxt" and order[-2] == f"prod/m/1/{MARKER}"
    assert not any("__pycache__" in key for key in order)
    marker = s3.read_marker("m", 1)
    assert set(marker["files"]) == {"model.py", "model.onnx", "metadata.yaml"}
    local = repo / "m" / "1" / "model.onnx"
    assert marker["files"]["model.onnx"]["sha256"] == hashlib.sha256(local.read_bytes()).hexdigest()
    assert s3.version_state("m", 1) == "complete" and s3.complete_versions("m") == [1]
    assert policy_versions(s3.config_text("m"), [1, 2, 3]) == [1]  # pinned to what is complete
    assert "config.pbtxt now serves versions 1" in results[0].line()


def test_publish_never_overwrites_a_version(s3, tmp_path):
    repo = tmp_path / "repo"
    _add_version(repo)
    publish_repository(repo, URL, client=s3.client)
    before = _keys(s3)

    again = publish_repository(repo, URL, client=s3.client)  # same files: a no-op
    assert [r.status for r in again] == ["identical"] and "nothing written" in again[0].line()
    assert _keys(s3) == before

    # the same version number rebuilt with other weights (metadata updated to match)
    folder = repo / "m" / "1"
    (folder / "model.onnx").write_text("weights-rebuilt")
    meta = yaml.safe_load((folder / "metadata.yaml").read_text())
    meta["files_sha256"]["model.onnx"] = hashlib.sha256(b"weights-rebuilt").hexdigest()
    (folder / "metadata.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(UserInputError) as err:
        publish_repository(repo, URL, client=s3.client)
    message = str(err.value)
    assert "version 1 of model 'm' already exists at s3://models/prod/m/1" in message
    assert "model.onnx" in message and "never overwritten" in message and "build a new version" in message
    assert _keys(s3) == before


def test_publish_refuses_local_files_that_differ_from_metadata(s3, tmp_path):
    repo = tmp_path / "repo"
    _add_version(repo)
    (repo / "m" / "1" / "model.onnx").write_text("tampered")
    with pytest.raises(UserInputError, match=r"model.onnx: sha256 differs from metadata.yaml"):
        publish_repository(repo, URL, client=s3.client)
    assert _keys(s3) == {}  # refused before any upload


def test_publish_argument_errors(s3, tmp_path):
    repo = tmp_path / "repo"
    _add_version(repo)
    with pytest.raises(UserInputError, match=r"--version 7: model 'm' has no version 7"):
        publish_repository(repo, URL, version=7, client=s3.client)
    with pytest.raises(UserInputError, match=r"--model other: not a model"):
        publish_repository(repo, URL, models=["other"], client=s3.client)
    with pytest.raises(UserInputError, match=r"--repository .*: not a directory"):
        publish_repository(tmp_path / "missing", URL, client=s3.client)
    with pytest.raises(UserInputError, match=r"bucket 'absent' does not exist"):
        publish_repository(repo, "s3://absent/prod", client=s3.client)


def test_a_half_uploaded_version_is_invisible_to_serve(s3, tmp_path):
    from builder.storage.served import inspect_repository

    repo = tmp_path / "repo"
    _add_version(repo)
    publish_repository(repo, URL, client=s3.client)
    assert _add_version(repo, "weights-2") == 2

    # the upload of version 2 dies after its first file (network gone, process killed ...)
    calls = []
    real_put_file = S3Store.put_file

    def dying_put_file(self, path, sha256, *parts):
        if calls:
            raise ConnectionError("connection reset during upload")
        calls.append(parts)
        return real_put_file(self, path, sha256, *parts)

    S3Store.put_file = dying_put_file
    try:
        with pytest.raises(ConnectionError):
            publish_repository(repo, URL, client=s3.client)
    finally:
        S3Store.put_file = real_put_file

    assert s3.version_state("m", 2) == "incomplete"  # a file is there, no marker
    assert s3.complete_versions("m") == [1]
    assert policy_versions(s3.config_text("m"), s3.version_dirs("m")) == [1]  # Triton still loads only v1
    names, left_out, versions = inspect_repository(URL, client=s3.client)
    assert names == ["m"] and left_out == {} and versions == {"m": [1]}

    # publishing again does not build on (or overwrite) the debris: it says what to do
    with pytest.raises(UserInputError) as err:
        publish_repository(repo, URL, client=s3.client)
    assert "incomplete upload" in str(err.value) and "aws s3 rm --recursive s3://models/prod/m/2/" in str(
        err.value)

    # a config written by another tool that would make Triton load the incomplete version: left out
    s3.put_bytes(CONFIG.encode(), "m", "config.pbtxt")  # latest 1 -> version 2
    names, left_out, versions = inspect_repository(URL, client=s3.client)
    assert versions == {} and "version 2 named by its config has no valid .complete marker" in left_out["m"]


def test_a_marker_that_does_not_match_the_files_is_incomplete(s3, tmp_path):
    repo = tmp_path / "repo"
    _add_version(repo)
    publish_repository(repo, URL, client=s3.client)
    s3.put_bytes(b"cut", "m", 1, "model.onnx")  # a file replaced behind the marker's back
    assert s3.version_state("m", 1) == "incomplete" and s3.complete_versions("m") == []
    s3.put_bytes(b"not json", "m", 1, MARKER)
    assert s3.read_marker("m", 1) is None


def test_inspect_repository_leaves_out_what_the_embedded_server_cannot_run(s3, tmp_path):
    from builder.storage.served import inspect_repository

    repo = tmp_path / "repo"
    _add_version(repo)
    publish_repository(repo, URL, client=s3.client)
    plan = CONFIG.replace('name: "m"', 'name: "o"').replace('backend: "python"', 'platform: "tensorrt_plan"')
    s3.put_bytes(plan.encode(), "o", "config.pbtxt")
    names, left_out, versions = inspect_repository(URL, client=s3.client)
    assert names == ["m", "o"] and versions == {"m": [1]}
    assert "tensorrt" in left_out["o"] and "/tmp" not in left_out["o"]


def test_serve_warns_when_an_s3_repositorys_version_was_measured_on_another_host(s3, tmp_path):
    from builder.serving.serve import served_host_warnings

    built_on = {"cpu_model": "AMD EPYC 9B14", "isa_flags": ["avx2", "avx512_vnni", "avx512f"],
                "isa_class": "avx512_vnni", "usable_cores": 2}
    here = {"cpu_model": "AMD EPYC 7B13", "isa_flags": ["avx2"], "isa_class": "avx2", "usable_cores": 2}
    repo = tmp_path / "repo"
    _add_version(repo)
    with publish_version(repo, "m") as draft:  # version 2 (the one served) records where it was measured
        (draft.folder / "model.onnx").write_text("weights-2")
        hashes = {"model.onnx": hashlib.sha256(b"weights-2").hexdigest()}
        (draft.folder / "metadata.yaml").write_text(yaml.safe_dump({"model_name": "m", "version": draft.version,
                                                                    "files_sha256": hashes, "host": built_on}))
        draft.config_text = CONFIG
    publish_repository(repo, URL, client=s3.client)
    [line] = served_host_warnings(URL, ["m"], current_host=here)
    assert line.startswith("m: variants were measured on AMD EPYC 9B14 (avx512_vnni: avx2, avx512_vnni, avx512f); "
                           "this host is AMD EPYC 7B13 (avx2)")
    assert served_host_warnings(URL, ["m"], current_host=built_on) == []


# --------------------------------------------------------------------------------------------
# nginx config


def test_nginx_config_balances_http_and_grpc_on_loopback(tmp_path):
    from builder.scaleout.balancer import NginxBalancer, render_config

    text = render_config(tmp_path, ["127.0.0.1:1000", "127.0.0.1:2000"], ["127.0.0.1:1001", "127.0.0.1:2001"],
                         "127.0.0.1", 8080, 8081)
    assert "listen 127.0.0.1:8080;" in text and "listen 127.0.0.1:8081 http2;" in text
    assert "grpc_pass grpc://$pool;" in text and "proxy_pass http://$pool;" in text
    # a rolling update takes a replica out per request (a flag file), not by a reload that closes connections
    assert f'if (-f "{tmp_path}/out/1") {{ set $pool triton_http_without_1; }}' in text
    assert "upstream triton_grpc_without_0 {\n        server 127.0.0.1:2001 max_fails=1" in text
    for backend in ("127.0.0.1:1000", "127.0.0.1:2000", "127.0.0.1:1001", "127.0.0.1:2001"):
        assert f"server {backend} max_fails=1" in text
    assert "non_idempotent" in text
    with pytest.raises(UserInputError, match="http_backends"):
        NginxBalancer([], ["127.0.0.1:1"])
    with pytest.raises(UserInputError, match="not HOST:PORT"):
        NginxBalancer(["localhost"], ["127.0.0.1:1"])


def test_replica_set_argument_errors(tmp_path):
    from builder.scaleout.replicas import ReplicaSet, run_replicas

    with pytest.raises(UserInputError, match="--replicas 0: must be a whole number >= 1"):
        ReplicaSet(tmp_path, replicas=0)
    with pytest.raises(UserInputError, match="--repository .*: not a directory or an s3:// URL"):
        ReplicaSet(tmp_path / "missing", replicas=2)
    with pytest.raises(UserInputError, match="--repository 's3://models': .*PREFIX"):
        ReplicaSet("s3://models", replicas=2)
    with pytest.raises(UserInputError, match="--watch-seconds 0"):
        run_replicas(tmp_path, 2, watch_seconds=0)
