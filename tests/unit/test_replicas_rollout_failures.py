"""A rollout whose new version cannot load is not retried on every poll (each retry took a replica
out of rotation), and ``clean`` removes the log folders of killed ``replicas`` sessions only."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from builder.core.errors import ServerError
from builder.scaleout import replicas as replicas_module
from builder.scaleout.replicas import ReplicaSet


class _Replica:
    """Serves version 1; loading fails as Triton's load API does for a version without its model file."""

    log_path = "replica.log"
    pid = 1

    def __init__(self):
        self.loads = 0

    def is_running(self):
        return True

    @contextlib.contextmanager
    def triton(self):
        class _Client:
            def model_config(self, model):
                return {"name": model}
        yield _Client()

    def repository_index(self):
        return [{"name": "m", "version": "1", "state": "READY"}]

    def load_model(self, model, timeout=120.0):
        self.loads += 1
        raise ServerError(f"tritonserver could not load model '{model}': model.onnx not found")


def test_a_version_that_fails_to_load_is_not_retried_until_something_new_is_published(tmp_path, monkeypatch):
    group = ReplicaSet(tmp_path, replicas=2, prometheus=False, log_dir=tmp_path / "logs")
    group.replicas = [_Replica(), _Replica()]
    target = [[2]]
    monkeypatch.setattr(replicas_module, "target_versions", lambda repository, model: target[0])
    monkeypatch.setattr(ReplicaSet, "models", property(lambda self: ["m"]))
    with pytest.raises(ServerError, match="could not load model 'm'"):
        group.roll_out_pending()
    assert group.failed_targets == {"m": [2]}
    assert group.roll_out_pending() == []  # the next poll leaves it alone
    assert [r.loads for r in group.replicas] == [1, 0]
    target[0] = [3]  # a fixed version was published: tried again
    with pytest.raises(ServerError, match="could not load"):
        group.roll_out_pending()
    assert group.replicas[0].loads == 2


def test_clean_removes_the_log_folder_of_a_killed_replicas_session_never_a_live_one(tmp_path, monkeypatch, capsys):
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    from builder import cli
    from builder.scaleout.replicas import REPLICAS_PREFIX

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "repo").mkdir()
    # a session SIGKILLed: no clean-up ran, its folder (and the replica logs in it) stays
    child = subprocess.Popen([sys.executable, "-c", "import sys, tempfile, time; tempfile.tempdir = sys.argv[1]\n"
                              "from builder.scaleout.replicas import ReplicaSet\n"
                              "group = ReplicaSet(sys.argv[1] + '/repo', prometheus=False)\n"
                              "(group.log_dir / 'replica-0.log').write_text('x'); print(group.log_dir, flush=True)\n"
                              "time.sleep(60)", str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[2])
    try:
        killed = child.stdout.readline().strip()
        live = ReplicaSet(tmp_path / "repo", prometheus=False)  # this process's: in use
        assert cli.main(["clean"]) == 0  # while the session lives, its folder stays
        assert os.path.isdir(killed) and "nothing to clean" in capsys.readouterr().out
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert cli.main(["clean"]) == 0
    out = capsys.readouterr().out
    assert f"removed {killed}" in out and not os.path.exists(killed)
    assert f"removed 1 log folder(s) of ended replicas sessions (in {tmp_path})" in out  # not "left by dead builds"
    assert live.log_dir.is_dir() and live.log_dir.name.startswith(REPLICAS_PREFIX)
    assert live.stop() is None and not live.log_dir.exists()  # nothing failed: removed at stop
