"""Which versions `triton-builder select` may publish (builder/repository/reselect.py): only variants of
the build that made the served version, whose files are still what their build published.

Why: every candidate is replayed against its OWN reference.npz, so a version built from other weights
(an older build, or one rebuilt from perturbed weights) or a version whose model.onnx and reference.npz
were both overwritten passes that replay; select would then publish - and re-sign - another model as
the new version. So, before any replay:

* ``build_difference``: the candidate's metadata.yaml must name the same source as the served
  version's: ``source`` (kind, value and the sha256 of the model code and weights) and the spec's
  inputs, outputs and max_batch_size. A version select itself published copies its winner's metadata,
  so it keeps its build's source and still matches.
* ``integrity_failure``: its files must match metadata.yaml's ``files_sha256`` (validate's check,
  builder/repository/validate.py ``hash_failures``), and, with a key to
  verify with, its ``model.sig`` (builder/repository/signing.py); in a signed repository an unsigned
  candidate is refused too (select would sign what nobody signed).

Usage::

    why = build_difference(candidate_meta, served_meta, 3)   # "" or "from another build: ..."
    with verifying_key(None, signing_key, repository) as key:   # None: hashes only
        why = integrity_failure(folder, 1, key, signed_repository=True)   # "" or what failed
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, Iterator

from builder.core.errors import UserInputError
from builder.core.extras import require
from builder.repository.metadata import read_metadata
from builder.repository.signing import (KEY_ENV, PASSWORD_ENV, SIGNATURE_FILE, SIGNED_CONFIG,
                                        public_key as public_key_path, verify_version)
from builder.repository.validate import hash_failures

#: what identifies the build of a version in its metadata.yaml's spec (the interface it was built for)
SPEC_KEYS = ("inputs", "outputs", "max_batch_size")


def build_difference(meta: dict[str, Any], served: dict[str, Any], served_number: int) -> str:
    """"" where ``meta`` (a candidate's metadata.yaml) comes from the build of ``served`` (the served
    version's, number ``served_number``); else why not, naming what differs."""
    ours, theirs = meta.get("source") or {}, served.get("source") or {}
    other = f"version {served_number}'s"
    differs = [f"source {key} {ours.get(key)!r}, {other} {theirs.get(key)!r}"
               for key in ("kind", "value") if ours.get(key) != theirs.get(key)]
    hashes, served_hashes = ours.get("sha256") or {}, theirs.get("sha256") or {}
    for file in sorted(set(hashes) | set(served_hashes)):
        if file not in hashes:
            differs.append(f"built without {file}, which {other} build read")
        elif file not in served_hashes:
            differs.append(f"built from {file}, which {other} build did not read")
        elif hashes[file] != served_hashes[file]:
            differs.append(f"{file} differs from {other}")
    spec, served_spec = meta.get("spec") or {}, served.get("spec") or {}
    differs += [f"spec {key} differ from {other}" for key in SPEC_KEYS if spec.get(key) != served_spec.get(key)]
    if not differs:
        return ""
    return ("from another build: " + "; ".join(differs) + " (select only publishes the served build's variants; "
            "rebuild with --publish-variants to make others candidates)")


@contextlib.contextmanager
def verifying_key(public_key: str | Path | None, signing_key, repository: Path) -> Iterator[Path | None]:
    """The public key to verify candidates' signatures with: ``public_key`` (or $TRITON_BUILDER_PUBLIC_KEY),
    else the public half of ``signing_key`` (a SigningKey: what select signs with must only vouch for
    what it signed before), written to a temporary file outside the repository; None: neither given."""

    given = public_key_path(public_key, repository)
    if given is not None or signing_key is None:
        yield given
        return
    require("cryptography", "verifying signed versions")
    from cryptography.hazmat.primitives import serialization

    password = signing_key.password.encode() if signing_key.password else None
    try:
        private = serialization.load_pem_private_key(signing_key.path.read_bytes(), password=password)
    except (ValueError, TypeError) as err:  # a wrong password, not a PEM private key, ...
        raise UserInputError(f"signing key {signing_key.path}: {err}; give an elliptic-curve private key in PEM "
                             f"(and its password in ${PASSWORD_ENV} if it is encrypted)") from None
    pem = private.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    with tempfile.TemporaryDirectory(prefix="triton-builder-select-") as scratch:
        path = Path(scratch) / f"{signing_key.path.name}.public.pem"  # named after the key in any failure
        path.write_bytes(pem)
        yield path


def integrity_failure(folder: Path, number: int, key: Path | None, signed_repository: bool) -> str:
    """"" where the version in ``folder`` (number ``number``) is what was published: every file in
    metadata.yaml's files_sha256 present with that sha256, and, where ``key`` is given, its signature
    valid for ``key`` (``signed_repository``: unsigned is a failure too). Else the failure, naming the file."""

    failures = hash_failures(folder, read_metadata(folder / "metadata.yaml").get("files_sha256") or {})
    if failures:
        return "; ".join(failures) + ": tampered or half-copied; rebuild it"
    if not (folder / SIGNATURE_FILE).is_file() and (folder / SIGNED_CONFIG).is_file():
        # only a signing publish writes the signed copy, always with model.sig: the signature was removed
        return (f"{SIGNATURE_FILE} is missing but {SIGNED_CONFIG} is there: signed, then its signature removed "
                "(tampered?); restore it from where it was published, or rebuild it")
    if key is None:
        return ""
    if not (folder / SIGNATURE_FILE).is_file():
        return (f"unsigned (no {SIGNATURE_FILE}) in a signed repository: select would sign what nobody signed; "
                f"rebuild it with --signing-key (or ${KEY_ENV})") if signed_repository else ""
    failures = verify_version(folder, number, key)
    return "; ".join(line.split(": ", 1)[-1] for line in failures)[:400]
