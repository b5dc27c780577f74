"""`triton-builder rollback NAME [--to N]`: serve an earlier verified version again, in one atomic config change.

A model folder holds several versions and ONE config.pbtxt; its ``version_policy`` says which versions Triton
serves. A rollback rewrites config.pbtxt (a temp file renamed over it: Triton, polling or reloading, reads the
old or the new one, never half of one) with ``version_policy { specific { versions: [N] } }``. The config is
version N's own where it kept one (a signed version's ``signed_config.pbtxt``: the exact config N was published
and verified with, so a rollback of ``tune --publish`` also restores the older scheduling), else the served one
with only its policy changed - and, where the version's ONNX graph takes ragged batches and the config does not
or the other way round (a text pipeline built before and after builder/huggingface/ragged.py), its ragged inputs
matched to the graph, so Triton can load it. Before anything is written, version N is checked as ``validate`` checks it,
against the config about to be written (hashes, signature, the interface, the replay of reference.npz): a
version that fails is refused, naming the version, the failures and the fix.

The record: ``<model>/rollout.yaml`` (beside config.pbtxt) holds the served version, the sha256 of the config
written, the policy the rollback replaced (``select``/``tune --publish`` put it back for their new version) and
the history of rollbacks; ``rollout_history`` merges it with the versions' publish dates: which version served
when. Where the repository is signed (its latest or the target version carries model.sig), a signing key is
required and ``rollout.sig`` signs the record: ``validate``/``serve --require-signature`` accept a config.pbtxt
that is not the latest version's signed copy when the signed record vouches for its sha256
(builder/repository/signing.py verify_model).

A new version published afterwards (build, select, tune --publish) is served again under its own policy:
publishing replaces config.pbtxt. ``rollback NAME --to M`` rolls forward the same way.

Usage::

    report = rollback_model(Path("model_repository"), "digits_cnn")          # to the version before the served one
    report = rollback_model(Path("model_repository"), "digits_cnn", to=2, signing_key="keys/signing.pem")
    report.lines()
"""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from builder.core.errors import UserInputError, VerificationError
from builder.huggingface.ragged import match_ragged_layout, version_ragged
from builder.repository.config import parse_config
from builder.repository.layout import (MODEL_SUFFIX, _repository_lock, atomic_write, existing_versions, is_monitored,
                                       model_dir, not_in_repository, require_writable)
from builder.repository.metadata import read_metadata
from builder.repository.signing import (RECORD_FILE, RECORD_SIGNATURE, SIGNATURE_FILE, SIGNED_CONFIG,
                                        public_key as find_public_key, read_record, resolve_signing_key, sha256_text,
                                        sign_version)
from builder.repository.validate import validate_model
from builder.storage.s3 import policy_versions

HISTORY_LIMIT = 200  # rollbacks kept in the record (the versions' own publish dates are never lost)


@dataclass
class RollbackReport:
    model: str  #: the model named (a monitored model's ensemble; its versions are in ``model__model``)
    repository: str
    from_version: int | None  #: the version served before (the highest the old policy served)
    to_version: int
    config_source: str  #: whose config is served now
    signed: bool
    history: list[dict[str, Any]] = field(default_factory=list)  #: which version served when, oldest first
    notes: list[str] = field(default_factory=list)
    #: what the running servers of this repository answer with afterwards (builder.api.rollback fills it)
    served: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return True

    def lines(self) -> list[str]:
        out = [f"{self.model}: now serving version {self.to_version} (was {self.from_version}); config.pbtxt "
               f"version_policy specific [{self.to_version}], {self.config_source}"
               + ("; the rollout record is signed" if self.signed else "")]
        out += [f"served: {line}" for line in self.served]
        out += [f"note: {n}" for n in self.notes]
        out.append("served versions (UTC):")
        out += [f"  {h['at']}  version {h['version']}  {h['event']}" for h in self.history[-10:]]
        return out




def served_versions(config_text: str, available, where: str = "config.pbtxt") -> list[int]:
    """The versions Triton serves from ``available`` under the config's version_policy."""
    return policy_versions(config_text, available, where)


def policy_text(config_text: str) -> str | None:
    """The version_policy of a config as text (None: unset, Triton's default latest 1)."""
    from google.protobuf import text_format

    config = parse_config(config_text)
    if not config.HasField("version_policy"):
        return None
    return text_format.MessageToString(config.version_policy, as_one_line=True)


def pinned_config(config_text: str, version: int, header: str, where: str = "config.pbtxt",
                  ragged: bool | None = None) -> str:
    """``config_text`` serving only ``version``: version_policy specific [version], ``header`` above it. ``ragged``:
    whether the version's graph takes ragged batches, which the config is made to match (None: left as it is)."""
    from google.protobuf import text_format

    config = parse_config(config_text, where)
    if ragged is not None:
        match_ragged_layout(config, ragged)
    config.version_policy.Clear()
    config.version_policy.specific.versions.append(int(version))
    return "".join(f"# {line}\n" for line in header.splitlines()) + text_format.MessageToString(config)




def restore_policy(folder: Path, config) -> bool:
    """For a new version published on top of a rollback (select, tune --publish): where ``config`` (a parsed
    ModelConfig, changed in place) still carries the rollback's specific policy, put back the policy the rollback
    replaced, so that the new version is served. True when it changed."""
    from google.protobuf import text_format

    record = read_record(folder)
    if not record or not config.HasField("version_policy"):
        return False
    if config.version_policy.WhichOneof("policy_choice") != "specific" or \
            list(config.version_policy.specific.versions) != [record.get("served_version")]:
        return False
    config.version_policy.Clear()
    before = record.get("replaced_policy")
    if before:
        text_format.Parse(before, config.version_policy)
    return True


def _version_dates(folder: Path, versions: list[int]) -> list[dict[str, Any]]:
    events = []
    for number in versions:
        try:
            when = (read_metadata(folder / str(number) / "metadata.yaml") or {}).get("build_date")
        except Exception:  # noqa: BLE001 - a damaged record: validate names it; the history just lacks the date
            when = None
        if when:
            events.append({"at": str(when)[:19].replace("T", " "), "version": number,
                           "event": "published (served under the model's policy from then)"})
    return events


def rollout_history(folder: Path, record: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Which version served when: each version's publish date (metadata.yaml build_date) and each rollback of
    the record, oldest first."""
    folder = Path(folder)
    record = read_record(folder) if record is None else record
    events = _version_dates(folder, existing_versions(folder))
    events += [dict(item) for item in record.get("history") or [] if isinstance(item, dict)]
    return sorted(events, key=lambda e: str(e.get("at")))


def target_version(name: str, versions: list[int], current: int | None, to: int | None, where: str) -> int:
    """The version to serve: ``to`` (one of ``versions``, not the one served), else the one below ``current``."""
    if to is not None:
        if to not in versions:
            raise UserInputError(f"--to {to}: model '{name}' has no version {to} in {where} (it has: "
                                 f"{', '.join(map(str, versions)) or 'none'})")
        if to == current:
            raise UserInputError(f"--to {to}: version {to} of '{name}' is already the served one; name another "
                                 f"version (it has: {', '.join(map(str, versions))})")
        return to
    earlier = [v for v in versions if current is None or v < current]
    if not earlier:
        raise UserInputError(f"model '{name}' has no version before the served version {current} in {where} "
                             f"(it has: {', '.join(map(str, versions)) or 'none'}); name one with --to N")
    return earlier[-1]


def refuse_failed(name: str, number: int, report, repository: str) -> None:
    """Raise VerificationError when version ``number`` failed validate (``report``: a ValidationReport)."""
    check = next((v for v in report.versions if v.version == number), None)
    failures = list(check.failures) if check else []
    if check is not None and check.skipped and not failures and check.skipped.startswith("signature"):
        failures.append(check.skipped)
    failures += [f for f in report.failures if f.startswith(f"version {number}:") or "warm" in f]
    if failures:
        raise VerificationError(
            f"refusing to roll '{name}' back to version {number}: it fails validate:\n  - " + "\n  - ".join(failures)
            + f"\nfix: `triton-builder validate {name} --repository {repository} --model-version {number}` names each "
              "problem; restore that version's files from where it was published, or roll back to another version "
              "(--to N); nothing was changed")


def rollback_model(repository: str | Path, name: str, to: int | None = None, *, signing_key=None,
                   public_key=None, progress: Callable[[str], object] = lambda message: None,
                   now: Callable[[], dt.datetime] | None = None) -> RollbackReport:
    """Serve version ``to`` (default: the version before the served one) of model ``name`` in the local
    ``repository``; see the module doc. Raises UserInputError (no such model/version, a signed repository
    without a key, an unwritable repository) or VerificationError (the version fails validate); nothing is
    written then."""

    root = Path(repository)
    if not (root / name / "config.pbtxt").is_file():
        raise not_in_repository(name, root)
    folder = model_dir(root, name)  # a monitored model: its model step's folder holds the versions
    if is_monitored(root, name):
        progress(f"{name} is a monitored ensemble: rolling back its model step {name}{MODEL_SUFFIX}")
    require_writable(root, staged=False)
    current_text = (folder / "config.pbtxt").read_text()
    versions = existing_versions(folder)
    served = served_versions(current_text, versions, str(folder / "config.pbtxt"))
    current = served[-1] if served else None
    number = target_version(name, versions, current, to, str(root.resolve()))
    own = folder / str(number) / SIGNED_CONFIG
    base, source = ((own.read_text(), f"version {number}'s own config (its signed copy)") if own.is_file()
                    else (current_text, f"the served config with only its version_policy changed (version {number} "
                                        "was published unsigned: its own config was not kept)"))
    key = resolve_signing_key(signing_key, root)
    signed_repository = any((folder / str(v) / SIGNATURE_FILE).is_file() for v in {number, versions[-1]})
    if signed_repository and key is None:
        raise UserInputError(f"'{name}' is signed (version {number} or the latest carries {SIGNATURE_FILE}), so its "
                             "rollout record must be signed too (validate and serve --require-signature refuse an "
                             "unsigned config change): pass --signing-key PEM or set $TRITON_BUILDER_SIGNING_KEY")
    at = (now or (lambda: dt.datetime.now(dt.timezone.utc)))().strftime("%Y-%m-%d %H:%M:%S")
    header = (f"Written by `triton-builder rollback` at {at} UTC: serves version {number} (was {current}).\n"
              "A new version (build, select, tune --publish) or another rollback replaces it; see rollout.yaml.")
    text = pinned_config(base, number, header, str(folder / "config.pbtxt"), version_ragged(folder / str(number)))
    progress(f"validating version {number} of {name} against the config a rollback would serve")
    verify_with = find_public_key(public_key, root)
    derived = _public_half(key) if verify_with is None and key is not None else None
    try:
        report = validate_model(folder, number, public_key=verify_with or derived, config_text=text)
    finally:
        if derived is not None:
            derived.unlink(missing_ok=True)
    refuse_failed(name, number, report, str(repository))
    record = read_record(folder)
    if record.get("served_version") is None or record.get("config_sha256") != sha256_text(current_text):
        record["replaced_policy"] = policy_text(current_text)  # the model's own policy, not a rollback's
    history = [h for h in record.get("history") or [] if isinstance(h, dict)]
    history.append({"at": at, "version": number, "event": f"rollback from version {current}"})
    record.update({"model": folder.name, "served_version": number, "config_sha256": sha256_text(text),
                   "config_source": source, "history": history[-HISTORY_LIMIT:]})
    body = yaml.safe_dump(record, sort_keys=False)
    with _repository_lock(root.resolve()):
        if key is not None:
            _write_signature(root.resolve(), folder, body, key)
        atomic_write(root.resolve(), folder / RECORD_FILE, body)
        atomic_write(root.resolve(), folder / "config.pbtxt", text)  # last: the switch Triton sees
    progress(f"{name}: config.pbtxt now serves version {number}")
    return RollbackReport(model=name, repository=str(root.resolve()), from_version=current, to_version=number,
                          config_source=source, signed=key is not None, history=rollout_history(folder, record))


def _public_half(key) -> Path | None:
    """The public half of ``key`` in a temp file (verifying a signed target without --public-key)."""
    from cryptography.hazmat.primitives import serialization

    password = key.password.encode() if key.password else None
    try:
        private = serialization.load_pem_private_key(Path(key.path).read_bytes(), password)
    except (ValueError, TypeError) as err:
        raise UserInputError(f"signing key {key.path}: {err}") from None
    handle = tempfile.NamedTemporaryFile(prefix="triton-builder-public-", suffix=".pub", delete=False)
    with handle:
        handle.write(private.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo))
    return Path(handle.name)


def _write_signature(root: Path, folder: Path, body: str, key) -> None:
    """Sign ``body`` as ``rollout.yaml`` (in a temp folder of the same name, so the signature names it) and put
    the signature beside the record."""

    scratch = Path(tempfile.mkdtemp(prefix="triton-builder-rollout-"))
    try:
        (scratch / RECORD_FILE).write_text(body)
        sign_version(scratch, key)
        atomic_write(root, folder / RECORD_SIGNATURE, (scratch / SIGNATURE_FILE).read_bytes())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


