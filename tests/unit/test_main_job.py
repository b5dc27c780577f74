"""The main job's guard: one job per repository folder at a time (a second would empty the repository
and the log of a server still serving them)."""

from __future__ import annotations

import os

import pytest

from builder.core.errors import UserInputError
from builder.main_job import JOB_MARK, job_lock, job_lock_path, job_outputs, run_main_job


def test_a_second_job_on_the_same_repository_is_refused_naming_the_first(tmp_path):
    repository = tmp_path / "runs" / "model_repository"
    repository.mkdir(parents=True)
    (repository / "kept").write_text("served by the first job")
    with job_lock(repository):
        assert job_lock_path(repository).read_text().strip() == str(os.getpid())
        with pytest.raises(UserInputError, match=rf"another `triton-builder run` \(pid {os.getpid()}\) is using "
                                                 rf".*model_repository .*stop it \(Ctrl-C\), or give this run another "
                                                 r"--repository"):
            run_main_job(tmp_path / "no-spec.yaml", repository)
        assert (repository / "kept").exists()  # refused before the fresh start emptied it
    with job_lock(repository):  # released: the next job may start
        pass
    assert not job_lock_path(repository).exists()  # a clean exit leaves no lock file behind


def test_jobs_on_sibling_repositories_run_side_by_side_with_their_own_outputs(tmp_path):
    first, second = tmp_path / "par" / "repoR1", tmp_path / "par" / "repoR2"
    with job_lock(first):
        with job_lock(second):  # was: refused, naming repoR2, because both locked par/.main-job.lock
            assert job_lock_path(first) != job_lock_path(second)
        with pytest.raises(UserInputError, match=rf"another `triton-builder run` \(pid {os.getpid()}\) is using "
                                                 rf"{first} "):
            with job_lock(tmp_path / "par" / "." / "repoR1"):  # the same repository, spelt otherwise
                pass
    assert job_outputs(first) != job_outputs(second)
    assert sorted(p.name for p in (tmp_path / "par").iterdir()) == []  # no lock files left


def _scratch(tmp_path, monkeypatch):
    """The job's default repository under a fresh working folder, holding a published-looking version."""
    monkeypatch.chdir(tmp_path)
    repository = tmp_path / "runs" / "model_repository"
    (repository / "m" / "1").mkdir(parents=True)
    (repository / "m" / "1" / "model.onnx").write_text("served")
    (repository / JOB_MARK).write_text("an earlier run's")
    return repository


def test_a_folder_of_that_name_the_job_did_not_make_is_never_emptied(tmp_path, monkeypatch, digits_copy):
    """runs/model_repository is relative to where the job runs: a project may have a folder of that name."""
    monkeypatch.chdir(tmp_path)
    repository = tmp_path / "runs" / "model_repository"
    (repository / "my_model" / "1").mkdir(parents=True)
    (repository / "NOTES.txt").write_text("mine")
    with pytest.raises(UserInputError, match=r"runs/model_repository \(.*\) holds NOTES.txt, my_model, which "
                                             r"`triton-builder run` did not put there .*pass --repository DIR"):
        run_main_job(digits_copy / "spec.yaml")
    assert (repository / "NOTES.txt").read_text() == "mine" and (repository / "my_model" / "1").is_dir()


def test_the_job_empties_only_a_folder_it_marked_or_an_empty_one(tmp_path):
    from builder.main_job import _empty_job_repository

    for marked, files in ((True, ["m"]), (False, [])):
        repository = tmp_path / f"repo{marked}"
        repository.mkdir()
        for name in files:
            (repository / name).mkdir()
        if marked:
            (repository / JOB_MARK).write_text("")
        _empty_job_repository(repository)
        assert not repository.exists()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(UserInputError, match=r"link is a symbolic link; the job empties its default repository "
                                             r"before building and will not follow or replace that"):
        _empty_job_repository(tmp_path / "link")
    assert target.is_dir()


def test_a_mistyped_spec_leaves_the_jobs_repository_as_it_was(tmp_path, monkeypatch):
    repository = _scratch(tmp_path, monkeypatch)
    with pytest.raises(UserInputError, match="spec file not found: .*no_such_spec.yaml"):
        run_main_job(tmp_path / "no_such_spec.yaml")
    assert (repository / "m" / "1" / "model.onnx").read_text() == "served"  # was: emptied before the spec was read


@pytest.mark.parametrize("kwargs, message", [
    ({"users": 0}, r"--users 0: give a whole number of load-test users >= 1"),
    ({"load_seconds": -5.0}, r"--load-seconds -5.0: give the load test's length in seconds, > 0"),
])
def test_load_test_numbers_are_refused_before_anything_is_built(tmp_path, monkeypatch, digits_copy, kwargs, message):
    repository = _scratch(tmp_path, monkeypatch)
    with pytest.raises(UserInputError, match=message):
        run_main_job(digits_copy / "spec.yaml", **kwargs)
    assert (repository / "m" / "1" / "model.onnx").exists()


def test_a_target_the_embedded_server_cannot_serve_is_refused_up_front(tmp_path, monkeypatch, digits_copy):
    from tests.conftest import edit_spec

    repository = _scratch(tmp_path, monkeypatch)
    spec = edit_spec(digits_copy, deploy={"target": "gpu"})
    with pytest.raises(UserInputError, match=r"deploy.target: gpu: `run` serves on the embedded tritonserver, "
                                             r"which has no GPU backends .*set deploy.target: cpu for the main job"):
        run_main_job(spec)
    assert (repository / "m" / "1" / "model.onnx").exists()


def test_the_scratch_repository_is_not_emptied_under_a_live_server(tmp_path, monkeypatch, digits_copy):
    import subprocess
    import sys

    from builder.main_job import live_servers

    repository = _scratch(tmp_path, monkeypatch)
    link = tmp_path / "link"  # served through a symlink, as a path with spaces is
    link.symlink_to(repository)
    # a process whose command line reads as tritonserver serving the repository (the real one: integration)
    fake = subprocess.Popen(["bash", "-c", f'exec -a {tmp_path}/tritonserver {sys.executable} -c '
                                           f'"import time; time.sleep(60)" --model-repository={link}'])
    try:
        for _ in range(50):
            if live_servers(repository):
                break
            import time
            time.sleep(0.1)
        assert live_servers(repository) == [fake.pid]
        assert live_servers(tmp_path) == []
        with pytest.raises(UserInputError, match=rf"--repository runs/model_repository: tritonserver \(pid {fake.pid}\) "
                                                 r"serves it; .*stop that server first"):
            run_main_job(digits_copy / "spec.yaml")
    finally:
        fake.kill()
        fake.wait()
    assert (repository / "m" / "1" / "model.onnx").exists()


def test_a_tmpdir_the_server_cannot_use_is_refused_before_the_build(tmp_path, monkeypatch, digits_copy):
    import tempfile

    repository = _scratch(tmp_path, monkeypatch)
    spaced = tmp_path / "my temp"
    spaced.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spaced))
    with pytest.raises(UserInputError, match=r"TMPDIR '.*my temp': tritonserver's python backend starts its stub"):
        run_main_job(digits_copy / "spec.yaml")
    assert (repository / "m" / "1" / "model.onnx").exists()  # refused before anything was built or removed
