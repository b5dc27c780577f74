"""Where an S3 model repository lives: its URL forms, parsed into an :class:`S3Location`.

Usage::

    is_s3_url("s3://127.0.0.1:9000/models/prod")                  # True
    location = parse_s3_url("s3://127.0.0.1:9000/models/prod", "--to")   # UserInputError if malformed

The URL forms (the ones Triton's own S3 support accepts) are described in builder/storage/s3.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from builder.core.errors import UserInputError

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
_SEGMENT = re.compile(r"^[A-Za-z0-9._-]+\Z")
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?\Z")
_FORMS = ("s3://BUCKET/PREFIX (AWS; endpoint from AWS_ENDPOINT_URL if set) or "
          "s3://HOST:PORT/BUCKET/PREFIX (an S3-compatible endpoint such as MinIO)")


def is_s3_url(value: Any) -> bool:
    """Whether ``value`` is meant as an object-store URL (anything starting with ``s3://``)."""
    return isinstance(value, str) and value.strip().lower().startswith("s3://")


# --------------------------------------------------------------------------------------------
# URLs


@dataclass(frozen=True)
class S3Location:
    """Where a repository lives: ``endpoint`` (``http://host:port``, or None for AWS), bucket, prefix."""

    bucket: str
    prefix: str  # no leading/trailing '/'
    endpoint: str | None = None  # scheme://host:port given in the URL

    @property
    def url(self) -> str:
        """The canonical URL (what users pass and messages quote)."""
        if self.endpoint is None:
            return f"s3://{self.bucket}/{self.prefix}"
        scheme, hostport = self.endpoint.split("://", 1)
        return f"s3://{'https://' if scheme == 'https' else ''}{hostport}/{self.bucket}/{self.prefix}"

    def __str__(self) -> str:
        return self.url

    def effective_endpoint(self) -> str | None:
        """The endpoint boto3 and Triton talk to: the URL's, else ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``."""
        if self.endpoint is not None:
            return self.endpoint
        env = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return env.rstrip("/") if env else None

    def triton_url(self, from_env: bool = True) -> str:
        """The ``--model-repository`` value for tritonserver (``s3://[scheme://]host:port/bucket/prefix``).

        ``from_env=False``: only the URL's own endpoint (manifests rendered for another machine)."""
        endpoint = self.effective_endpoint() if from_env else self.endpoint
        if endpoint is None:
            return f"s3://{self.bucket}/{self.prefix}"
        scheme, hostport = endpoint.split("://", 1)
        if ":" not in hostport:
            hostport += ":443" if scheme == "https" else ":80"
        return f"s3://{scheme}://{hostport}/{self.bucket}/{self.prefix}"

    def key(self, *parts: str | int) -> str:
        return "/".join([self.prefix, *(str(p).strip("/") for p in parts)])

    def child_url(self, *parts: str | int) -> str:
        return "/".join([self.url, *(str(p) for p in parts)])


def parse_s3_url(url: Any, field_name: str = "--repository") -> S3Location:
    """Parse ``s3://[[scheme://]HOST:PORT/]BUCKET/PREFIX``; ``UserInputError`` naming ``field_name`` if bad."""
    def bad(why: str) -> UserInputError:
        return UserInputError(f"{field_name} {url!r}: {why}; use {_FORMS}")

    if not isinstance(url, str) or not url.strip():
        raise bad("an object-store URL is required")
    text = url.strip()
    if not text.lower().startswith("s3://"):
        raise bad("not an s3:// URL")
    rest = text[5:]
    if any(ch in rest for ch in "?#\\ \t"):
        raise bad("query strings, fragments, backslashes and spaces are not allowed")
    scheme = None
    for candidate in ("http://", "https://"):
        if rest.lower().startswith(candidate):
            scheme, rest = candidate[:-3], rest[len(candidate):]
    parts = rest.split("/")
    endpoint = None
    if "@" in parts[0]:
        raise UserInputError(f"{field_name} {url!r}: credentials never go in the URL; set AWS_ACCESS_KEY_ID and "
                             "AWS_SECRET_ACCESS_KEY in the environment (or use an AWS profile)")
    if ":" in parts[0] or scheme is not None:
        host, _, port = parts[0].rpartition(":")
        if not host or not port:
            raise bad(f"'{parts[0]}' is not HOST:PORT")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise bad(f"port '{port}' is not a number between 1 and 65535")
        if not _HOST.match(host):
            raise bad(f"host '{host}' is not a host name or IPv4 address")
        endpoint = f"{scheme or 'http'}://{host}:{int(port)}"
        parts = parts[1:]
    if not parts or not parts[0]:
        raise bad("the bucket name is missing")
    bucket = parts[0]
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise bad(f"bucket '{bucket}' is not a valid bucket name (3-63 lowercase letters, digits, '.' and '-')")
    segments = parts[1:]
    while segments and segments[-1] == "":  # a trailing slash is fine
        segments.pop()
    if not segments:
        raise bad(f"a PREFIX inside bucket '{bucket}' is required (e.g. s3://.../{bucket}/models); the repository "
                  "is never the bucket root")
    for segment in segments:
        if not segment:
            raise bad("empty path segment ('//')")
        if segment in (".", "..") or not _SEGMENT.match(segment):
            raise bad(f"prefix segment '{segment}' may only hold letters, digits, '.', '_' and '-' "
                      "(what Triton's S3 support accepts)")
    return S3Location(bucket=bucket, prefix="/".join(segments), endpoint=endpoint)


# --------------------------------------------------------------------------------------------
# The store
