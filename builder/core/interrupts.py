"""Signal handling for foreground loops that own local services (``triton-builder serve``, tune, the
main job): stop them cleanly on SIGINT/SIGTERM. Standard library only, like builder/core/processes.py,
which re-exports both functions.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


def _stop_signals() -> list[int]:
    """SIGINT, SIGTERM and SIGHUP (the terminal closed: `serve` died without its clean-up, leaving its
    temp folder), but not a SIGHUP that is ignored (``nohup``: the process is meant to outlive the terminal)."""
    signals = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signals.append(signal.SIGHUP)
    return signals


@contextlib.contextmanager
def stop_signals() -> Iterator[list[int]]:
    """Record SIGINT/SIGTERM/SIGHUP (``_stop_signals``) instead of dying, for foreground loops that must stop their services
    cleanly; yields the list of signals received and restores the previous handlers on exit.
    Outside the main thread (where handlers cannot be installed) it records nothing.

    Usage::

        with stop_signals() as received:
            while not received:
                time.sleep(0.2)
    """
    received: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in _stop_signals():
            previous[sig] = signal.signal(sig, lambda signum, _frame: received.append(signum))
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_RECEIVED: list[int] = []  # the stop signals terminate_as_interrupt turned into KeyboardInterrupt


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Inside, SIGTERM raises KeyboardInterrupt (as Ctrl-C does), so ``finally`` blocks that put a server
    back as it was run when a job is killed politely (``kill``, a CI timeout); the previous handler after.
    Both signals are also recorded, for ``raise_if_stopped``. Outside the main thread (where handlers
    cannot be installed) it changes nothing."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        def interrupt(signum, _frame):
            _RECEIVED.append(signum)
            raise KeyboardInterrupt(f"signal {signum}")
        previous = {sig: signal.signal(sig, interrupt) for sig in _stop_signals()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _RECEIVED.clear()


def raise_if_stopped() -> None:
    """KeyboardInterrupt again where a stop signal arrived earlier: the one it raised can be swallowed by
    code that catches BaseException (an import machinery, a library's retry loop), and the work would then
    go on to its end - a build killed by a CI timeout published its version. Called between steps."""
    if _RECEIVED:
        raise KeyboardInterrupt(f"signal {_RECEIVED[-1]} (received during the previous step)")
