"""A repository that is itself a mount point (a Docker or Kubernetes volume, NFS), or whose parent cannot be
written: versions are staged beside it and renamed in, so the build refuses up front with the fix instead
of failing at the very end (EXDEV). The mount is stood in for by the parent's device number."""

from __future__ import annotations

import os

import pytest

from builder.core.errors import UserInputError
from builder.repository import layout


def _other_device_for(monkeypatch, folder):
    real = os.stat

    def fake(path, *args, **kwargs):
        result = real(path, *args, **kwargs)
        if os.fspath(path) == os.fspath(folder):
            return os.stat_result((*result[:2], result.st_dev + 1, *result[3:]))
        return result
    monkeypatch.setattr(layout.os, "stat", fake)


def test_a_mount_point_repository_is_refused_before_the_build_naming_the_fix(tmp_path, monkeypatch):
    repo = tmp_path / "volume"
    repo.mkdir()
    layout.require_writable(repo)  # the same file system as its parent: fine
    _other_device_for(monkeypatch, tmp_path)
    with pytest.raises(UserInputError, match=rf"--repository {repo}: the repository is a mount point \(its parent "
                                             rf"{tmp_path} is another file system\).*pass a folder inside it instead "
                                             rf"\(--repository {repo}/model_repository\)"):
        layout.require_writable(repo)
    layout.require_writable(repo, staged=False)  # tune --write rewrites config.pbtxt in place: nothing staged
    layout.require_writable(repo / "model_repository")  # a folder inside the mount: staged on the mount


def test_a_repository_whose_parent_is_read_only_is_refused_naming_the_parent(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    real = layout._why_not_writable
    monkeypatch.setattr(layout, "_why_not_writable", lambda f: "read-only file system" if f == tmp_path else real(f))
    with pytest.raises(UserInputError, match=rf"its parent folder {tmp_path} is not writable \(read-only file "
                                             r"system\), and versions are staged beside the repository"):
        layout.require_writable(repo)
