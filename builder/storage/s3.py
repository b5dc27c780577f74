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
3. The warm-up files the config names (``<model>/warmup/``) are uploaded; last, ``<model>/config.pbtxt`` is written with ``version_policy { specific { versions: [...] } }``
   naming only complete versions (the local config's policy - latest N, all, specific - applied
   to the complete versions). Triton loads exactly the versions the config names, so a Triton
   polling the bucket (``--model-control-mode=poll``) or reloading a model (explicit mode) never
   sees a version before it is complete: the config write is the switch, and a single PUT of
   one object is atomic in S3.

Versions are never overwritten: a version already in the bucket is skipped when its marker lists
the same files with the same sha256 (publishing again is a no-op), and refused otherwise.

URL parsing lives in builder/storage/s3_location.py, the object store client (marker, version
state) in builder/storage/s3_store.py; their public names are importable from here too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from builder.core.errors import ServerError, UserInputError
from builder.core.files import sha256_file
from builder.repository.config import parse_config
from builder.repository.layout import MODEL_SUFFIX, MONITOR_SUFFIX, existing_versions, is_monitored, model_dir
from builder.repository.metadata import read_metadata
from builder.repository.validate import hash_failures, record_problem
from builder.repository.warmup_data import read_warmup_files
from builder.storage.s3_location import S3Location, is_s3_url, parse_s3_url
from builder.storage.s3_store import MARKER, MARKER_FORMAT, S3Store, _now

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

_SKIPPED_DIRS = {"__pycache__"}


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


def local_version_files(folder: Path, action: str = "publish") -> dict[str, tuple[Path, str, int]]:
    """``{relative name: (path, sha256, size)}`` of a local version folder (``__pycache__`` and hidden
    names left out), checked as ``validate`` checks it (validate.hash_failures, one function for both):
    every file metadata.yaml's ``files_sha256`` lists is there and unchanged, and metadata.yaml names
    this folder's version. ``UserInputError`` naming every problem otherwise; ``action`` (publish,
    register) is what the message says was refused."""

    problem = record_problem(folder / "metadata.yaml", fields=False)
    if problem:
        raise UserInputError(f"{folder / 'metadata.yaml'} {problem}: not {action}ing a version that is not as build "
                             "wrote it; run `triton-builder validate` on it, and rebuild it")
    meta = read_metadata(folder / "metadata.yaml")
    files: dict[str, tuple[Path, str, int]] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part in _SKIPPED_DIRS or part.startswith(".") for part in rel.parts) or path.suffix == ".pyc":
            continue
        if path.is_symlink() or not path.is_file():
            continue
        files[rel.as_posix()] = (path, sha256_file(path), path.stat().st_size)
    failures = hash_failures(folder, meta.get("files_sha256") or {},
                             {name: digest for name, (_p, digest, _s) in files.items()})
    if meta.get("version") != _folder_number(folder):
        failures.append(f"metadata.yaml says version {meta.get('version')}, but its folder is {folder.name}/ (renamed "
                        "or copied?)")
    if failures:
        raise UserInputError(f"{folder}: {'; '.join(failures)}; not {action}ing it: run `triton-builder validate` on "
                             f"it, and rebuild it rather than {action} it")
    return files


def _folder_number(folder: Path) -> int | None:
    return int(folder.name) if folder.name.isascii() and folder.name.isdigit() else None


#: what a differing file means, most telling first: the model and its weights, the reference it is checked
#: against, the record of both; then the backend's code and the signature; reports and the rest last
_WEIGHT_SUFFIXES = (".onnx", ".pt", ".plan", ".engine", ".xml", ".bin", ".data", ".pb", ".savedmodel")


def _rank(name: str) -> int:
    base = name.rsplit("/", 1)[-1]
    if base.startswith("model.") and base not in ("model.py", "model.sig") or base.endswith(_WEIGHT_SUFFIXES):
        return 0
    if base in ("reference.npz", "metadata.yaml"):
        return 1
    if base.endswith(".py") or base in ("model.sig", "signed_config.pbtxt", "config.pbtxt"):
        return 2
    return 3


def _name_files(names: Iterable[str], shown: int = 5) -> str:
    """Up to ``shown`` file names, the model's own files first, and how many others: an alphabetical cut
    named the build reports and hid model.onnx."""
    ordered = sorted(names, key=lambda n: (_rank(n), n))
    rest = len(ordered) - shown
    return ", ".join(ordered[:shown]) + (f" and {rest} other file{'s' if rest != 1 else ''}" if rest > 0 else "")


def _local_versions(repository: Path, models: Sequence[str] | None,
                    version: int | None) -> list[tuple[str, list[int]]]:
    if not repository.is_dir():
        raise UserInputError(f"--repository {repository}: not a directory; pass the local model repository "
                             "folder (one sub-folder per model) to publish from")
    names = list(models) if models else sorted(p.name for p in repository.iterdir()
                                               if p.is_dir() and not p.name.startswith("."))
    chosen = []
    monitored = [n for n in names if is_monitored(repository, n) or any(
        n.endswith(suffix) and is_monitored(repository, n[:-len(suffix)]) for suffix in (MODEL_SUFFIX, MONITOR_SUFFIX))]
    if monitored:
        raise UserInputError(f"{', '.join(monitored)}: part of a monitored model (deploy.monitor: an ensemble, its model "
                             "step and its python monitor step); publishing to object storage does not carry those "
                             "yet: publish a build without deploy.monitor, or name the other models with --model")
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
                differing = [n for n in set(theirs) | set(ours) if theirs.get(n) != ours.get(n)]
                raise UserInputError(
                    f"version {number} of model '{model}' already exists at {url} with different files "
                    f"({_name_files(differing)}); versions are never overwritten: build a new version "
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
            for relative, data in read_warmup_files(folder, local_config).items():  # what the config reads, first
                if store.get_bytes(model, *relative.split("/")) != data:
                    store.put_bytes(data, model, *relative.split("/"))
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
