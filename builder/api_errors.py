"""Errors of the Python API name its parameters, not the CLI's flags.

The library's checks are shared by the CLI and the API, and their messages name the CLI's flags
(``--load-seconds 0: give ...``). A function of builder/api.py wrapped with ``names_parameters`` re-raises
such a UserInputError with each flag that is one of its parameters written as the parameter
(``users 0: give ...``); the CLI calls the library directly and keeps its flags.

Usage::

    @names_parameters
    def loadtest(name: str, *, users: int = 8, ...): ...
    # UserInputError("--users 0: give a whole number ...") -> UserInputError("users 0: give a whole number ...")
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Callable, TypeVar

from builder.errors import UserInputError

F = TypeVar("F", bound=Callable)
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")


#: CLI flags spelt unlike the API parameter they set (flag -> parameter); a flag not here maps by its own name
ALIASES = {"model-version": "version", "run-time": "run_time_s", "timeout": "timeout_s", "out": "out_dir",
           "window": "window_s", "seconds-per-level": "max_seconds_per_level", "server-cores": "usable_cores",
           "instances": "instance_counts", "threads": "thread_counts", "load-seconds": "run_time_s"}


def as_parameters(message: str, parameters: set[str]) -> str:
    """``message`` with every ``--flag`` that sets one of ``parameters`` written as that parameter."""
    def swap(match: re.Match) -> str:
        name = ALIASES.get(match.group(1), match.group(1).replace("-", "_"))
        if name not in parameters and match.group(1).replace("-", "_") in parameters:
            name = match.group(1).replace("-", "_")
        return name if name in parameters else match.group(0)

    return _FLAG.sub(swap, message)


def names_parameters(function: F) -> F:
    parameters = set(inspect.signature(function).parameters)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except UserInputError as exc:
            text = str(exc)
            renamed = as_parameters(text, parameters)
            if renamed == text:
                raise
            raise type(exc)(renamed) from exc

    return wrapper  # type: ignore[return-value]
