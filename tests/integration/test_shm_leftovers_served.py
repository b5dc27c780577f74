"""A tritonserver that loses the race for its ports (two `serve`s started at once with the same ports) used
to leave its python backend's 1 MB /dev/shm regions behind; its clean-up removes them now (the real server;
the rule alone: tests/unit/test_shm_leftovers.py)."""

from __future__ import annotations

from builder.serving.embedded import EmbeddedServer
from builder.serving.startup import shm_files


def test_a_server_that_lost_the_race_for_its_ports_leaves_nothing_in_dev_shm(served, built_repository):
    ports = dict(http_port=served.http_port, grpc_port=served.grpc_port, metrics_port=served.metrics_port)
    before = shm_files()
    loser = EmbeddedServer(built_repository, load_models=["digits_cnn"], ready_timeout=90, **ports)
    loser._fixed_ports = lambda: []  # past the up-front check, as a server started at the same moment is
    try:
        loser.start()
    except Exception as exc:  # noqa: BLE001 - which error is test_embedded_server's question
        assert "could not bind" in str(exc) or "in use" in str(exc), exc
    else:
        loser.stop()
        raise AssertionError("a second server on the same ports started")
    assert not loser.is_running()
    assert sorted(shm_files() - before) == []
