"""One progress reporter for the whole project: the library never prints, it reports here.

Every library function that shows progress takes ``progress: Callable[[str], object] | None``
(``None`` = silent). The CLI passes a ``Reporter``: lines go to stdout, and long steps
get a progress bar when stdout is a terminal and ``-q`` was not given. Tests pass ``None`` or a
list's ``append``.

Usage::

    from builder.progress import Reporter, bar, report

    reporter = Reporter(quiet=False)           # the CLI's; Reporter(quiet=True) for -q
    report(reporter, "building digits_cnn")    # a line (nothing when progress is None)
    with bar(reporter, "measuring", total=6) as advance:
        for variant in variants:
            ...
            advance()                          # a rich bar on a TTY; silent otherwise
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator, TextIO

Progress = Callable[[str], object]

__all__ = ["Progress", "Reporter", "bar", "report"]


class Reporter:
    """Prints progress lines (unless quiet) and draws bars on a terminal (unless quiet).

    ``verbose`` adds the lines marked as detail (``report(..., detail=True)``)."""

    def __init__(self, quiet: bool = False, verbose: bool = False, stream: TextIO | None = None) -> None:
        self.quiet = quiet
        self.verbose = verbose
        self.stream = stream or sys.stdout
        self._live = None  # the rich Progress while a bar is shown

    @property
    def interactive(self) -> bool:
        return not self.quiet and hasattr(self.stream, "isatty") and self.stream.isatty()

    def __call__(self, message: str) -> None:
        if self.quiet:
            return
        if self._live is not None:  # print above the bar instead of through it
            self._live.console.print(message, markup=False, highlight=False)
            return
        print(message, file=self.stream, flush=True)

    def detail(self, message: str) -> None:
        if self.verbose:
            self(message)

    @contextlib.contextmanager
    def bar(self, description: str, total: float | None) -> Iterator[Callable[..., None]]:
        if not self.interactive or self._live is not None:
            yield _no_advance
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

        live = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                        console=Console(file=self.stream), transient=True)
        task = live.add_task(description, total=total)
        self._live = live
        try:
            with live:
                yield lambda amount=1.0: live.advance(task, amount)
        finally:
            self._live = None


def _no_advance(amount: float = 1.0) -> None:
    return None


def report(progress: Progress | None, message: str, detail: bool = False) -> None:
    """Send one line to ``progress`` (no-op for None; detail lines only to a verbose Reporter)."""
    if progress is None:
        return
    if detail:
        if isinstance(progress, Reporter):
            progress.detail(message)
        return
    progress(message)


def bar(progress: Progress | None, description: str, total: float | None) -> contextlib.AbstractContextManager:
    """A progress bar context yielding ``advance(amount=1)``; silent unless ``progress`` is an
    interactive Reporter."""
    if isinstance(progress, Reporter):
        return progress.bar(description, total)
    return contextlib.nullcontext(_no_advance)
