"""tune stops at the first refused model load (builder/tuning/search.py ``LoadRefused``): a server that answers
the model-control call with an error (no control key, a backend it lacks, a broken file) refuses every other
candidate alike, so the search ends there - exit 2, the server's own reason in the message - instead of loading
every candidate in turn. A config Triton loaded differently stays one candidate's failure."""

from __future__ import annotations

import numpy as np
import pytest

from builder.core.errors import LoadRefused, ServerError
from builder.serving.client import TritonError
from builder.tuning.search import Candidate, Search

BASE = {"name": "m", "backend": "python", "max_batch_size": 8, "dynamic_batching": {},
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
REFUSAL = "This API is restricted, expecting header 'triton-builder-control-key'"


class RefusingClient:
    """Model control that answers every load with an error, counting the calls."""

    liveness = None

    def __init__(self):
        self.loads = 0

    def unload_model(self, name, **kwargs):
        pass

    def load_model(self, name, config=None, files=None):
        self.loads += 1
        raise TritonError(f"load of '{name}' failed: {REFUSAL}", address="127.0.0.1:1", reason=REFUSAL)

    def close(self):
        pass


def _search() -> Search:
    search = Search("127.0.0.1:1", "grpc", "m", BASE, [{"x": np.zeros((1, 4), np.float32)}], ["y"],
                    levels=[1], budget=50.0, window_s=0.1, per_level_s=0.4, max_candidates=12,
                    say=lambda m: None, files=None)
    search.server.client = RefusingClient()
    return search


def test_the_search_stops_at_the_first_refused_load():
    search = _search()
    default = Candidate("default", True, 0, 1, 8)
    with pytest.raises(LoadRefused, match=r"Triton at 127\.0\.0\.1:1 refused to load 'm': This API is restricted, "
                                          r"expecting header 'triton-builder-control-key'; tune stopped there"):
        search.candidates(default, layouts=[(2, 0), (3, 0)], delays=[100, 500], max_batch_sizes=[4])
    assert search.server.client.loads == 1  # not one load per candidate
    assert issubclass(LoadRefused, ServerError)  # exit 2, as a server that cannot be reached


def test_a_config_loaded_differently_stays_the_candidates_own_failure(monkeypatch):
    search = _search()
    calls = []

    def serve(config, on_file=False):
        calls.append(config)
        raise ServerError("Triton loaded something else: instance_group count 2 -> 1")
    monkeypatch.setattr(search.server, "serve", serve)
    tried = search.measure(Candidate("2 instances", True, 0, 2, 8))
    assert "Triton loaded something else" in tried.error and len(calls) == 1
    assert search.measure(Candidate("3 instances", True, 0, 3, 8)).error  # the search goes on to the next
    assert len(calls) == 2
