"""tune's layouts follow the cores of a server on this machine (builder/core/local_server.py): the server may
run under another affinity than tune (the load generator kept off the server's cores); and the two steps the
benchmarks take to put them there (split_cores, pin_process)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from builder.core.errors import UserInputError
from builder.core.local_server import listening_pid, pin_process, server_usable_cores, split_cores

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd") or not hasattr(os, "sched_getaffinity"),
                                reason="Linux /proc and affinity")


@pytest.fixture
def pinned_listener():
    """A process listening on a free port, pinned to one core (as `taskset -c 0 triton-builder serve` is)."""
    core = min(os.sched_getaffinity(0))
    code = textwrap.dedent(f"""
        import os, socket, sys
        os.sched_setaffinity(0, {{{core}}})
        s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
        print(s.getsockname()[1], flush=True)
        sys.stdin.read()
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield child, int(child.stdout.readline())
    finally:
        child.stdin.close()
        child.wait(10)


def test_the_listener_on_a_port_and_its_cores_are_found(pinned_listener):
    child, port = pinned_listener
    assert listening_pid(port) == child.pid
    assert server_usable_cores(f"127.0.0.1:{port}") == (1, child.pid)
    assert server_usable_cores(f"http://localhost:{port}") == (1, child.pid)


def test_nothing_is_found_for_a_free_port_or_another_machine(pinned_listener):
    _, port = pinned_listener
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        unused = free.getsockname()[1]  # bound, not listening
        assert listening_pid(unused) is None
        assert server_usable_cores(f"127.0.0.1:{unused}") is None
    assert server_usable_cores(f"triton.example.com:{port}") is None
    assert server_usable_cores("127.0.0.1") is None  # no port


def test_tune_sizes_its_layouts_to_the_server_where_its_cores_differ(monkeypatch):
    import builder.tuning.tune  # binds server_usable_cores
    from builder.core.host import usable_cores
    from builder.tuning.tune import _server_cores

    said = []
    mine = usable_cores()
    monkeypatch.setattr(builder.tuning.tune, "server_usable_cores", lambda url: (mine + 3, 4242))
    assert _server_cores("127.0.0.1:8001", said.append) == mine + 3
    assert "server's" in said[0] and "pid 4242" in said[0]
    monkeypatch.setattr(builder.tuning.tune, "server_usable_cores", lambda url: (mine, 4242))
    assert _server_cores("127.0.0.1:8001", said.append) is None  # the same cores: nothing to say
    monkeypatch.setattr(builder.tuning.tune, "server_usable_cores", lambda url: None)
    assert _server_cores("remote:8001", said.append) is None and len(said) == 1


@pytest.mark.parametrize("cores", [0, -2, True, 1.5])
def test_server_cores_below_one_is_refused_naming_the_option(tmp_path, cores):
    from builder.tuning.tune import run_tune

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.pbtxt").write_text('name: "m"\nbackend: "python"\nmax_batch_size: 8\n'
                                        'parameters { key: "intra_op_threads" value { string_value: "1" } }\n')
    with pytest.raises(UserInputError, match="--server-cores"):
        run_tune("m", tmp_path, "127.0.0.1:1", p99_budget_ms=10, usable_cores=cores)


def test_the_usable_cores_are_cut_in_two_the_server_taking_the_larger_half():
    assert split_cores([0, 1], 2) == ([0], [1])
    assert split_cores([4, 0, 2], 3) == ([0, 2], [4])
    assert split_cores(list(range(16)), 16) == (list(range(8)), list(range(8, 16)))


def test_a_quota_bounds_the_cores_split_and_one_core_cannot_be_split():
    assert split_cores(list(range(8)), 2) == ([0], [1])  # a 2-CPU quota on an 8-CPU affinity
    assert split_cores([3], 1) is None
    assert split_cores([0, 1], 1) is None


def test_pin_moves_every_thread_of_this_process():
    import threading

    everything = sorted(os.sched_getaffinity(0))
    started, stop = threading.Event(), threading.Event()
    seen = {}

    def worker():  # a thread made before the pin, as builder/core/processes.py's forker is
        started.set()
        stop.wait()
        seen["affinity"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=worker)
    thread.start()
    started.wait()
    try:
        pin_process(everything[:1])
        assert os.sched_getaffinity(0) == set(everything[:1])
    finally:
        stop.set()
        thread.join()
        pin_process(everything)
    assert seen["affinity"] == set(everything[:1])
    assert os.sched_getaffinity(0) == set(everything)
