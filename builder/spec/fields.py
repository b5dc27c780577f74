"""Reading one mapping of a YAML spec with errors that name the file, the field and the fix.

Usage::

    f = Fields(raw, "deploy", ("target", "instances"), origin="spec.yaml")
    target = f.choice("target", "cpu", ("cpu", "gpu", "python"))
    instances = f.integer("instances", 1, minimum=1)
    # unknown keys, wrong types and out-of-range values raise UserInputError naming 'deploy.<key>'
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import yaml

from builder.core.errors import UserInputError

# tensor names may also hold '.' and ':' (PyTorch's legacy exporter names inputs 'input.1', tf2onnx 'x:0')
TENSOR_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}\Z")

# (field, text) of every mapping's unknown keys while collect_unknown_keys runs; None: raise at once
_UNKNOWN_KEYS: ContextVar[list[tuple[str, str]] | None] = ContextVar("unknown_keys", default=None)


@contextmanager
def collect_unknown_keys(origin: str):
    """Unknown keys of every mapping read inside, reported together: a spec with two typos in two
    sections is fixed in one go. They win over any other error raised inside, which a typo often
    causes (a misspelt 'shape' is also a missing one)."""
    found: list[tuple[str, str]] = []
    token = _UNKNOWN_KEYS.set(found)
    try:
        yield
    except UserInputError:
        if not found:
            raise
    finally:
        _UNKNOWN_KEYS.reset(token)
    if len(found) == 1:
        raise UserInputError(f"{origin}: field '{found[0][0]}': {found[0][1]}") from None
    if found:
        raise UserInputError(f"{origin}: unknown keys in {len(found)} places:\n"
                             + "\n".join(f"- field '{where}': {text}" for where, text in found)) from None


class DuplicateKeyError(yaml.MarkedYAMLError):
    """A key given twice in one mapping (YAML would keep the last without a word)."""

    def __init__(self, key: Any, first_line: int, mark):
        super().__init__(problem=f"key {key!r} is given twice in one mapping (lines {first_line} and "
                                 f"{mark.line + 1}); YAML keeps only the last, so remove one", problem_mark=mark)
        self.key = key


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses duplicate keys in any mapping, at any depth."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # '<<' merges are overridden on purpose; keys that are collections are rare
                key = self.construct_object(key_node)
                try:
                    if key in seen:
                        raise DuplicateKeyError(key, seen[key], key_node.start_mark)
                    seen[key] = key_node.start_mark.line + 1
                except TypeError:  # an unhashable key: SafeLoader refuses it itself
                    continue
        return super().construct_mapping(node, deep=deep)


def validate_tensor_name(name: Any, where: str) -> str:
    """An input or output name: letters, digits, '_', '-', '.' and ':' (no paths, quotes or spaces)."""
    if not isinstance(name, str) or not TENSOR_NAME_PATTERN.match(name):
        raise UserInputError(
            f"{where}: {name!r} is not a valid tensor name; use 1-128 letters, digits, '_', '-', '.' and ':' "
            "(starting with a letter, digit or '_'; no '/', quotes or spaces), e.g. input_ids or input.1"
        )
    return name


def read_yaml(path: Path) -> Any:
    """The YAML data of a spec file; a syntax error, a key given twice or an empty file is a
    UserInputError naming the file and the line."""
    raw = path.read_bytes()
    try:
        # UTF-8 whatever the locale (LC_ALL=C made read_text() ASCII: a UnicodeDecodeError traceback);
        # utf-8-sig takes a byte-order mark off, as editors on Windows write one
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise UserInputError(f"{path.name}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at line {line}); save it "
                             "as UTF-8") from None
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except DuplicateKeyError as exc:
        raise UserInputError(f"{path.name}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserInputError(f"{path.name}: not valid YAML{where}: {getattr(exc, 'problem', exc)}; fix the syntax") from None
    if data is None:  # an empty file, or one of comments only
        raise UserInputError(f"{path.name} is empty: write the model spec in it (name, source, inputs, outputs, "
                             "max_batch_size; see the README's Spec reference)")
    return data


def is_number(value: Any) -> bool:
    """An int or float that is finite: YAML's .nan/.inf would switch a comparison-based check off."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Fields:
    """Reads one mapping of the YAML, remembering where it is for error messages."""

    def __init__(self, data: Any, where: str, known: tuple[str, ...], origin: str):
        self.where = where
        self.origin = origin
        if not isinstance(data, dict):
            raise self.error(f"must be a mapping with keys {', '.join(known)}; got {type(data).__name__}")
        unknown = sorted(set(map(str, data)) - set(known))
        if unknown:
            text = f"unknown key(s) {', '.join(repr(u) for u in unknown)}; known keys: {', '.join(known)}"
            found = _UNKNOWN_KEYS.get()
            if found is None:
                raise self.error(text)
            found.append((self.label(), text))  # reported with every other mapping's, by collect_unknown_keys
            data = {k: v for k, v in data.items() if str(k) in known}  # read on without them
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
        if must_exist and resolved.is_dir():
            raise self.error(f"{resolved} is a directory; give the file itself (relative paths resolve against "
                             f"{base})", key)
        if must_exist and not resolved.is_file():
            raise self.error(f"file not found: {resolved} (relative paths resolve against {base})", key)
        return resolved
