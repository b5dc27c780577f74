"""The objects of one S3 model repository, through boto3: reads, create-only writes, multipart
uploads, the completeness marker and the state of a version (builder/storage/s3.py says how a
version becomes visible).

Usage::

    store = S3Store(location)                  # an S3Location or an s3:// URL
    store.complete_versions("digits_cnn")      # [1, 2]: versions whose .complete marker checks out
    store.version_state("digits_cnn", 3)       # "absent" | "incomplete" | "complete"
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from builder.core.errors import ServerError, UserInputError
from builder.core.extras import require
from builder.storage.s3_location import S3Location, parse_s3_url

MARKER = ".complete"
MARKER_FORMAT = "triton-builder/complete-v1"
SINGLE_PUT_LIMIT = 4 * 1024**3  # larger files go multipart (S3's single PUT stops at 5 GiB)
#: who needs boto3 (the ``s3`` extra), for the error when it is missing
S3_NEEDED_BY = "an s3:// repository (publish --to, serve/check/replicas --repository)"


def _b64(hex_digest: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class S3Store:
    """The objects of one repository (``location``), through boto3; errors become builder errors.

    ``client`` may be passed (tests); otherwise one is made from the standard AWS environment.
    """

    def __init__(self, location: S3Location | str, client: Any = None, field_name: str = "--repository"):
        self.location = location if isinstance(location, S3Location) else parse_s3_url(location, field_name)
        self._client = client

    # -- plumbing ----------------------------------------------------------------------------

    @property
    def client(self):
        if self._client is None:
            boto3 = require("boto3", S3_NEEDED_BY)
            Config = require("botocore.config", S3_NEEDED_BY).Config
            endpoint = self.location.effective_endpoint()
            region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
            config = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=5, read_timeout=60,
                            s3={"addressing_style": "path" if endpoint else "auto"},
                            request_checksum_calculation="when_required",
                            response_checksum_validation="when_required")
            self._client = boto3.client("s3", endpoint_url=endpoint, region_name=region, config=config)
        return self._client

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            from botocore.exceptions import (
                BotoCoreError,
                ClientError,
                EndpointConnectionError,
                NoCredentialsError,
                PartialCredentialsError,
            )
        except ImportError:  # a test double for the client: nothing to translate
            return fn()
        try:
            return fn()
        except (NoCredentialsError, PartialCredentialsError):
            raise UserInputError(f"no usable AWS credentials for {self.location.url} ({what}): set "
                                 "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)") from None
        except EndpointConnectionError as err:
            raise ServerError(f"cannot reach the object store for {self.location.url} ({what}): {err}; "
                              "is the endpoint running and the URL's HOST:PORT right?") from None
        except ClientError as err:
            code = str(err.response.get("Error", {}).get("Code", ""))
            if code == "NoSuchBucket":
                raise self._no_bucket() from None
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
                raise UserInputError(f"the object store refused {what} on {self.location.url} ({code}): check "
                                     "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the bucket policy") from None
            raise ServerError(f"object store error during {what} on {self.location.url}: {code}: "
                              f"{err.response.get('Error', {}).get('Message', err)}") from None
        except BotoCoreError as err:
            raise ServerError(f"object store error during {what} on {self.location.url}: {err}") from None

    @staticmethod
    def _code(err: Exception) -> str:
        response = getattr(err, "response", None) or {}
        return str(response.get("Error", {}).get("Code", ""))

    def _no_bucket(self) -> UserInputError:
        return UserInputError(f"bucket '{self.location.bucket}' does not exist at "
                              f"{self.location.effective_endpoint() or 'AWS'}; create it first "
                              f"(aws s3 mb s3://{self.location.bucket}) or fix the URL")

    def check_bucket(self) -> None:
        """``UserInputError`` if the bucket is missing or not ours to read; ``ServerError`` if unreachable."""
        try:
            self._call("a check of the bucket", lambda: self.client.head_bucket(Bucket=self.location.bucket))
        except ServerError as err:
            if ": 404:" in str(err):  # HEAD answers have no body: a bare 404 is the bucket missing
                raise self._no_bucket() from None
            raise

    def list_dirs(self, *parts: str | int) -> list[str]:
        """Names of the 'folders' directly under ``prefix/parts...``."""
        prefix = self.location.key(*parts) + "/"
        names: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        pages = self._call(f"a listing of {prefix}", lambda: list(paginator.paginate(
            Bucket=self.location.bucket, Prefix=prefix, Delimiter="/")))
        for page in pages:
            for entry in page.get("CommonPrefixes") or []:
                names.append(entry["Prefix"][len(prefix):].rstrip("/"))
        return sorted(names)

    def list_objects(self, *parts: str | int) -> dict[str, int]:
        """``{relative key: size}`` of every object under ``prefix/parts.../``."""
        prefix = self.location.key(*parts) + "/"
        paginator = self.client.get_paginator("list_objects_v2")
        pages = self._call(f"a listing of {prefix}", lambda: list(paginator.paginate(
            Bucket=self.location.bucket, Prefix=prefix)))
        return {obj["Key"][len(prefix):]: int(obj["Size"]) for page in pages for obj in page.get("Contents") or []}

    def get_bytes(self, *parts: str | int) -> bytes | None:
        """The object's bytes, or None if there is no such object."""
        key = self.location.key(*parts)
        try:
            response = self._call(f"a read of {key}", lambda: self.client.get_object(Bucket=self.location.bucket,
                                                                                       Key=key))
        except ServerError as err:
            if "NoSuchKey" in str(err) or ": 404:" in str(err):
                return None
            raise
        return response["Body"].read()

    def sha256_of(self, *parts: str | int) -> str:
        """Read the object back and hash it (the verification does not trust any stored checksum)."""
        key = self.location.key(*parts)
        response = self._call(f"a read-back of {key}", lambda: self.client.get_object(Bucket=self.location.bucket,
                                                                                        Key=key))
        digest = hashlib.sha256()
        body = response["Body"]
        for block in iter(lambda: body.read(1 << 20), b""):
            digest.update(block)
        return digest.hexdigest()

    def put_bytes(self, data: bytes, *parts: str | int, create_only: bool = False,
                  content_type: str = "application/octet-stream") -> bool:
        """Write one object (one PUT: atomic). With ``create_only``, return False if it already exists."""
        key = self.location.key(*parts)
        args = dict(Bucket=self.location.bucket, Key=key, Body=data, ContentType=content_type,
                    ChecksumSHA256=_b64(hashlib.sha256(data).hexdigest()))
        if create_only:
            try:
                self._call(f"a write of {key}", lambda: self.client.put_object(IfNoneMatch="*", **args))
                return True
            except (ServerError, UserInputError) as err:
                if "PreconditionFailed" in str(err) or "ConditionalRequestConflict" in str(err):
                    return False
                if "NotImplemented" not in str(err):
                    raise
                # a store without conditional writes: check, then write (a narrow race remains)
                if self.get_bytes(*parts) is not None:
                    return False
        self._call(f"a write of {key}", lambda: self.client.put_object(**args))
        return True

    def put_file(self, path: Path, sha256: str, *parts: str | int) -> None:
        key = self.location.key(*parts)
        size = path.stat().st_size
        if size <= SINGLE_PUT_LIMIT:
            with open(path, "rb") as handle:
                self._call(f"an upload of {path} to {key}", lambda: self.client.put_object(
                    Bucket=self.location.bucket, Key=key, Body=handle, ChecksumSHA256=_b64(sha256)))
        else:
            self._call(f"an upload of {path} to {key}", lambda: self.client.upload_file(
                str(path), self.location.bucket, key))

    # -- models and versions -----------------------------------------------------------------

    def models(self) -> list[str]:
        """Model folders of the repository (hidden names skipped)."""
        return [name for name in self.list_dirs() if not name.startswith(".")]

    def version_dirs(self, model: str) -> list[int]:
        return sorted(int(name) for name in self.list_dirs(model) if name.isdigit())

    def read_marker(self, model: str, version: int) -> dict[str, Any] | None:
        data = self.get_bytes(model, version, MARKER)
        if data is None:
            return None
        try:
            marker = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT or not isinstance(
                marker.get("files"), dict):
            return None
        return marker

    def version_state(self, model: str, version: int) -> str:
        """``"absent"`` (no object), ``"complete"`` (a valid marker and every file it lists, at its
        size) or ``"incomplete"`` (anything else: an upload in progress or interrupted)."""
        objects = self.list_objects(model, version)
        if not objects:
            return "absent"
        return "complete" if self._marker_matches(model, version, objects) else "incomplete"

    def _marker_matches(self, model: str, version: int, objects: dict[str, int]) -> bool:
        if MARKER not in objects:
            return False
        marker = self.read_marker(model, version)
        if marker is None:
            return False
        for name, info in marker["files"].items():
            if not isinstance(info, dict) or objects.get(name) != info.get("size"):
                return False
        return True

    def complete_versions(self, model: str) -> list[int]:
        """Versions of ``model`` whose marker checks out (the only ones anything here serves)."""
        objects = self.list_objects(model)
        by_version: dict[int, dict[str, int]] = {}
        for key, size in objects.items():
            head, _, rest = key.partition("/")
            if head.isdigit() and rest:
                by_version.setdefault(int(head), {})[rest] = size
        return sorted(v for v, files in by_version.items() if self._marker_matches(model, v, files))

    def config_text(self, model: str) -> str | None:
        data = self.get_bytes(model, "config.pbtxt")
        return None if data is None else data.decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------------
# Version policy: the config is the switch
