"""Rollouts and rollbacks under load on the real embedded tritonserver (issue 36; the long form is
benchmarks/rollouts.py): new versions published (`tune --publish`'s republish) and a `rollback` land while clients
send requests, and no request fails; the responses' model_version shows which version answered, the older one
after the rollback. Poll mode switches by itself; explicit mode with a load of the model (Triton loads the new
version, then unloads the old)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from builder.repository.republish import publish_tuned
from builder.repository.rollback import rollback_model
from builder.serving.embedded import EmbeddedServer
from builder.tuning.steady import SteadyLoad, Switch, summarise
from tests.tiny_models import write_model

pytestmark = [pytest.mark.integration, pytest.mark.slow(reason="builds a model and serves it under load")]


def _rollout(repo, name: str) -> str:
    text = (repo / name / "config.pbtxt").read_text()
    return str(publish_tuned(repo, name, text, {"rollout": "test"})["version"])


@pytest.mark.parametrize("mode", ["poll", "explicit"])
def test_two_rollouts_and_a_rollback_under_load_drop_nothing(tmp_path, quiet, mode):
    from builder.pipeline import build

    repo = tmp_path / "repo"
    build(write_model(tmp_path, "embed", variants=["onnx"]), repo, benchmark_seconds=0, progress=quiet)
    ids = np.arange(5, dtype=np.int64).reshape(1, 5)
    extra = ["--repository-poll-secs=1"] if mode == "poll" else []
    with EmbeddedServer(repo, model_control=mode, extra_args=extra, ready_timeout=90) as server:
        switches = []
        with SteadyLoad(server.grpc_url, "grpc", "embed", [{"ids": ids}], concurrency=4, pause_s=0.005) as load:
            time.sleep(1)
            for kind in ("rollout", "rollout", "rollback"):
                began = time.time()
                target = _rollout(repo, "embed") if kind == "rollout" else str(rollback_model(repo, "embed").to_version)
                if mode == "explicit":
                    server.load_model("embed")
                ended = load.wait_for_version(target, timeout=20, since=began)
                switches.append(Switch(kind, began, ended, target))
                assert ended is not None, f"{kind} to version {target} never answered ({mode} mode)"
            time.sleep(1)
        summary = summarise(load.records, switches)
    assert summary.failed == 0, summary.lines()
    assert [s.target for s in switches] == ["2", "3", "2"]
    assert load.records[-1].version == "2"  # the rollback: the older version answers, by its model_version
    answered = {r.version for r in load.records}
    assert answered == {"1", "2", "3"}, answered


def test_poll_mode_leaves_a_monitored_model_alone_and_rolls_out_its_step_under_load(tmp_path, quiet):
    """The python monitor step's bytecode is written before a poll-mode start (builder/serving/startup.py
    precompile_bytecode): the stub no longer writes it while the step loads, which changed the version folder and
    made the poll reload the step in place under traffic (Triton 2.51 aborted: malloc(): unaligned fastbin chunk)."""
    from builder.pipeline import build

    repo = tmp_path / "repo"
    build(write_model(tmp_path, "embed", variants=["onnx"], deploy={"monitor": True}), repo, benchmark_seconds=0,
          progress=quiet)
    ids = np.arange(5, dtype=np.int64).reshape(1, 5)
    with EmbeddedServer(repo, model_control="poll", extra_args=["--repository-poll-secs=1"], ready_timeout=90) as server:
        with SteadyLoad(server.grpc_url, "grpc", "embed", [{"ids": ids}], concurrency=2, pause_s=0.005) as load:
            time.sleep(4)  # four polls
            assert server.read_log().count('"loading: embed__monitor:1"') == 1, server.log_tail(30)
            began = time.time()
            target = _rollout(repo, "embed__model")
            deadline = time.time() + 20
            with server.triton() as client:
                while not client.model_ready("embed__model", target) and time.time() < deadline:
                    time.sleep(0.2)
                assert client.model_ready("embed__model", target), server.log_tail(30)
            time.sleep(2)
        summary = summarise(load.records, [Switch("rollout", began, time.time(), target)])
        assert server.is_running(), server.log_tail(30)
    assert summary.failed == 0 and summary.requests > 100, summary.lines()
