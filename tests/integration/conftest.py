"""Integration fixtures: one real embedded tritonserver for the session, serving the examples."""

from __future__ import annotations

import contextlib
import json
from typing import Callable, Iterator

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


@contextlib.contextmanager
def reloaded(server: EmbeddedServer, model: str, change: Callable[[dict], None]) -> Iterator[EmbeddedServer]:
    """``model`` reloaded with its served config changed by ``change(config)``; restored after.
    Unload + load, never an in-place reload (that segfaults Triton 2.51's python backend)."""
    with server.triton() as client:
        config = client.model_config(model)
    change(config)
    server.unload_model(model)
    try:
        server.load_model(model, config_json=json.dumps(config))
        server.wait_for_model(model)
        yield server
    finally:
        server.unload_model(model)
        server.load_model(model)
        server.wait_for_model(model)
