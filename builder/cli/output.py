"""Machine-readable output for CI pipelines: ``--json`` prints a verb's report as one JSON object.

Usage::

    if args.json:
        print_json(report)   # a dataclass report: its fields, plus "ok" and the human "lines"
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
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
    print(json.dumps(report_dict(report), indent=2, default=str))
