"""Reading one mapping of a YAML spec with errors that name the file, the field and the fix.

Usage::

    f = Fields(raw, "deploy", ("target", "instances"), origin="spec.yaml")
    target = f.choice("target", "embedded", ("embedded", "cpu", "gpu"))
    instances = f.integer("instances", 1, minimum=1)
    # unknown keys, wrong types and out-of-range values raise UserInputError naming 'deploy.<key>'
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from builder.errors import UserInputError

# tensor names may also hold '.' and ':' (PyTorch's legacy exporter names inputs 'input.1', tf2onnx 'x:0')
TENSOR_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$")


def validate_tensor_name(name: Any, where: str) -> str:
    """An input or output name: letters, digits, '_', '-', '.' and ':' (no paths, quotes or spaces)."""
    if not isinstance(name, str) or not TENSOR_NAME_PATTERN.match(name):
        raise UserInputError(
            f"{where}: {name!r} is not a valid tensor name; use 1-128 letters, digits, '_', '-', '.' and ':' "
            "(starting with a letter, digit or '_'; no '/', quotes or spaces), e.g. input_ids or input.1"
        )
    return name


class Fields:
    """Reads one mapping of the YAML, remembering where it is for error messages."""

    def __init__(self, data: Any, where: str, known: tuple[str, ...], origin: str):
        self.where = where
        self.origin = origin
        if not isinstance(data, dict):
            raise self.error(f"must be a mapping with keys {', '.join(known)}; got {type(data).__name__}")
        unknown = sorted(set(map(str, data)) - set(known))
        if unknown:
            raise self.error(
                f"unknown key(s) {', '.join(repr(u) for u in unknown)}; known keys: {', '.join(known)}"
            )
        self.data = data

    def label(self, key: str | None = None) -> str:
        if key is None:
            return self.where or "(top level)"
        return f"{self.where}.{key}" if self.where else key

    def error(self, text: str, key: str | None = None) -> UserInputError:
        return UserInputError(f"{self.origin}: field '{self.label(key)}': {text}")

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def require(self, key: str, hint: str) -> Any:
        if key not in self.data or self.data[key] is None:
            raise self.error(f"missing; {hint}", key)
        return self.data[key]

    def integer(self, key: str, default: int | None, minimum: int | None = None) -> int | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"must be an integer, got {value!r}", key)
        if minimum is not None and value < minimum:
            raise self.error(f"must be >= {minimum}, got {value}", key)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.error(f"must be true or false, got {value!r}", key)
        return value

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.data.get(key, default)
        if value not in choices:
            raise self.error(f"{value!r} is not supported; use one of: {', '.join(choices)}", key)
        return value

    def int_list(self, key: str, minimum: int = 1, allow_dynamic: bool = False) -> list[int] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.error(f"must be a list of integers, got {value!r}", key)
        for v in value:
            if not (v >= minimum or (allow_dynamic and v == -1)):
                allowed = f">= {minimum}" + (" or -1 (dynamic)" if allow_dynamic else "")
                raise self.error(f"every entry must be {allowed}, got {v}", key)
        return list(value)

    def path(self, key: str, base: Path, must_exist: bool = True) -> Path | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.error(f"must be a file path, got {value!r}", key)
        resolved = (base / value).resolve() if not Path(value).is_absolute() else Path(value)
        if must_exist and not resolved.is_file():
            raise self.error(f"file not found: {resolved} (relative paths resolve against {base})", key)
        return resolved
