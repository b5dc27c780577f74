"""`clean` also removes the temp folders of ended tritonservers: those a failed start, a crash or a hung stop
kept for their log (nothing else ever removed them: 139 piled up in one /tmp), never a live owner's."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile


def test_clean_removes_ended_servers_folders_never_a_live_ones(tmp_path, monkeypatch, capsys):
    from builder import cli

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folders = {}
    for label, owner in (("kept", int(ended.stdout)), ("live", os.getpid())):
        folders[label] = tmp_path / f"triton-embedded-{label}"
        folders[label].mkdir()
        (folders[label] / "owner.pid").write_text(str(owner))
        (folders[label] / "tritonserver.log").write_text("E... failed to load\n")
    (tmp_path / "triton-embedded-unowned").mkdir()  # no owner.pid: another user's, or older
    assert cli.main(["clean"]) == 0
    out = capsys.readouterr().out
    assert f"removed {folders['kept']}" in out and not folders["kept"].exists()
    assert f"1 folder(s) of ended tritonservers (their logs, in {tmp_path})" in out
    assert folders["live"].is_dir() and (tmp_path / "triton-embedded-unowned").is_dir()
