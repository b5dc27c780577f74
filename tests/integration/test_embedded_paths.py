"""The embedded server on repository paths the python backend's stub command line cannot take
(spaces): served through a symlink, messages naming the real folder; a crashed stub fails the start
at once. Real tritonserver processes; repositories written by hand as in test_embedded_server.py."""

from __future__ import annotations

import tempfile
import time

import numpy as np
import pytest

from builder.core.errors import ServerError, UserInputError
from builder.serving import embedded
from builder.serving.embedded import EmbeddedServer
from builder.serving.server_log import crash_lines
from tests.integration.python_models import ADD_ONE_PY, python_model
from tests.integration.test_embedded_server import BAD_PY, BOOM

pytestmark = pytest.mark.integration


@pytest.fixture
def spaced_repo(tmp_path):
    repo = tmp_path / "sp ace" / "repo x"
    python_model(repo, "add_one", ADD_ONE_PY)
    python_model(repo, "broken", BAD_PY)
    return repo


def test_a_repository_path_with_spaces_is_served(spaced_repo):
    with EmbeddedServer(spaced_repo, load_models=["add_one"], ready_timeout=60) as server:
        assert server.repository == spaced_repo.resolve()
        with server.triton() as client:
            out = client.infer("add_one", {"INPUT0": np.zeros((1, 4), np.float32)})
        assert out["OUTPUT0"].tolist() == [[1, 1, 1, 1]]
        with pytest.raises(ServerError, match=BOOM) as failed:
            server.load_model("broken")
        link = str(server._workdir / "repository")
        assert link not in str(failed.value)
        # what users read names their folder, never the link (our own "# triton-builder" lines explain it)
        shown = [line for line in server.read_log().splitlines() if not line.startswith("# triton-builder")]
        assert not any(link in line for line in shown)
        assert any(str(spaced_repo.resolve()) in line for line in shown)


def test_a_crashed_stub_fails_the_start_at_once(spaced_repo, monkeypatch, tmp_path):
    # without the symlink the stub gets a split path and dies: the server would wait for it forever
    monkeypatch.setattr(embedded, "stub_safe_repository", lambda repository, workdir: None)
    started = time.monotonic()
    log = tmp_path / "server.log"  # given: the temp dir goes, the log stays where the message says
    with pytest.raises(ServerError, match=r"(?s)a process it started crashed while loading: add_one:1:\n"
                                          rf"  terminate called after throwing.*full log: {log}$"):
        EmbeddedServer(spaced_repo, load_models=["add_one"], ready_timeout=60, log_path=log).start()
    assert time.monotonic() - started < 30


def test_a_temp_dir_the_stub_cannot_take_is_refused(spaced_repo, tmp_path, monkeypatch):
    spaced_tmp = tmp_path / "t mp"
    spaced_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spaced_tmp))
    with pytest.raises(UserInputError, match=r"TMPDIR '.*t mp': .* set TMPDIR to a folder"):
        EmbeddedServer(spaced_repo, load_models=["add_one"]).start()
    assert list(spaced_tmp.iterdir()) == []


def test_crash_lines():
    log = ('I1124 model_lifecycle.cc:472] "loading: mix_model:1"\n'
           "terminate called after throwing an instance of 'std::invalid_argument'\n  what():  stol\n")
    assert crash_lines(log) == ("while loading: mix_model:1:\n  terminate called after throwing an instance of "
                                "'std::invalid_argument'\n  what():  stol")
    assert crash_lines('I1124 model_lifecycle.cc:472] "loading: mix_model:1"\n') == ""
