"""serve's watch on a hung tritonserver (builder/serving/hang_watch.py) and the crash lines a stop
looks for in its log (builder/serving/server_log.py), without a server: the clock is given."""

from __future__ import annotations

import pytest

from builder.serving.hang_watch import HangWatch, Silence
from builder.serving.server_log import crash_marks

# the tail of a log that held the only record of a crash (probe 5L): the server hung after it
CRASHED = """\
I1125 04:31:11.149609 13813 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: tok_0_2 (CPU device 0)"
malloc_consolidate(): unaligned fastbin chunk detected
Signal (6) received.
 0# 0x000055B6117F552D in /x/tritonserver
E1125 04:35:09.869582 13813 model_repository_manager.cc:470] "Failed to set config modification time"
"""

# every stop: Triton's handler names SIGTERM with the same words as a crash
STOPPED = """\
I1125 05:41:23.946450 21377 http_server.cc:362] "Started Metrics Service at 127.0.0.1:39577"
Signal (15) received.
I1125 05:41:25.019338 21377 server.cc:305] "Waiting for in-flight requests to complete."
Signal (2) received.
"""


def test_silence_announces_a_hang_once_and_the_answer_that_ends_it():
    silence = Silence(misses=3, now=100.0)
    assert silence.observe(True, 110.0) is None
    assert silence.observe(False, 120.0) is None
    assert silence.observe(False, 130.0) is None
    assert silence.observe(False, 140.0) == ("hung", 30.0)  # from the last answer, at 110
    assert [silence.observe(False, 150.0 + i) for i in range(5)] == [None] * 5  # once per silence
    assert silence.observe(True, 200.0) == ("back", 90.0)
    assert silence.observe(True, 210.0) is None


def test_an_answer_between_misses_starts_the_count_again():
    silence = Silence(misses=3, now=0.0)
    events = [silence.observe(answered, float(t)) for t, answered in
              enumerate([False, False, True, False, False, True, False, False, False], start=1)]
    assert events == [None] * 8 + [("hung", 3.0)]


def test_silence_refuses_no_misses():
    with pytest.raises(ValueError, match="misses must be at least 1, got 0"):
        Silence(misses=0, now=0.0)


class _Server:
    http_url = "127.0.0.1:8000"
    pid = 4242
    log_path = "/tmp/triton-embedded-x/tritonserver.log"

    def __init__(self, log: str):
        self.log = log

    def read_log(self) -> str:
        return self.log


def test_the_hang_warning_names_the_server_its_log_and_a_crash_in_it():
    watch = HangWatch(_Server(CRASHED), announce=print, interval=10.0)
    assert watch.message("hung", 30.4) == (
        "WARNING: tritonserver at 127.0.0.1:8000 (pid 4242) has not answered for 30 s (hung?); "
        "its log: /tmp/triton-embedded-x/tritonserver.log\n"
        "  its log reports a crash:\n"
        "    malloc_consolidate(): unaligned fastbin chunk detected\n"
        "    Signal (6) received.\n"
        "  serve leaves it running and goes on waiting; Ctrl-C or SIGTERM stops it, and keeps that log if it "
        "has to be killed")
    quiet = HangWatch(_Server(STOPPED), announce=print, interval=10.0)
    assert "crash" not in quiet.message("hung", 30.0)
    assert quiet.message("back", 42.0) == "tritonserver at 127.0.0.1:8000 answers again, after 42 s without an answer"


def test_hang_watch_refuses_a_period_that_is_not_positive():
    with pytest.raises(ValueError, match="interval must be positive, got 0"):
        HangWatch(_Server(""), announce=print, interval=0)


def test_crash_marks_find_a_fatal_signal_and_glibc_reason_not_a_stop():
    assert crash_marks(CRASHED) == ["malloc_consolidate(): unaligned fastbin chunk detected", "Signal (6) received."]
    assert crash_marks(STOPPED) == []
    stub = 'I1125 00:00:00.000000 1 x.cc:1] "loading: m:1"\n' \
           "terminate called after throwing an instance of 'std::runtime_error'\n  what():  bad args\n"
    assert crash_marks(stub) == ["terminate called after throwing an instance of 'std::runtime_error'",
                                 "what():  bad args"]
    assert crash_marks("Signal (11) received.\n") == ["Signal (11) received."]
