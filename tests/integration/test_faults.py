"""Fault injection: builds SIGKILLed at seeded random moments, concurrent builds into one repository,
a Triton restarted under the same repository. (A full disk during publish: tests/unit/test_scratch.py;
a server killed under load: tests/integration/test_loadtest.py.) benchmarks/fault_kills.py runs the
kill trial 50+ times and prints the figures."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.repository.layout import existing_versions
from builder.repository.validate import validate_model
from builder.core.scratch import WORK_PREFIX, staging_prefix
from builder.serving.check import check_served
from builder.serving.embedded import EmbeddedServer
from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def _build(spec: Path, repo: Path, tmp: Path) -> subprocess.Popen:
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "builder", "build", str(spec), "--repository", str(repo),
                             "--variants", "onnx", "--benchmark-seconds", "0", "-q"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _leftovers(repo: Path, tmp: Path) -> list[str]:
    work = [p.name for p in tmp.iterdir() if p.name.startswith(WORK_PREFIX)]
    staging = [p.name for p in repo.parent.iterdir() if p.name.startswith(staging_prefix(repo))]
    return work + staging


def _assert_whole(repo: Path, name: str = "digits_cnn") -> list[int]:
    """Every version present is complete and verifies; the numbers have no gaps; config is there."""
    versions = existing_versions(repo / name)
    assert versions == list(range(1, len(versions) + 1)), versions
    if versions:
        assert (repo / name / "config.pbtxt").is_file(), "a version without its model's config.pbtxt"
        for version in versions:
            report = validate_model(repo / name, version)
            assert report.ok, report.lines()
    return versions


@pytest.fixture
def scratch(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return tmp


def test_builds_killed_at_random_moments_leave_no_partial_version_and_no_leak(digits_copy, tmp_path, scratch):
    rng = random.Random(20261123)  # seeded: a red run can be replayed
    repo = tmp_path / "model_repository"
    # Kill moments are fractions of a build timed on this host, so a fast host kills as often as a slow one.
    started = time.monotonic()
    timed = _build(digits_copy / "spec.yaml", repo, scratch)
    out, _ = timed.communicate(timeout=300)
    assert timed.returncode == 0, out
    build_seconds = time.monotonic() - started
    killed_at = []
    for _ in range(6):
        proc = _build(digits_copy / "spec.yaml", repo, scratch)
        delay = rng.uniform(0.05, 0.9) * build_seconds  # import, load, export, verify, publish
        try:
            proc.wait(delay)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            killed_at.append(round(delay, 2))
        _assert_whole(repo)
        if len(killed_at) == 3:
            break
    assert killed_at, f"no trial was killed: every build finished before its delay (a build took {build_seconds:.1f} s)"
    before = _assert_whole(repo)
    done = _build(digits_copy / "spec.yaml", repo, scratch)
    out, _ = done.communicate(timeout=300)
    assert done.returncode == 0, out
    assert _assert_whole(repo) == before + [len(before) + 1]  # the next number, whatever was killed
    assert _leftovers(repo, scratch) == [], f"left behind by builds killed at {killed_at} s"


def test_concurrent_builds_get_distinct_versions(digits_copy, tmp_path, scratch):
    repo = tmp_path / "model_repository"
    builds = [_build(digits_copy / "spec.yaml", repo, scratch) for _ in range(2)]
    outputs = [b.communicate(timeout=300)[0] for b in builds]
    assert [b.returncode for b in builds] == [0, 0], outputs
    assert _assert_whole(repo) == [1, 2]
    assert sorted(o.split("published digits_cnn version ")[1].split()[0] for o in outputs) == ["1", "2"]
    assert _leftovers(repo, scratch) == []


def test_check_passes_again_after_triton_restarts(built_repository):
    for attempt in range(2):
        with EmbeddedServer(built_repository, ready_timeout=90) as server:
            report = check_served("digits_cnn", repository=built_repository, url=server.http_url,
                                  grpc_url=server.grpc_url, protocol="both")
            assert report.ok, (attempt, report.lines())
        time.sleep(0.2)
