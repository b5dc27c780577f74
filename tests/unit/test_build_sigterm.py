"""SIGTERM of a CLI verb unwinds like Ctrl-C: a build's work folder is removed and one line says it
was stopped (exit 130); ``clean --repository R`` still cleans the temp dir when R was never created."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.core.scratch import LOCK_NAME, WORK_PREFIX

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow(reason="runs a build in a subprocess and signals it")
def test_sigterm_during_a_build_removes_its_work_folder_and_says_so(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    repo = tmp_path / "repo"
    proc = subprocess.Popen([sys.executable, "-m", "builder", "build", str(ROOT / "examples" / "digits" / "spec.yaml"),
                             "--repository", str(repo), "--benchmark-seconds", "0"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp), PYTHONUNBUFFERED="1"))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not list(tmp.glob(WORK_PREFIX + "*")):
            time.sleep(0.05)
        assert proc.poll() is None and list(tmp.glob(WORK_PREFIX + "*")), "the build ended before its work folder"
        time.sleep(1.0)  # into the stages
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    # 130, or (seen once on a loaded host) CPython ending itself by SIGINT after the handled interrupt: a shell
    # reads both as 130; what the user relies on is the cleanup and the message, asserted below
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, out, err)
    assert err.strip().splitlines()[-1] == "interrupted by SIGTERM; stopped after cleaning up", err
    assert "Traceback" not in err
    assert list(tmp.iterdir()) == []
    assert not (repo / "digits_cnn").exists()


def test_clean_of_a_repository_never_created_still_cleans_the_work_folders(tmp_path, monkeypatch, capsys):
    import tempfile

    from builder import cli

    tmp = tmp_path / "tmp"
    dead = tmp / f"{WORK_PREFIX}999999999-digits_cnn-x"  # a killed build's, its lock held by nobody
    dead.mkdir(parents=True)
    (dead / LOCK_NAME).write_text("999999999\n")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    missing = tmp_path / "kb"
    assert cli.main(["clean", "--repository", str(missing)]) == 0
    out = capsys.readouterr().out
    assert f"removed {dead}" in out and "removed 1 folder(s) left by dead builds" in out
    assert f"--repository {missing}: no such folder (nothing was published there yet, or a typo)" in out
    assert not dead.exists()
