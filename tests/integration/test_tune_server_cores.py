"""A tritonserver pinned to other cores than the tuning process (`taskset -c 0 triton-builder serve` beside
`taskset -c 1 triton-builder tune`): tune finds it by its port and sizes its layouts to its cores."""

from __future__ import annotations

import os

import pytest

from builder.core.host import usable_cores
from builder.core.local_server import pin_process, server_usable_cores
from builder.serving.embedded import EmbeddedServer

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity")


def test_a_pinned_local_server_is_found_and_tune_sizes_to_its_cores(built_repository):
    from builder.tuning.tune import _server_cores

    everything = os.sched_getaffinity(0)
    first = {min(everything)}
    pin_process(first)
    try:
        server = EmbeddedServer(built_repository, load_models=["digits_cnn"], ready_timeout=90)
        server.start()
    finally:
        pin_process(everything)
    try:
        assert os.sched_getaffinity(server.pid) == first
        assert server_usable_cores(server.grpc_url) == (1, server.pid)
        assert server_usable_cores(server.http_url)[0] == 1
        said = []
        expected = None if usable_cores() == 1 else 1  # this process's own cores: nothing to change
        assert _server_cores(server.grpc_url, said.append) == expected
        assert bool(said) == (expected is not None)
    finally:
        server.stop()
