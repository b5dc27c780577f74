"""The main job's guard: one job per repository folder at a time (a second would empty the repository
and the log of a server still serving them)."""

from __future__ import annotations

import os

import pytest

from builder.errors import UserInputError
from builder.main_job import job_lock, job_lock_path, job_outputs, run_main_job


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
