"""Integration fixtures: one real embedded tritonserver for the session, serving the examples."""

from __future__ import annotations

import pytest

from builder.serving.embedded import EmbeddedServer


@pytest.fixture(scope="session")
def served(built_repository):
    """The embedded Triton serving digits_cnn and bert_tiny (built once per session)."""
    server = EmbeddedServer(built_repository, ready_timeout=90)
    server.start()
    yield server
    pid = server.pid
    server.stop()
    assert not server.is_running(), f"tritonserver {pid} still running after stop()"
