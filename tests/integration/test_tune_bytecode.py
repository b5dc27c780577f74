"""tune leaves the published version folders as they were: the python backend's stub writes model.py's
bytecode (__pycache__) into the version folder it loads from on every reload through model control, and
tune's reloads (--in-place candidates, the restore, --write) are not the embedded server's own loads,
after which it removes that bytecode."""

from __future__ import annotations

import pytest

from builder.serving.embedded import EmbeddedServer
from builder.tuning.tune import run_tune
from tests.integration.python_models import python_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_tune_in_place_leaves_no_bytecode_in_the_version_folder(tmp_path):
    repo = tmp_path / "repo"
    python_model(repo, "add_one")
    with EmbeddedServer(repo, ready_timeout=90) as server:
        assert not list(repo.rglob("__pycache__"))
        record = run_tune("add_one", repo, server.grpc_url, p99_budget_ms=500, seconds_per_candidate=2,
                          delays=[0], instance_counts=[2], max_batch_sizes=[8], levels=[1], confirm=False,
                          serve_copies=False, engine="python", out_dir=tmp_path / "out")
        assert record["candidates_loaded_as"] == "the model itself, reloaded"
        assert server.model_ready("add_one")
        # while the server runs (serve runs for days; it removes the bytecode of its own loads only)
        assert not list(repo.rglob("__pycache__")), "tune's reloads left bytecode in the published version"
