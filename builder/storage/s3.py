"""A model repository in S3-compatible object storage: URLs, the completeness marker, and publishing.

Usage::

    location = parse_s3_url("s3://127.0.0.1:9000/models/prod", "--to")   # UserInputError if malformed
    results = publish_repository("model_repository", "s3://127.0.0.1:9000/models/prod")
    for item in results:
        print(item.line())        # "digits_cnn version 2: published (7 files, 0.2 MB, sha256 verified)"

    store = S3Store(location)
    store.complete_versions("digits_cnn")      # [1, 2]: versions whose .complete marker checks out
    store.version_state("digits_cnn", 3)       # "absent" | "incomplete" | "complete"

URLs (what Triton's own S3 support accepts, so the same URL works for ``tritonserver``):

- ``s3://BUCKET/PREFIX``: AWS. The endpoint is AWS's unless ``AWS_ENDPOINT_URL_S3`` or
  ``AWS_ENDPOINT_URL`` is set (then that endpoint, for both boto3 and Triton).
- ``s3://HOST:PORT/BUCKET/PREFIX``: an S3-compatible endpoint over HTTP (MinIO, moto, Ceph ...);
  ``s3://https://HOST:PORT/BUCKET/PREFIX`` for HTTPS, ``s3://http://...`` is the same as no scheme.
- Credentials and region come from the standard AWS variables (``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``) or an AWS profile;
  never from the URL. A PREFIX is required (the repository is never the bucket root, so nothing
  else in the bucket is mistaken for a model).

How a version becomes visible (never half of one):

1. Every file of ``<model>/<version>/`` is uploaded (``ChecksumSHA256`` sent with each PUT, so a
   store that checks it rejects a corrupted transfer), then read back and hashed: the sha256 of
   each object must equal the local file's, and the local files must match ``metadata.yaml``'s
   ``files_sha256`` before anything is uploaded.
2. Then ``<model>/<version>/.complete`` is written (create-only, ``If-None-Match: *``): a JSON record
   of every file with its sha256 and size. A version folder without a valid marker is an upload in
   progress or an interrupted one: ``serve``, ``replicas`` and publish itself treat it as not there.
3. Last, ``<model>/config.pbtxt`` is written with ``version_policy { specific { versions: [...] } }``
   naming only complete versions (the local config's policy - latest N, all, specific - applied
   to the complete versions). Triton loads exactly the versions the config names, so a Triton
   polling the bucket (``--model-control-mode=poll``) or reloading a model (explicit mode) never
   sees a version before it is complete: the config write is the switch, and a single PUT of
   one object is atomic in S3.

Versions are never overwritten: a version already in the bucket is skipped when its marker lists
the same files with the same sha256 (publishing again is a no-op), and refused otherwise.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from builder.errors import ServerError, UserInputError
from builder.extras import require
from builder.repository.config import parse_config

__all__ = [
    "MARKER",
    "S3Location",
    "S3Store",
    "PublishedVersion",
    "is_s3_url",
    "parse_s3_url",
    "publish_repository",
    "pin_versions",
    "policy_versions",
    "local_version_files",
]

MARKER = ".complete"
MARKER_FORMAT = "triton-builder/complete-v1"
SINGLE_PUT_LIMIT = 4 * 1024**3  # larger files go multipart (S3's single PUT stops at 5 GiB)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SEGMENT = re.compile(r"^[A-Za-z0-9._-]+$")
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")
_SKIPPED_DIRS = {"__pycache__"}
_FORMS = ("s3://BUCKET/PREFIX (AWS; endpoint from AWS_ENDPOINT_URL if set) or "
          "s3://HOST:PORT/BUCKET/PREFIX (an S3-compatible endpoint such as MinIO)")
#: who needs boto3 (the ``s3`` extra), for the error when it is missing
S3_NEEDED_BY = "an s3:// repository (publish --to, serve/check/replicas --repository)"


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
            from botocore.exceptions import (BotoCoreError, ClientError, EndpointConnectionError,
                                             NoCredentialsError, PartialCredentialsError)
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


def policy_versions(config_text: str, available: Iterable[int], where: str = "config.pbtxt") -> list[int]:
    """The versions Triton would load from ``available`` under the config's ``version_policy``."""
    config = parse_config(config_text, where)
    available = sorted(set(available))
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return available
    if which == "specific":
        wanted = set(int(v) for v in policy.specific.versions)
        return [v for v in available if v in wanted]
    count = policy.latest.num_versions if which == "latest" else 1
    return available[-max(1, count):] if available else []


def pin_versions(config_text: str, versions: Sequence[int], where: str = "config.pbtxt") -> str:
    """The config with ``version_policy { specific { versions: [...] } }`` (what ``publish`` writes)."""
    from google.protobuf import text_format

    if not versions:
        raise UserInputError(f"{where}: no complete version to serve")
    config = parse_config(config_text, where)
    config.version_policy.Clear()
    config.version_policy.specific.versions.extend(sorted(int(v) for v in versions))
    header = ("# Written by `triton-builder publish`: version_policy names only versions whose upload is complete\n"
              "# (a .complete marker in the version folder). Publish new versions with triton-builder; do not edit.\n")
    return header + text_format.MessageToString(config)


# --------------------------------------------------------------------------------------------
# Publishing


@dataclass
class PublishedVersion:
    model: str
    version: int
    status: str  # "published" | "identical" (already there, nothing written)
    files: int = 0
    bytes: int = 0
    url: str = ""
    served_versions: list[int] = field(default_factory=list)

    def line(self) -> str:
        if self.status == "identical":
            return f"{self.model} version {self.version}: already in {self.url} with the same sha256s; nothing written"
        return (f"{self.model} version {self.version}: published to {self.url} ({self.files} files, "
                f"{self.bytes / 1e6:.1f} MB, sha256 verified after upload); config.pbtxt now serves "
                f"versions {', '.join(map(str, self.served_versions))}")


def local_version_files(folder: Path) -> dict[str, tuple[Path, str, int]]:
    """``{relative name: (path, sha256, size)}`` of a local version folder (``__pycache__`` and hidden
    names left out), checked against metadata.yaml's ``files_sha256``: ``UserInputError`` on a mismatch."""
    from builder.files import sha256_file
    from builder.repository.metadata import read_metadata

    declared = (read_metadata(folder / "metadata.yaml").get("files_sha256") or {})
    files: dict[str, tuple[Path, str, int]] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part in _SKIPPED_DIRS or part.startswith(".") for part in rel.parts) or path.suffix == ".pyc":
            continue
        if path.is_symlink() or not path.is_file():
            continue
        files[rel.as_posix()] = (path, sha256_file(path), path.stat().st_size)
    for name, expected in declared.items():
        if name not in files:
            raise UserInputError(f"{folder / name} is listed in metadata.yaml's files_sha256 but missing; "
                                 "rebuild this version (triton-builder build)")
        if files[name][1] != expected:
            raise UserInputError(f"{folder / name}: sha256 differs from metadata.yaml (the file changed after the "
                                 "build); run `triton-builder validate` and rebuild rather than publish it")
    return files


def _local_versions(repository: Path, models: Sequence[str] | None,
                    version: int | None) -> list[tuple[str, list[int]]]:
    from builder.repository.layout import existing_versions, model_dir

    if not repository.is_dir():
        raise UserInputError(f"--repository {repository}: not a directory; pass the local model repository "
                             "folder (one sub-folder per model) to publish from")
    names = list(models) if models else sorted(p.name for p in repository.iterdir()
                                               if p.is_dir() and not p.name.startswith("."))
    chosen = []
    for name in names:
        folder = model_dir(repository, name)
        versions = existing_versions(folder)
        if not folder.is_dir() or not (folder / "config.pbtxt").is_file():
            if models:
                raise UserInputError(f"--model {name}: not a model in {repository} (no {folder / 'config.pbtxt'})")
            continue
        if version is not None:
            if version not in versions:
                raise UserInputError(f"--version {version}: model '{name}' has no version {version} in {repository} "
                                     f"(it has {', '.join(map(str, versions)) or 'none'})")
            versions = [version]
        if versions:
            chosen.append((name, versions))
    if not chosen:
        raise UserInputError(f"--repository {repository}: no model version to publish (no <model>/config.pbtxt with "
                             "a numbered version folder)")
    return chosen


def _upload_version(store: S3Store, model: str, version: int, files: dict[str, tuple[Path, str, int]],
                    source: Path, say: Callable[[str], object]) -> None:
    loc = store.location
    for rel, (path, digest, _size) in files.items():
        store.put_file(path, digest, model, version, rel)
    for rel, (_path, digest, _size) in files.items():  # read back: the bucket holds what we hashed
        got = store.sha256_of(model, version, rel)
        if got != digest:
            raise ServerError(f"{loc.child_url(model, version, rel)}: sha256 after upload is {got}, expected {digest} "
                              "(corrupted in transfer or changed meanwhile); the version stays invisible (no "
                              f"{MARKER} marker); delete {loc.child_url(model, version)}/ and publish again")
    from importlib.metadata import PackageNotFoundError, version as package_version
    try:
        publisher = f"triton-builder {package_version('triton-builder')}"
    except PackageNotFoundError:
        publisher = "triton-builder"
    marker = {"format": MARKER_FORMAT, "model": model, "version": version, "published_at": _now(),
              "publisher": publisher, "source": str(source),
              "files": {rel: {"sha256": digest, "size": size} for rel, (_p, digest, size) in files.items()}}
    written = store.put_bytes(json.dumps(marker, indent=2).encode(), model, version, MARKER, create_only=True,
                              content_type="application/json")
    if not written:
        raise UserInputError(f"{loc.child_url(model, version)} was completed by another publish while this one "
                             "uploaded; versions are never overwritten: check which files it holds, build a new version")
    say(f"  {model} version {version}: {len(files)} files uploaded and verified; marker {MARKER} written")


def publish_repository(repository: str | Path, to: str, *, models: Sequence[str] | None = None,
                       version: int | None = None, client: Any = None,
                       progress: Callable[[str], object] | None = None) -> list[PublishedVersion]:
    """Publish the versions of a local repository to ``to`` (an ``s3://`` URL); see the module doc.

    ``models``: only these models (default: all); ``version``: only this version (default: every
    local version). Returns one ``PublishedVersion`` per version. Raises ``UserInputError`` for a bad
    URL/argument, a local file that differs from metadata.yaml, or a version already in the bucket
    with other content; ``ServerError`` if the store cannot be reached or a read-back differs.
    """
    say = progress or (lambda message: None)
    location = parse_s3_url(to, "--to")
    repository = Path(repository).expanduser().resolve()
    plan = _local_versions(repository, models, version)
    store = S3Store(location, client=client, field_name="--to")
    store.check_bucket()
    results: list[PublishedVersion] = []
    for model, versions in plan:
        folder = repository / model
        local_config = (folder / "config.pbtxt").read_text(encoding="utf-8")
        parse_config(local_config, str(folder / "config.pbtxt"))
        changed = False
        for number in versions:
            files = local_version_files(folder / str(number))
            state = store.version_state(model, number)
            url = location.child_url(model, number)
            if state == "incomplete":
                raise UserInputError(
                    f"{url}/ holds an incomplete upload (no valid {MARKER} marker: a publish in progress or an "
                    "interrupted one); it is not served and versions are never overwritten. If no publish is "
                    f"running, delete it (aws s3 rm --recursive {url}/) and publish again")
            if state == "complete":
                marker = store.read_marker(model, number) or {}
                theirs = {name: info.get("sha256") for name, info in marker.get("files", {}).items()}
                ours = {name: digest for name, (_p, digest, _s) in files.items()}
                if theirs == ours:
                    results.append(PublishedVersion(model, number, "identical", url=url))
                    say(f"  {model} version {number}: already published with the same files; skipped")
                    continue
                differing = sorted(n for n in set(theirs) | set(ours) if theirs.get(n) != ours.get(n))
                raise UserInputError(
                    f"version {number} of model '{model}' already exists at {url} with different files "
                    f"({', '.join(differing[:5])}); versions are never overwritten: build a new version "
                    "(triton-builder build takes the next free number) and publish that")
            _upload_version(store, model, number, files, folder / str(number), say)
            changed = True
            results.append(PublishedVersion(model, number, "published", files=len(files),
                                            bytes=sum(size for _p, _d, size in files.values()), url=url))
        complete = store.complete_versions(model)
        served = policy_versions(local_config, complete, str(folder / "config.pbtxt"))
        if not served:
            raise UserInputError(f"{folder / 'config.pbtxt'}: its version_policy selects none of the complete "
                                 f"versions in the bucket ({', '.join(map(str, complete))}); fix the policy")
        pinned = pin_versions(local_config, served, str(folder / "config.pbtxt"))
        if changed or store.config_text(model) != pinned:
            # last write: the switch that makes the new versions visible to Triton
            store.put_bytes(pinned.encode(), model, "config.pbtxt", content_type="text/plain")
            say(f"  {model}: config.pbtxt written last, serving versions {', '.join(map(str, served))}")
        for item in results:
            if item.model == model:
                item.served_versions = served
    return results


def snapshot_for_check(location: S3Location | str, model: str, dest: Path, version: int | None = None,
                       client: Any = None) -> int:
    """Copy what ``check`` reads (config.pbtxt, metadata.yaml, reference.npz) of one complete version
    into ``dest/<model>/`` (a scratch folder, not a served repository); returns the version number.

    Default version: the highest complete one the config serves.
    """
    store = S3Store(location, client=client)
    config = store.config_text(model)
    if config is None:
        raise UserInputError(f"model '{model}' is not in {store.location.url} (no config.pbtxt); pass --repository")
    complete = store.complete_versions(model)
    if version is None:
        served = policy_versions(config, complete, store.location.child_url(model, "config.pbtxt"))
        if not served:
            raise UserInputError(f"model '{model}' has no complete version in {store.location.url}")
        version = served[-1]
    elif version not in complete:
        raise UserInputError(f"--version {version}: model '{model}' has no complete version {version} in "
                             f"{store.location.url} (complete: {', '.join(map(str, complete)) or 'none'})")
    folder = Path(dest) / model
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config)
    for name in ("metadata.yaml", "reference.npz"):
        data = store.get_bytes(model, version, name)
        if data is not None:
            (folder / str(version) / name).write_bytes(data)
    return version
