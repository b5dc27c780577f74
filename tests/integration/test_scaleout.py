"""Scale-out end to end: digits_cnn published to object storage, two embedded Triton replicas loading
it from there behind nginx (HTTP and gRPC), Prometheus scraping both, distributed Locust (a master
and two workers) driving the balancer; then a new version published under load and rolled out
replica by replica behind the served check, and one replica killed under load.

The object store is moto's S3 server on a free 127.0.0.1 port (builder.storage.moto_s3), the
stand-in for S3/MinIO: no MinIO is installable on these machines. Its credentials are throwaway
values set here for this module only.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from builder.core.files import sha256_file
from builder.repository.layout import publish_version
from builder.repository.metadata import read_metadata, read_reference, write_metadata, write_reference
from builder.storage.s3 import publish_repository
from builder.storage.served import check_served_at
from tests.conftest import require, run_cli

pytestmark = pytest.mark.integration

MODEL = "digits_cnn"
USERS = 8
WORKERS = 2


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _require(available: bool, what: str) -> None:
    if available:
        return
    message = f"{what} is not installed: run `make setup` (scripts/install-system-deps.sh and the dev extra)"
    if _in_ci():
        pytest.fail(message + " -- CI is set, so this is a failure")
    pytest.skip(message)


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="module")
def aws_env():
    with pytest.MonkeyPatch.context() as patch:
        for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            patch.delenv(key, raising=False)
        patch.setenv("AWS_ACCESS_KEY_ID", "scaleout-test-key")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "scaleout-test-secret")
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        yield


@pytest.fixture(scope="module")
def source(built_repository, tmp_path_factory) -> Path:
    """A writable copy of digits_cnn (version 1) to publish from; tests add version 2 to it."""
    repo = tmp_path_factory.mktemp("scaleout") / "model_repository"
    shutil.copytree(built_repository / MODEL, repo / MODEL,
                    ignore=shutil.ignore_patterns("__pycache__", ".triton-builder.lock"))
    return repo


@pytest.fixture(scope="module")
def group(aws_env, source, tmp_path_factory):
    require("moto", "dev")
    require("boto3", "s3")
    from builder.scaleout.balancer import find_nginx
    from builder.storage.moto_s3 import MotoS3Server
    from builder.scaleout.replicas import ReplicaSet

    try:
        find_nginx()
        nginx = True
    except Exception:  # noqa: BLE001
        nginx = False
    _require(nginx, "nginx")
    _require(shutil.which("prometheus") is not None, "prometheus")

    started = time.monotonic()
    with MotoS3Server() as s3:
        s3.create_bucket("models")
        url = s3.repository_url("models", "prod")
        published = publish_repository(source, url)
        assert [(p.model, p.version, p.status) for p in published] == [(MODEL, 1, "published")]
        replicas = ReplicaSet(url, replicas=2, load_models=[MODEL], prometheus=True,
                              log_dir=tmp_path_factory.mktemp("replica-logs"))
        replicas.url = url
        replicas.s3 = s3
        try:
            replicas.start()
            print(f"moto + publish + 2 replicas + nginx + prometheus up in {time.monotonic() - started:.1f} s")
            yield replicas
        finally:
            pids = [r.pid for r in replicas.replicas] + [replicas.balancer.pid if replicas.balancer else None,
                                                         replicas.prometheus.pid if replicas.prometheus else None]
            replicas.stop()
            s3.stop()
            left = [pid for pid in pids + [s3.pid] if _alive(pid)]
            assert not left, f"processes left running: {left}"


def _payload(source: Path, version: int = 1) -> Path:
    return source / MODEL / str(version) / "reference.npz"


class _Load:
    """run_loadtest (distributed: 1 master + WORKERS workers) in a thread, against the balancer."""

    def __init__(self, group, source: Path, seconds: float, out: Path):
        from builder.tuning.loadtest import run_loadtest

        self.summary = None
        self.error = None
        self._base = sum(group.balancer.upstream_counts().values())

        def run():
            try:
                self.summary = run_loadtest(MODEL, group.http_url, "http", users=USERS, run_time_s=seconds,
                                            out_dir=out, payload=_payload(source), workers=WORKERS,
                                            timeout_s=seconds + 60)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def wait_started(self, group, timeout: float = 40.0) -> None:
        """Until the balancer has passed on a few requests (Locust's start-up takes a while)."""
        deadline = time.monotonic() + timeout
        while sum(group.balancer.upstream_counts().values()) < self._base + 50:
            assert self.thread.is_alive() or self.summary, f"load test ended early: {self.error}"
            assert time.monotonic() < deadline, "the load never reached the balancer"
            time.sleep(0.2)

    def result(self, timeout: float = 120.0) -> dict:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the load test thread did not finish"
        if self.error is not None:
            raise self.error
        return self.summary


def test_two_replicas_from_object_storage_share_distributed_load(group, source, tmp_path):
    from builder.tuning.loadtest import format_summary, run_loadtest

    assert group.models == [MODEL] and len(group.alive()) == 2
    before = group.request_counts(MODEL)
    summary = run_loadtest(MODEL, group.http_url, "http", users=USERS, run_time_s=6, out_dir=tmp_path / "load",
                           payload=_payload(source), workers=WORKERS, timeout_s=90)
    line = format_summary(summary)
    print(line)
    assert summary["workers"] == WORKERS and not summary["timed_out"]
    assert summary["requests"] > 100 and summary["failures"] == 0, line
    # the statistics came through nginx from one replica (or two, before and after): not the server's figures
    assert summary["counts_match"] or "; server: " not in line, line
    after = group.request_counts(MODEL)
    served = {i: after[i] - before[i] for i in after}
    print("requests per replica (statistics API):", served)
    assert all(n > 0.2 * sum(served.values()) for n in served.values()), served

    # gRPC through nginx (grpc_pass over HTTP/2) reaches both replicas too
    before = group.request_counts(MODEL)
    client = grpcclient.InferenceServerClient(group.grpc_url)
    image = np.zeros((1, 1, 8, 8), np.float32)
    for _ in range(20):
        item = grpcclient.InferInput("image", [1, 1, 8, 8], "FP32")
        item.set_data_from_numpy(image)
        assert client.infer(MODEL, [item]).as_numpy("logits").shape == (1, 10)
    client.close()
    after = group.request_counts(MODEL)
    assert all(after[i] > before[i] for i in after), (before, after)

    # the served check through the balancer, both protocols, reference files read from the bucket
    report = check_served_at(MODEL, group.url, url=group.http_url, grpc_url=group.grpc_url)
    assert report.ok, report.lines()

    # Prometheus scrapes every replica
    targets = group.prometheus.wait_for_targets(30)
    assert sorted(t["scrapeUrl"] for t in targets) == sorted(r.metrics_url for r in group.replicas)
    def both_replicas():
        series = group.prometheus.query(f'nv_inference_request_success{{job="triton",model="{MODEL}"}} > 0')
        return series if len({s["metric"]["instance"] for s in series}) == 2 else None

    group.prometheus.wait_for(both_replicas, timeout=30, what="request counters from both replicas")


def _add_version(source: Path, reference_shift: float = 0.0) -> int:
    """The next version of digits_cnn in the local source repository (the same model, as a new
    version); ``reference_shift`` moves its reference outputs, so the served check must fail on it."""
    folder = source / MODEL
    current = folder / "1"
    with publish_version(source, MODEL) as draft:
        for path in current.iterdir():
            if path.is_file():
                shutil.copy2(path, draft.folder / path.name)
        meta = read_metadata(draft.folder / "metadata.yaml")
        meta["version"] = draft.version
        if reference_shift:
            cases, outputs = read_reference(draft.folder / "reference.npz")
            write_reference(draft.folder / "reference.npz", cases,
                            [{k: v + reference_shift for k, v in out.items()} for out in outputs])
            # as a build would record it: reference.npz is in files_sha256 (publish checks it)
            meta["files_sha256"]["reference.npz"] = sha256_file(draft.folder / "reference.npz")
        write_metadata(draft.folder / "metadata.yaml", meta)
        draft.config_text = (folder / "config.pbtxt").read_text()
    return draft.version


def test_publishing_a_new_version_under_load_rolls_out_with_no_failed_request(group, source, tmp_path):
    from builder.tuning.loadtest import format_summary

    load = _Load(group, source, 16, tmp_path / "load")
    load.wait_started(group)

    assert _add_version(source) == 2
    published = publish_repository(source, group.url)
    assert [(p.version, p.status) for p in published] == [(1, "identical"), (2, "published")]
    assert group.pending_updates() == {MODEL: [2]}
    # nginx's requests to each replica while it loads and is checked: none (it is out of rotation)
    through_nginx: dict[int, list[int]] = {0: [], 1: []}

    def progress(message: str) -> None:
        print(message)
        index = int(message.split(":", 1)[0].removeprefix("replica "))
        through_nginx[index].append(group.balancer.upstream_counts().get(group.replicas[index].http_url, 0))

    steps = group.roll_out(MODEL, progress=progress)
    assert [(s.replica, s.status, s.versions_after) for s in steps] == [(0, "updated", [2]), (1, "updated", [2])]
    # at "loading" and at the step's line, both said while the replica was out of rotation
    assert all(len(counts) == 2 and counts[0] == counts[1] for counts in through_nginx.values()), through_nginx
    assert all(s.check_lines[0] == f"{MODEL} version 2: OK (3 cases per protocol)" for s in steps), steps
    assert group.pending_updates() == {}

    summary = load.result()
    print(format_summary(summary))
    assert not summary["timed_out"] and summary["requests"] > 100
    assert summary["failures"] == 0, f"requests failed during the rollout: {summary['client'].get('errors')}"
    for index in (0, 1):
        assert group.ready_versions(index, MODEL) == [2]
        assert group.statistics(index, MODEL).get(2, 0) > 0, f"replica {index} served no request on version 2"
        replica = group.replicas[index]
        result = run_cli("check", MODEL, "--repository", group.url, "--url", replica.http_url,
                         "--grpc-url", replica.grpc_url, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"{MODEL} version 2: OK" in result.stdout


def test_a_version_that_fails_the_check_is_rolled_back_and_stops_the_rollout(group, source):
    from builder.scaleout.replicas import RolloutError

    assert _add_version(source, reference_shift=1.0) == 3
    publish_repository(source, group.url)
    assert group.pending_updates() == {MODEL: [3]}
    with pytest.raises(RolloutError) as err:
        group.roll_out(MODEL)
    message = str(err.value)
    assert "rollout of digits_cnn version 3 stopped at replica 0: the served check failed" in message
    assert "replica 0 is back on versions 2" in message and "http logits: rel L2" in message
    assert group.ready_versions(0, MODEL) == [2] and group.ready_versions(1, MODEL) == [2]
    assert group.statistics(1, MODEL).keys() == {2}  # replica 1 never loaded version 3
    assert group.roll_out_pending() == []  # the failed target is not retried until something new is published


def test_killing_a_replica_mid_load_keeps_the_other_serving(group, source, tmp_path):
    from builder.tuning.loadtest import format_summary

    load = _Load(group, source, 10, tmp_path / "load")
    load.wait_started(group)
    group.kill(1)
    assert group.alive() == [0]
    after_kill = group.statistics(0, MODEL).get(2, 0)

    summary = load.result()
    line = format_summary(summary)
    print(line)
    assert not summary["timed_out"] and summary["requests"] > 100
    failures = summary["client"]["failures"]
    assert isinstance(failures, int) and f"{failures} failures" in line  # counted and reported
    assert failures <= 0.02 * summary["requests"], line  # nginx retries the requests the dead replica dropped
    assert group.statistics(0, MODEL).get(2, 0) > after_kill + 100, "replica 0 stopped serving after the kill"

    report = check_served_at(MODEL, group.url, url=group.http_url, grpc_url=group.grpc_url, version=2)
    assert report.ok, report.lines()
