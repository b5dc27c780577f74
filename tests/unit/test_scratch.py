"""Scratch folders owned by a live process: removed by the owner, by the next sweep once the owner
is dead (however it died), never while it lives; publish failures that name the file."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from builder.core.errors import UserInputError
from builder.core.scratch import LOCK_NAME, OwnedFolder, staging_parent, staging_prefix, sweep
from builder.repository.layout import clean

PREFIX = "triton-builder-test-"


def _owned_by_a_child(parent: Path, prefix: str) -> tuple[subprocess.Popen, Path]:
    """A child process that creates an owned folder, prints it and waits to be killed."""
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from builder.core.scratch import OwnedFolder
        folder = OwnedFolder.create(Path({str(parent)!r}), {prefix!r}, "child")
        print(folder.path, flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    return child, Path(child.stdout.readline().strip())


def test_owned_folder_is_named_locked_and_released(tmp_path):
    folder = OwnedFolder.create(tmp_path, PREFIX, "digits")
    assert folder.path.name.startswith(f"{PREFIX}{os.getpid()}-digits-") and (folder.path / LOCK_NAME).is_file()
    assert sweep(tmp_path, PREFIX) == [] and folder.path.is_dir()  # alive: never swept
    folder.release()
    assert not folder.path.exists()


def test_a_killed_owners_folder_is_swept_a_live_ones_is_not(tmp_path):
    live_child, live = _owned_by_a_child(tmp_path, PREFIX)
    dead_child, dead = _owned_by_a_child(tmp_path, PREFIX)
    try:
        dead_child.send_signal(signal.SIGKILL)
        dead_child.wait(10)
        (dead / "model.onnx").write_bytes(b"half a file")
        assert sweep(tmp_path, PREFIX) == [dead]
        assert not dead.exists() and live.is_dir()
    finally:
        live_child.kill()
        live_child.wait(10)
    assert sweep(tmp_path, PREFIX) == [live]


def test_a_folder_without_its_lock_goes_by_the_pid_in_its_name(tmp_path):
    ours = tmp_path / f"{PREFIX}{os.getpid()}-abc"  # killed between mkdtemp and the lock: pid decides
    ours.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    theirs = tmp_path / f"{PREFIX}{int(gone.stdout)}-abc"
    theirs.mkdir()
    (tmp_path / "someone-elses-folder").mkdir()
    assert sweep(tmp_path, PREFIX) == [theirs]
    assert ours.is_dir() and (tmp_path / "someone-elses-folder").is_dir()


def test_clean_covers_work_and_staging_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    repo = tmp_path / "model_repository"
    repo.mkdir()
    child, work = _owned_by_a_child(tmp_path / "tmp", "triton-builder-work-")
    child2, staged = _owned_by_a_child(staging_parent(repo), staging_prefix(repo))
    for process in (child, child2):
        process.kill()
        process.wait(10)
    assert staged.parent == tmp_path and staged.name.startswith(".model_repository.triton-builder-staging-")
    assert sorted(clean(repo)) == sorted([work, staged])
    assert clean(repo) == []


@pytest.mark.slow(reason="builds a model")
def test_a_full_disk_during_publish_names_the_file_and_keeps_earlier_versions(digits_copy, tmp_path, quiet,
                                                                              monkeypatch):
    from builder.pipeline import build
    from builder.repository import publish

    repo = tmp_path / "repo"
    build(digits_copy / "spec.yaml", repo, variants=["onnx"], benchmark_seconds=0, progress=quiet)
    before = sorted(str(p.relative_to(repo)) for p in repo.rglob("*"))
    real_copy = publish.shutil.copyfile

    def copy_until_full(source, target):
        if Path(target).name == "model.onnx":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_copy(source, target)

    monkeypatch.setattr(publish.shutil, "copyfile", copy_until_full)
    with pytest.raises(UserInputError, match=r"publishing 'digits_cnn' failed writing model.onnx \(.*\): No space left on "
                                           r"device; nothing was published and earlier versions are intact; free "
                                           r"space on that file system and build again"):
        build(digits_copy / "spec.yaml", repo, variants=["onnx"], benchmark_seconds=0, progress=quiet)
    assert UserInputError.exit_code == 2  # the README: a full file system is exit 2, not a failed check
    assert sorted(str(p.relative_to(repo)) for p in repo.rglob("*")) == before
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


def test_reserved_versions_are_distinct_and_released(tmp_path):
    from builder.core.errors import UserInputError
    from builder.repository.layout import existing_versions, publish_version, reserve_version

    repo = tmp_path / "repo"
    with reserve_version(repo, "m") as first, reserve_version(repo, "m") as second:
        assert (first.version, second.version) == (1, 2)  # the second build does not take 1 again
        with pytest.raises(UserInputError, match=r"version 1 of model 'm' already exists or is being published"):
            with reserve_version(repo, "m", requested=1):
                pass
        with publish_version(repo, "m", reservation=second) as draft:
            (draft.folder / "f").write_text("v2")
            draft.config_text = 'name: "m"\n'
    assert existing_versions(repo / "m") == [2]
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]  # both released
    with reserve_version(repo, "m") as third:
        assert third.version == 3
