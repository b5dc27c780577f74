"""The `triton-builder` command: one module per verb family, each verb forwarding to one library
function (build.py: init, build, validate, select, clean, releases, run; serving.py: serve, check;
tuning.py: loadtest, sweep, tune; scaleout.py: register, publish, replicas, k8s).

One grammar on every verb (arguments.py, docs/reference/grammar.md): a model is NAME with --repository;
-o table|json; -q/-v; durations as 30, 90s, 2m or 1h; writes only with an explicit flag.

Exit codes: 0 success; 1 verification/check/budget failure; 2 user input or server unreachable
(see builder/core/errors.py); 3 an internal error (a bug: one line, the traceback in a file it names);
130 stopped by Ctrl-C or SIGTERM. Errors print one clear message, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import signal
import sys
from pathlib import Path

from builder.api import DEFAULT_REPOSITORY  # noqa: F401 - the one default, re-exported for the verbs
from builder.cli import build, scaleout, serving, tuning
from builder.cli.output import json_mode, wants_json
from builder.core.errors import BuilderError
from builder.core.interrupts import terminate_as_interrupt
from builder.core.progress import Reporter, closed_pipe_safe_output


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton-builder")
    except PackageNotFoundError:
        return "unknown (not installed: run `pip install .` or `make setup`)"


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true",
                        help="only results, notes and errors: no progress lines or bars")
    common.add_argument("-v", "--verbose", action="store_true",
                        help="more detail in the progress lines, and an internal error's traceback")
    return common


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triton-builder", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    common = _common_options()
    for family in (build, serving, tuning, scaleout):
        family.register(sub, common)
    return parser


_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# the file system refusing a write is the user's to fix, wherever the verb's own checks missed it
_FILE_SYSTEM_FIXES = {
    errno.EROFS: "the file system is mounted read-only: write elsewhere (another --repository or --out) or "
                 "remount it read-write",
    errno.EACCES: "permission denied: run as a user who may write there, or write elsewhere",
    errno.EPERM: "operation not permitted: run as a user who may write there, or write elsewhere",
    errno.ENOSPC: "no space left on the device: free some space or write elsewhere",
    errno.EDQUOT: "disk quota exceeded: free some space or write elsewhere",
}
# verbs that only read the repository: "write elsewhere" is no advice for them
READ_ONLY_VERBS = ("validate", "check", "serve")


def _closed_folder(path: Path) -> Path | None:
    """The first folder on the way to ``path`` this user may not enter: a stat of a file below it fails
    with EACCES although that file may not even exist, so the folder is what to name."""
    for folder in reversed(path.absolute().parents):
        if folder.is_dir() and not os.access(folder, os.X_OK):
            return folder
    return None


def file_system_error(exc: OSError, reading: bool = False) -> str | None:
    """The one-line message for an OSError the user can fix (a read-only mount, permissions, a full
    disk), naming the file; None for any other OSError (a bug: exit 3, see internal_error). ``reading``:
    the verb only reads, so permission advice is about reading, not writing."""
    fix = _FILE_SYSTEM_FIXES.get(exc.errno or 0)
    if fix is None:
        return None
    where = f"{exc.filename}: " if exc.filename is not None else ""
    if exc.filename2 is not None:  # a rename's target
        where = f"{exc.filename} -> {exc.filename2}: "
    closed = _closed_folder(Path(os.fsdecode(exc.filename))) if exc.errno == errno.EACCES and exc.filename else None
    if closed is not None:
        owner = _owner(closed)
        return (f"{closed}: permission denied: this user may not enter that folder ({owner}), so nothing below it "
                f"can be {'read' if reading else 'reached'}; make it readable and enterable (chmod 755 {closed}; "
                "builds now create their folders 0755) or run as a user who may")
    if exc.errno in (errno.EACCES, errno.EPERM) and reading:
        fix = (f"{'permission denied' if exc.errno == errno.EACCES else 'operation not permitted'}: this user may "
               "not read it: make it readable (chmod a+r for files, a+rx for folders) or run as a user who may")
    return f"{where}{exc.strerror or os.strerror(exc.errno)}; {fix}"


def _owner(folder: Path) -> str:
    import pwd
    import stat

    info = folder.stat()
    try:
        name = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        name = str(info.st_uid)
    return f"{stat.filemode(info.st_mode)}, owner {name}"


def _creatable(folder: Path) -> bool:
    """Whether ``folder`` is, or could be made, a writable folder (its nearest existing ancestor)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def quiet_environment() -> None:
    """Before any library is imported: onnxruntime 1.31 (its 1DS telemetry, read from
    ORT_DISABLE_TELEMETRY) otherwise queues events and a device id under ~/.cache/Microsoft on every
    build, validate or serve, and warns in colour under -q when HOME is read-only; matplotlib warns
    under -q when its config/cache folder in HOME cannot be written, so it gets a private temp folder.
    A value the user set is kept."""
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    if "MPLCONFIGDIR" in os.environ:
        return
    home = Path(os.path.expanduser("~"))
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "matplotlib"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "matplotlib"
    if _creatable(config) and _creatable(cache):
        return
    import tempfile

    private = Path(tempfile.gettempdir()) / f"triton-builder-matplotlib-{os.getuid()}"
    try:
        private.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return  # no writable temp folder either: matplotlib says so itself
    if private.is_dir() and not private.is_symlink() and private.stat().st_uid == os.getuid():
        os.environ["MPLCONFIGDIR"] = str(private)


def internal_error(exc: BaseException, verbose: bool = False) -> int:
    """Exit 3 for an exception nothing else explained (a triton-builder bug): one line naming it and the
    file its traceback went to, for the report; under -v the traceback is printed as well. Exit 1 (as a
    traceback gave) would read as a verification failure in CI."""
    import tempfile
    import traceback

    trace = "".join(traceback.format_exception(exc))
    where = "the traceback below"
    try:
        handle, name = tempfile.mkstemp(prefix="triton-builder-traceback-", suffix=".txt")
        with os.fdopen(handle, "w", encoding="utf-8", errors="backslashreplace") as out:
            out.write(f"triton-builder {_version()}, Python {sys.version.split()[0]}\n"
                      f"command: {' '.join(sys.argv)}\n\n{trace}")
        where = name
    except OSError:
        verbose = True  # no file to keep it in: print it, or the report has nothing to go on
    text = _ESCAPES.sub("", _one_line(str(exc)))
    print(f"error: internal error (a triton-builder bug): {type(exc).__name__}: {text}; please report it with "
          f"the traceback: {where}", file=sys.stderr, flush=True)
    if verbose:
        print(trace, file=sys.stderr, end="", flush=True)
    return 3


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + " ..."


def main(argv: list[str] | None = None) -> int:
    quiet_environment()
    parser = make_parser()
    args = parser.parse_args(argv)
    # an ASCII-only locale (LC_ALL=C): non-ASCII text from a spec in a printed line comes out escaped
    # instead of ending the command in a UnicodeEncodeError (stderr does this by default)
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(errors="backslashreplace")
    # a closed stdout (`build ... | head -2`) stops the printing, never the build: it still publishes and
    # ends with its own exit code (stderr too: `2>&1 | head` closes both)
    with closed_pipe_safe_output(), json_mode(wants_json(args)):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    reporter = Reporter(quiet=args.quiet, verbose=args.verbose)  # under -o json sys.stdout is stderr

    try:
        # SIGTERM (kill, a CI timeout) unwinds like Ctrl-C: a build's finally removes its work folder;
        # serve's own stop_signals still turns it into a clean stop
        with terminate_as_interrupt():
            return int(args.func(args, reporter) or 0)
    except BuilderError as exc:
        # terminal escapes in texts quoted from other libraries (torch's unpickler bolds its own name)
        text = _ESCAPES.sub("", str(exc))
        print(f"error: {text}", file=sys.stderr, flush=True)
        return exc.exit_code
    except OSError as exc:
        text = file_system_error(exc, reading=args.command in READ_ONLY_VERBS)
        if text is None:
            return internal_error(exc, args.verbose)
        print(f"error: {text}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt as exc:
        by = " by SIGTERM" if str(exc) == f"signal {int(signal.SIGTERM)}" else ""
        print(f"interrupted{by}; stopped after cleaning up", file=sys.stderr, flush=True)
        return 130
    except Exception as exc:  # noqa: BLE001 - the last resort: a bug gets exit 3 and a report, not a traceback
        return internal_error(exc, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
