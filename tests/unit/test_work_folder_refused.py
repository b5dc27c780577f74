"""A full, read-only or forbidden $TMPDIR during a build: one message naming the work folder and
$TMPDIR as the fix, exit 2 (the environment, not a failed verification), nothing left behind."""

from __future__ import annotations

import errno
import os
import tempfile

import pytest

from builder.core.errors import UserInputError


@pytest.fixture
def own_tmpdir(tmp_path, monkeypatch):
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _refuse(code: int):
    def exporter(model, spec, path):
        # torch wraps the OSError in its own exporter error: the cause is found through the chain
        try:
            raise OSError(code, os.strerror(code), str(path))
        except OSError as err:
            raise RuntimeError("export failed") from err
    return exporter


def test_a_full_tmpdir_stops_the_build_naming_the_work_folder(digits_copy, tmp_path, own_tmpdir, quiet,
                                                              monkeypatch):
    from builder.pipeline import build
    from builder.stages import export_onnx

    monkeypatch.setattr(export_onnx, "export_dynamo", _refuse(errno.ENOSPC))
    monkeypatch.setattr(export_onnx, "export_legacy", _refuse(errno.ENOSPC))
    with pytest.raises(UserInputError, match=rf"the build's work folder {own_tmpdir}/triton-builder-work-\S+ "
                                             rf"\(\$TMPDIR={own_tmpdir}\): No space left on device \(writing "
                                             r".*model.onnx\); free space there, or point \$TMPDIR at a file system "
                                             r"with room .*; nothing was published") as raised:
        build(digits_copy / "spec.yaml", tmp_path / "repo", variants=["onnx"], benchmark_seconds=0, progress=quiet)
    assert raised.value.exit_code == 2
    assert list(own_tmpdir.iterdir()) == []
    assert not (tmp_path / "repo" / "digits_cnn").exists()


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_forbidden_tmpdir_says_to_point_tmpdir_elsewhere_and_the_cli_exits_2(digits_copy, tmp_path, own_tmpdir,
                                                                                monkeypatch, capsys, code):
    from builder import cli
    from builder.stages import export_onnx

    monkeypatch.setattr(export_onnx, "export_dynamo", _refuse(code))
    monkeypatch.setattr(export_onnx, "export_legacy", _refuse(code))
    assert cli.main(["build", "-q", str(digits_copy / "spec.yaml"), "--repository", str(tmp_path / "repo"),
                     "--variants", "onnx", "--benchmark-seconds", "0"]) == 2
    err = capsys.readouterr().err
    assert f"the build's work folder {own_tmpdir}/triton-builder-work-" in err
    assert "point $TMPDIR at a folder this user may write" in err and "every ONNX exporter failed" not in err
    assert list(own_tmpdir.iterdir()) == []


def test_an_oserror_escaping_a_stage_inside_the_work_folder_is_named_the_same_way(digits_copy, tmp_path, own_tmpdir,
                                                                                   quiet, monkeypatch):
    from builder.pipeline import build
    from builder.stages import export_onnx

    def full(ctx):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), str(ctx.workdir / "onnx" / "model.onnx"))

    monkeypatch.setattr(export_onnx, "run", full)
    with pytest.raises(UserInputError, match=r"work folder .*: Disk quota exceeded .*free space there"):
        build(digits_copy / "spec.yaml", tmp_path / "repo", variants=["onnx"], benchmark_seconds=0, progress=quiet)
    assert list(own_tmpdir.iterdir()) == []
