"""SIGHUP (the terminal that ran `serve` was closed) stops like SIGTERM: the clean-up runs (it died at once,
leaving its tritonserver's temp folder); under nohup (SIGHUP ignored) it is still ignored."""

from __future__ import annotations

import os
import signal
import time

import pytest

from builder.core.interrupts import stop_signals, terminate_as_interrupt


def test_a_hangup_is_a_stop_signal():
    # as from a terminal: a test run started under nohup inherits SIGHUP ignored (the next test's case)
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        with stop_signals() as received:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
            assert received == [signal.SIGHUP]
        with terminate_as_interrupt(), pytest.raises(KeyboardInterrupt, match=f"signal {int(signal.SIGHUP)}"):
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(1)
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_hangup_ignored_by_nohup_stays_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_signals() as received:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
            assert received == []
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
