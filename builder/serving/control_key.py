"""Who may change a server: the key that Triton's restricted APIs ask for, and how our clients send it.

Every server this project starts (``serve``, ``replicas``, docker-compose, Kubernetes) answers the
API groups in ``RESTRICTED`` only to requests carrying the header ``triton-builder-control-key`` with
the server's key: loading and unloading models and the repository index (model-repository), shared
memory regions, log settings and traces. Inference, health, metadata, statistics and model-config
stay open (statistics feed tune, sweeps, the exporter and the dashboards; model-config is the read-only
``GET /v2/models/<m>/config``: loading a model with another config goes through model-repository).

The key is ``$TRITON_BUILDER_CONTROL_KEY`` when set (required by docker-compose and the Kubernetes
manifests), else a random one made for each server start, held in memory and never written out or
logged. Our clients find it by the server's address (``register``, done by ``EmbeddedServer``), else
in ``$TRITON_BUILDER_CONTROL_KEY`` (a server started elsewhere). Measured on Triton 2.51:

- HTTP: ``--http-restricted-api=<api>,<api>:<header>=<value>`` (the ``<apis>,<key>=<value>`` form that
  ``--help`` prints is refused at start); a request without the header (or with another value) gets
  403 ``{"error":"This API is restricted, expecting header 'triton-builder-control-key'"}``.
- gRPC: ``--grpc-restricted-protocol=`` the same; the client must send the header prefixed with
  ``triton-grpc-protocol-``; a refusal is status UNAVAILABLE "This protocol is restricted, expecting
  header 'triton-grpc-protocol-triton-builder-control-key'" (not a server that is down).
- Triton does not print the key in its log; its command line (``/proc/<pid>/cmdline``) shows it to
  local users: the key keeps out whoever reaches the ports, not accounts on the same host.

Usage::

    key = new_key()                              # $TRITON_BUILDER_CONTROL_KEY, else a random one
    args = server_args(key)                      # the two tritonserver flags
    shown = masked(cmd, key)                     # the command line fit for a log
    register(["127.0.0.1:8000", "127.0.0.1:8001"], key); key_for("127.0.0.1:8001") == key
    headers("grpc", key)                         # {"triton-grpc-protocol-triton-builder-control-key": key}
"""

from __future__ import annotations

import os
import re
import secrets
import threading
from typing import Iterable, Sequence

from builder.core.errors import UserInputError

__all__ = ["ENV", "HEADER", "GRPC_HEADER", "RESTRICTED", "new_key", "env_key", "server_args", "masked",
           "register", "forget", "key_for", "headers", "announcement", "is_refusal", "refusal_hint"]

ENV = "TRITON_BUILDER_CONTROL_KEY"
HEADER = "triton-builder-control-key"
GRPC_HEADER = "triton-grpc-protocol-" + HEADER  # Triton's gRPC server looks for this metadata key
#: the API groups that need the key (Triton's names; the same on HTTP and gRPC)
RESTRICTED = ("model-repository", "shared-memory", "logging", "trace")
MASK = "***"
_VALID = re.compile(r"^[A-Za-z0-9._~-]{8,256}\Z")
_REFUSALS = ("This API is restricted", "This protocol is restricted")

_keys: dict[str, str] = {}
_lock = threading.Lock()


def env_key() -> str | None:
    """``$TRITON_BUILDER_CONTROL_KEY`` (checked), or None when unset or empty."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    if not _VALID.match(value):
        raise UserInputError(f"${ENV}: use 8 to 256 characters among letters, digits and . _ ~ - (it goes into an "
                             "HTTP header and a tritonserver flag); e.g. python -c 'import secrets; "
                             "print(secrets.token_urlsafe(32))'")
    return value


def new_key() -> str:
    """The key for a server about to start: ``$TRITON_BUILDER_CONTROL_KEY``, else a new random one."""
    return env_key() or secrets.token_urlsafe(32)


def server_args(key: str) -> list[str]:
    """The ``tritonserver`` flags that restrict ``RESTRICTED`` to requests carrying ``key``."""
    apis = ",".join(RESTRICTED)
    return [f"--http-restricted-api={apis}:{HEADER}={key}", f"--grpc-restricted-protocol={apis}:{HEADER}={key}"]


def masked(args: Sequence[str], key: str | None) -> list[str]:
    """``args`` with ``key`` replaced by ``***`` wherever it occurs (for logs and messages)."""
    return [str(a) if not key else str(a).replace(key, MASK) for a in args]


def register(addresses: Iterable[str], key: str) -> None:
    """Our clients of these ``host:port`` addresses (in this process) send ``key``."""
    with _lock:
        for address in addresses:
            _keys[address] = key


def forget(addresses: Iterable[str]) -> None:
    with _lock:
        for address in addresses:
            _keys.pop(address, None)


def key_for(address: str) -> str | None:
    """The key for the server at ``address``: one this process started (``register``), else the env var."""
    with _lock:
        known = _keys.get(address)
    return known or env_key()


def headers(protocol: str, key: str | None) -> dict[str, str] | None:
    """The request headers (gRPC metadata) that carry ``key``; None without a key."""
    if not key:
        return None
    return {GRPC_HEADER if protocol == "grpc" else HEADER: key}


def announcement(key: str) -> str:
    """The line ``serve``/``replicas`` print about who may change the server (never the key itself)."""
    where = (f"the key in ${ENV}" if key == env_key() else
             f"a key made for this start (not shown; set ${ENV} before starting to control it from another process)")
    return f"  control  {', '.join(RESTRICTED)} need header {HEADER} with {where}"


def is_refusal(message: str) -> bool:
    """Whether Triton's answer is a restricted API refusing a request without (the right) key."""
    return any(mark in message for mark in _REFUSALS)


def refusal_hint(has_key: bool) -> str:
    """What to do about a refusal, for the error message (never the key itself)."""
    if has_key:
        return f"the key sent is not this server's: set ${ENV} to the key the server was started with"
    return (f"the server restricts model control to requests with its key: set ${ENV} to the key it was started "
            f"with (triton-builder serve/replicas use ${ENV} when it is set, else a key of their own)")
