"""Permission errors reaching the CLI: the advice fits what the verb does (reading or writing), and a
folder that cannot be entered is named instead of a file below it that may not exist."""

from __future__ import annotations

import errno
import os

import pytest


def _raising(path):
    def verb(args, reporter):
        # what Path.is_file() raises below a folder this user may not enter
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    return verb


@pytest.fixture
def closed(tmp_path, monkeypatch):
    """tmp_path/repo, which this user may not enter (os.access faked: the tests may run as root)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if str(p) == str(repo) else real(p, mode, *a, **k))
    return repo


@pytest.mark.parametrize("verb, module, argv", [
    ("cmd_validate", "build", ["validate", "x"]),
    ("cmd_serve", "serving", ["serve"]),
])
def test_a_folder_that_cannot_be_entered_is_named_with_reading_advice(closed, monkeypatch, capsys, verb, module, argv):
    import importlib

    from builder import cli

    monkeypatch.setattr(importlib.import_module(f"builder.cli.{module}"), verb, _raising(closed / "config.pbtxt"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {closed}: permission denied: this user may not enter that folder (drwx")
    assert f"nothing below it can be read; make it readable and enterable (chmod 755 {closed}" in err
    assert "config.pbtxt" not in err and "write" not in err


def test_a_file_a_read_only_verb_cannot_read_gets_reading_advice(tmp_path, monkeypatch, capsys):
    from builder import cli
    from builder.cli import build as build_cli

    monkeypatch.setattr(build_cli, "cmd_validate", _raising(tmp_path / "metadata.yaml"))
    assert cli.main(["validate", "x"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {tmp_path / 'metadata.yaml'}: Permission denied; permission denied: this user may not "
                   "read it: make it readable (chmod a+r for files, a+rx for folders) or run as a user who may\n")


def test_a_writing_verb_keeps_the_writing_advice(tmp_path, monkeypatch, capsys):
    from builder import cli
    from builder.cli import build as build_cli

    monkeypatch.setattr(build_cli, "cmd_build", _raising(tmp_path / "x.tmp"))
    assert cli.main(["build", "spec.yaml"]) == 2
    assert "run as a user who may write there, or write elsewhere" in capsys.readouterr().err
