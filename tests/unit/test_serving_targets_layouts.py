"""benchmarks/serving_targets.py's split layout: the server's cores and the load generator's."""

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def serving_targets():
    spec = importlib.util.spec_from_file_location("serving_targets", ROOT / "benchmarks" / "serving_targets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_usable_cores_are_cut_in_two_the_server_taking_the_larger_half(serving_targets):
    assert serving_targets.split_cores([0, 1], 2) == ([0], [1])
    assert serving_targets.split_cores([4, 0, 2], 3) == ([0, 2], [4])
    assert serving_targets.split_cores(list(range(16)), 16) == (list(range(8)), list(range(8, 16)))


def test_a_quota_bounds_the_cores_split_and_one_core_cannot_be_split(serving_targets):
    assert serving_targets.split_cores(list(range(8)), 2) == ([0], [1])  # a 2-CPU quota on an 8-CPU affinity
    assert serving_targets.split_cores([3], 1) is None
    assert serving_targets.split_cores([0, 1], 1) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity")
def test_pin_moves_every_thread_of_this_process(serving_targets):
    import threading

    everything = sorted(os.sched_getaffinity(0))
    started, stop = threading.Event(), threading.Event()
    seen = {}

    def worker():  # a thread made before the pin, as builder/processes.py's forker is
        started.set()
        stop.wait()
        seen["affinity"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=worker)
    thread.start()
    started.wait()
    try:
        serving_targets.pin(everything[:1])
        assert os.sched_getaffinity(0) == set(everything[:1])
    finally:
        stop.set()
        thread.join()
        serving_targets.pin(everything)
    assert seen["affinity"] == set(everything[:1])
    assert os.sched_getaffinity(0) == set(everything)
