"""The one grammar every verb shares (docs/reference/grammar.md), and the argument types behind it.

- a model is ``NAME`` with ``--repository`` (default ``model_repository`` on every verb): ``add_model``;
- a version of it is ``--model-version`` (``--version`` stays the tool's own): ``add_model_version``;
- every duration takes seconds or ``90s`` / ``2m`` / ``1h``: ``type=duration``;
- old spellings keep working for one release and say so on stderr: ``deprecated_alias``.

Usage::

    add_model(p)                                   # NAME + --repository
    p.add_argument("--window", type=duration, default=0.5)
    deprecated_alias(p, "--json", "-o json", dest="output", const="json")
"""

from __future__ import annotations

import argparse
import math
import re
import sys

from builder.api import DEFAULT_REPOSITORY
from builder.core.errors import UserInputError

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def finite_float(text: str) -> float:
    """A float that is a number: 'nan' and 'inf' parse as floats but pass every '<= 0' check and switch
    limits off silently (a p99 SLO of nan was 'met')."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"'{text}' is not a finite number")
    return value


def duration(text: str) -> float:
    """Every duration option's type: seconds (``30``, ``0.5``) or a number with a unit (``90s``, ``2m``,
    ``1.5h``) -> seconds as a float. Negative, 'nan' and 'inf' durations are refused."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh]?)\s*", str(text).lower())
    if not match:
        if _is_float(text):  # 'nan', 'inf': "not a finite number"; '-1': a number, but no duration
            finite_float(text)
        raise argparse.ArgumentTypeError(f"'{text}' is not a duration: give seconds (30, 0.5) or a number with "
                                         "s, m or h (90s, 2m, 1h)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def note(message: str) -> None:
    """One line on stderr (never stdout: ``-o json`` keeps it one JSON document), even under -q."""
    print(f"note: {message}", file=sys.stderr, flush=True)


def deprecation(old: str, new: str) -> None:
    note(f"{old} is deprecated, use {new} (the old spelling goes in the next release)")


class _Deprecated(argparse.Action):
    """An old spelling of an option: stores as its replacement does (a value, a constant, or appended),
    after a note on stderr naming the new spelling."""

    def __init__(self, option_strings, dest, use: str = "", mode: str = "store", **kwargs):
        self.use, self.mode = use, mode
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        deprecation(option_string or self.option_strings[0], self.use)
        if self.mode == "append":
            setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), values])
        else:
            setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def deprecated_alias(p: argparse.ArgumentParser, old: str, use: str, *, dest: str, const=None, type=None,
                     append: bool = False, choices=None, metavar=None) -> argparse.Action:
    """``old`` kept for one release as a spelling of ``use``: a flag (``const``: what it stores) or an
    option taking a value (``type``; ``append``: repeatable). Its help says what replaces it."""
    kwargs = {"nargs": 0, "const": const} if const is not None else {"type": type, "metavar": metavar}
    return p.add_argument(old, action=_Deprecated, use=use, mode="append" if append else "store", dest=dest,
                          default=argparse.SUPPRESS, choices=choices, help=f"deprecated: use {use}", **kwargs)


def add_repository(p: argparse.ArgumentParser, what: str = "model repository: a folder or an s3:// URL") -> None:
    p.add_argument("--repository", default=DEFAULT_REPOSITORY, help=f"{what} (default: %(default)s)")


def add_model(p: argparse.ArgumentParser, what: str = "model repository: a folder or an s3:// URL",
              nargs: str | None = None, help: str = "model name") -> None:
    """The positional NAME (``nargs``: '?' optional, '*' several) and its --repository."""
    p.add_argument("name", nargs=nargs, metavar="NAME", help=help)
    add_repository(p, what)


def add_model_version(p: argparse.ArgumentParser, help: str) -> None:
    """--model-version N; --version N kept as its deprecated spelling (the top level's --version is the tool's)."""
    p.add_argument("--model-version", type=int, metavar="N", help=help)
    deprecated_alias(p, "--version", "--model-version", dest="model_version", type=int, metavar="N")


def add_output(p: argparse.ArgumentParser) -> None:
    """-o table|json (--json: its deprecated spelling): json prints one JSON document on stdout."""
    p.add_argument("-o", "--output", choices=("table", "json"), default="table",
                   help="table: lines for people; json: one JSON document on stdout, progress on stderr "
                        "(default: %(default)s)")
    deprecated_alias(p, "--json", "-o json", dest="output", const="json")


def model_folder_form(name: str, repository: str, verb: str) -> tuple[str, str]:
    """``(NAME, REPOSITORY)`` from a positional that may still be the old ``DIR/NAME`` (a note says so);
    a plain NAME not in REPOSITORY but a model folder here (the old ``cd repo; verb NAME``) too."""
    from pathlib import Path

    if "/" in name or "\\" in name:
        folder = Path(name.rstrip("/\\"))
        if repository != DEFAULT_REPOSITORY and Path(repository).resolve() != folder.parent.resolve():
            raise UserInputError(f"{name} and --repository {repository}: name the model once, as NAME --repository "
                                 f"DIR (e.g. {verb} {folder.name} --repository {repository})")
        deprecation(f"{verb} DIR/NAME", f"{verb} NAME --repository DIR ({verb} {folder.name} --repository "
                                        f"{folder.parent})")
        return folder.name, str(folder.parent)
    if (repository == DEFAULT_REPOSITORY and not (Path(repository) / name).is_dir()
            and (Path(name) / "config.pbtxt").is_file()):
        deprecation(f"{verb} NAME for the model folder ./{name}", f"{verb} {name} --repository .")
        return name, "."
    return name, repository
