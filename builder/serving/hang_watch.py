"""``serve``'s watch on its own tritonserver: a server that stops answering its health endpoint while
its process lives on (a crash that left it hung: heap corruption once did) is announced once, loudly,
with its log; and again when it answers. It is never stopped for it: a server that is only overloaded
recovers, and whoever runs ``serve`` decides (stopping serve keeps the log of a hung server).

Usage::

    with HangWatch(server, announce, interval=10.0, misses=3):
        while not received:              # serve's loop
            time.sleep(0.2)
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Callable

from builder.core.processes import http_get
from builder.serving import server_log

if TYPE_CHECKING:
    from builder.serving.embedded import EmbeddedServer

__all__ = ["HANG_PROBE_INTERVAL_S", "HANG_PROBE_MISSES", "Silence", "HangWatch"]

HANG_PROBE_INTERVAL_S = 10.0
HANG_PROBE_MISSES = 3  # in a row: ~30 s without an answer; one slow answer under load is no hang
_PROBE_TIMEOUT_S = 5.0


class Silence:
    """The bookkeeping of a watch, apart from its clock and probes: ``observe(answered, now)`` returns
    ``("hung", seconds)`` when ``misses`` probes in a row went unanswered (once per silence),
    ``("back", seconds)`` when an answer ends a silence that was announced, else None; seconds count
    from the last answer (or from ``now`` given at construction)."""

    def __init__(self, misses: int, now: float):
        if misses < 1:
            raise ValueError(f"misses must be at least 1, got {misses}")
        self.misses = misses
        self.last_answer = now
        self.missed = 0
        self.announced = False

    def observe(self, answered: bool, now: float) -> tuple[str, float] | None:
        if answered:
            event = ("back", now - self.last_answer) if self.announced else None
            self.last_answer, self.missed, self.announced = now, 0, False
            return event
        self.missed += 1
        if self.missed >= self.misses and not self.announced:
            self.announced = True
            return ("hung", now - self.last_answer)
        return None


class HangWatch:
    """Probe ``GET /v2/health/live`` of ``server`` every ``interval`` s on a daemon thread while inside
    ``with``; any HTTP answer counts (a server shutting down answers 4xx). ``announce`` gets the
    warning when ``misses`` probes in a row went unanswered, and one line when it answers again.
    A process that has ended is left to serve's own loop, which reports the exit."""

    def __init__(self, server: "EmbeddedServer", announce: Callable[[str], object],
                 interval: float = HANG_PROBE_INTERVAL_S, misses: int = HANG_PROBE_MISSES):
        if not interval > 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.server = server
        self.announce = announce
        self.interval = float(interval)
        self.silence = Silence(misses, time.monotonic())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tritonserver-hang-watch", daemon=True)

    def __enter__(self) -> "HangWatch":
        self.silence.last_answer = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        # before the server is stopped: a server that stops answering because it is told to is no hang
        self._stop.set()
        self._thread.join(_PROBE_TIMEOUT_S + 1.0)

    def _run(self) -> None:
        url = f"http://{self.server.http_url}/v2/health/live"
        while not self._stop.wait(self.interval):
            if not self.server.is_running():
                return
            try:
                answered = http_get(url, timeout=min(_PROBE_TIMEOUT_S, self.interval))[0] is not None
            except Exception:  # a garbled answer (http.client.HTTPException) is no answer; the watch goes on
                answered = False
            if self._stop.is_set() or not self.server.is_running():
                return
            event = self.silence.observe(answered, time.monotonic())
            if event is not None:
                self.announce(self.message(*event))

    def message(self, event: str, seconds: float) -> str:
        url = self.server.http_url
        if event == "back":
            return f"tritonserver at {url} answers again, after {seconds:.0f} s without an answer"
        crash = server_log.crash_marks(self.server.read_log())
        said = "\n  its log reports a crash:" + "".join(f"\n    {line}" for line in crash) if crash else ""
        return (f"WARNING: tritonserver at {url} (pid {self.server.pid}) has not answered for {seconds:.0f} s "
                f"(hung?); its log: {self.server.log_path}{said}\n  serve leaves it running and goes on waiting; "
                "Ctrl-C or SIGTERM stops it, and keeps that log if it has to be killed")
