"""One progress reporter for the whole project: the library never prints, it reports here.

Every library function that shows progress takes ``progress: Callable[[str], object] | None``
(``None`` = silent). The CLI passes a ``Reporter``: lines go to stdout, and long steps
get a progress bar when stdout is a terminal and ``-q`` was not given. Tests pass ``None`` or a
list's ``append``.

Usage::

    from builder.core.progress import Reporter, bar, report

    reporter = Reporter(quiet=False)           # the CLI's; Reporter(quiet=True) for -q
    report(reporter, "building digits_cnn")    # a line (nothing when progress is None)
    with bar(reporter, "measuring", total=6) as advance:
        for variant in variants:
            ...
            advance()                          # a rich bar on a TTY; silent otherwise
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Iterator, TextIO

Progress = Callable[[str], object]

__all__ = ["Progress", "Reporter", "bar", "closed_pipe_safe_output", "report"]


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


class _ClosedPipeSafe:
    """sys.stdout (or sys.stderr) as the CLI uses it: once the reader of a pipe is gone (``build ... |
    head -2``), every later write goes to /dev/null instead of raising BrokenPipeError, so the command
    still does its work and ends with its own exit code. Everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def _reader_gone(self) -> None:
        # Python's recipe for SIGPIPE (docs: signal, "Note on SIGPIPE"): point the file descriptor at
        # /dev/null, so the text still buffered and the interpreter's flush at exit go nowhere quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone()
            with contextlib.suppress(BrokenPipeError):  # the buffered rest, now into /dev/null
                self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def closed_pipe_safe_output() -> Iterator[None]:
    """While inside, ``sys.stdout`` and ``sys.stderr`` survive their reader closing the pipe (see
    ``_ClosedPipeSafe``; ``... 2>&1 | head -1`` closes both); a stream without a file descriptor (a
    test's capture) is left as it is."""
    names = [name for name in ("stdout", "stderr") if _has_fileno(getattr(sys, name))]
    saved = {name: getattr(sys, name) for name in names}
    for name in names:
        setattr(sys, name, _ClosedPipeSafe(saved[name]))
    try:
        yield
    finally:
        for name in names:
            if isinstance(getattr(sys, name), _ClosedPipeSafe):
                setattr(sys, name, saved[name])


def _has_fileno(stream: TextIO | None) -> bool:
    try:
        stream.fileno()  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        return False
    return True
