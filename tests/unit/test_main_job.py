"""The main job's guard: one job per repository folder at a time (a second would empty the repository
and the log of a server still serving them)."""

from __future__ import annotations

import os

import pytest

from builder.errors import UserInputError
from builder.main_job import JOB_LOCK, job_lock, run_main_job


def test_a_second_job_on_the_same_repository_is_refused_naming_the_first(tmp_path):
    repository = tmp_path / "runs" / "model_repository"
    repository.mkdir(parents=True)
    (repository / "kept").write_text("served by the first job")
    with job_lock(repository):
        assert (tmp_path / "runs" / JOB_LOCK).read_text().strip() == str(os.getpid())
        with pytest.raises(UserInputError, match=rf"another `triton-builder run` \(pid {os.getpid()}\) is using "
                                                 rf".*model_repository .*stop it \(Ctrl-C\), or give this run another "
                                                 r"--repository"):
            run_main_job(tmp_path / "no-spec.yaml", repository)
        assert (repository / "kept").exists()  # refused before the fresh start emptied it
    with job_lock(repository):  # released: the next job may start
        pass
