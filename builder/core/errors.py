"""Errors raised by triton-builder, and the policy for using them.

Policy
------
- ``UserInputError`` (exit 2): the user can fix it by editing the spec, a file or an argument.
  The message names the field or file and says how to fix it. Raised *before* anything is
  written. The CLI prints the message alone, never a traceback.
- ``VerificationError`` (exit 1): the build ran but a numerical check failed. The message lists
  every failing output with its numbers, one per line::

      onnx failed verification:
      - logits: rel L2 3.1e-02 > 1e-05 (max abs 2.0e-01, cosine 0.9990)

- ``ServerError`` (exit 2): a server could not be reached, started or made ready; the message
  quotes the server's own reason where it has one.
- ``BuilderError``: the base; catch it to handle all of the above. Anything else escaping the
  library is a bug and keeps its traceback.

Usage::

    from builder.core.errors import UserInputError
    raise UserInputError("spec.yaml: field 'name': '../x' ... use letters, digits, '_' and '-'")

The API names its parameters, not the CLI's flags
-------------------------------------------------
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


class BuilderError(Exception):
    """Base of every error the library raises on purpose."""

    exit_code = 1


class UserInputError(BuilderError):
    """Bad spec, file or argument: fixable by the user. Exit code 2."""

    exit_code = 2


class VerificationError(BuilderError):
    """A variant's outputs differ from the reference beyond tolerance. Exit code 1."""

    exit_code = 1

    def __init__(self, message: str, failures: list[str] | None = None):
        self.failures = list(failures or [])
        if self.failures:
            message = message + "\n" + "\n".join(f"- {line}" for line in self.failures)
        super().__init__(message)


class InternalError(BuilderError):
    """A bug in triton-builder (e.g. a config it generated that Triton's rules reject), never the
    user's input nor a numerical failure. Exit code 3; the message says to report it."""

    exit_code = 3

    def __init__(self, message: str):
        super().__init__(f"internal error (a triton-builder bug; please report it with the spec): {message}")


class ServerError(BuilderError):
    """The server could not be started, reached, or made ready. Exit code 2."""

    exit_code = 2


class ServerDiedError(ServerError):
    """The server process ended while we relied on it."""


class LoadRefused(ServerError):
    """The server answered a model-control load with an error (tune stops there: the next candidate is loaded alike)."""


def unknown_choice(kind: str, name: str, known: list[str] | tuple[str, ...], how_to_add: str = "") -> UserInputError:
    """The registry error: names the unknown thing, lists the supported ones and how to add one."""
    text = f"unknown {kind} '{name}'; supported: {', '.join(sorted(known))}"
    if how_to_add:
        text += f". To add one: {how_to_add}"
    return UserInputError(text)

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
