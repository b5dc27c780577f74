"""A verb's result, as lines for people or as one JSON document for CI pipelines (``-o json``).

Under ``-o json`` the whole command runs with ``sys.stdout`` pointed at stderr (progress, notes, any
stray print), and ``emit`` alone writes to the real stdout: one JSON document, nothing else.

Usage::

    emit(args, report, report.lines())        # a report: its fields, "ok" and the human "lines"
    emit(args, {"removed": [...]}, lines)     # a dict: as it is, with "lines"
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator

_RESULT_STREAM: list[Any] = []  # the real stdout while a -o json command runs


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if callable(value):  # an injected function (a runner): nothing a pipeline can use
        return None
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    return value


def report_dict(report: Any) -> dict[str, Any]:
    data = _plain(report)
    data["ok"] = bool(report.ok)
    data["lines"] = list(report.lines())
    return data


def add_signature_arguments(p) -> None:
    """--public-key / --require-signature, shared by validate and serve."""
    p.add_argument("--public-key", help="verify each version's model.sig with this public key (PEM) and refuse a "
                   "changed file (default: $TRITON_BUILDER_PUBLIC_KEY)")
    p.add_argument("--require-signature", action="store_true", help="refuse unsigned versions (needs a public key)")


def print_json(report: Any) -> None:
    emit_json(report_dict(report))


def emit_json(data: Any) -> None:
    stream = _RESULT_STREAM[-1] if _RESULT_STREAM else sys.stdout
    print(json.dumps(_plain(data), indent=2, default=str), file=stream, flush=True)


def wants_json(args: Any) -> bool:
    return getattr(args, "output", "table") == "json"


def emit(args: Any, result: Any, lines: Iterable[str] = (), ok: bool | None = None) -> None:
    """The verb's result: under -o json one JSON document (a dataclass's fields or a dict's keys, plus
    "ok" and the human "lines"), else ``lines`` printed one per line."""
    lines = list(lines)
    if not wants_json(args):
        for line in lines:
            print(line)
        return
    data = _plain(result)
    if not isinstance(data, dict):
        data = {"result": data}
    if ok is None:
        ok = bool(getattr(result, "ok", data.get("ok", True)))
    data["ok"] = ok
    data.setdefault("lines", lines)
    emit_json(data)


@contextlib.contextmanager
def json_mode(on: bool) -> Iterator[None]:
    """While a -o json command runs: everything printed goes to stderr, ``emit`` to the real stdout."""
    if not on:
        yield
        return
    _RESULT_STREAM.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _RESULT_STREAM.pop()
