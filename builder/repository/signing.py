"""Signing and verifying published versions with OpenSSF model-signing (``pip install 'triton-builder[signing]'``).

A version is signed at publish time, in its staging folder, so it appears signed or not at all. The
signature (``model.sig``, a Sigstore bundle) sits in the version folder and covers every file there:
the model files, the python backend's files, ``metadata.yaml``, ``reference.npz``, the reports, and
``signed_config.pbtxt`` - a byte copy of the ``config.pbtxt`` published with the version.
Why a copy: Triton reads ``config.pbtxt`` from the MODEL folder, which each later version replaces,
so a signature over the model folder would break whenever a new version is published. The version
folder is immutable once published; verification checks the signed copy there, and that the model
folder's ``config.pbtxt`` (what Triton actually loads) is byte-identical to the latest version's
signed copy (it is what that publish wrote).

Keys: elliptic-curve PEM key pairs (model-signing's key-based mode); the private key's path comes from
``--signing-key`` or ``TRITON_BUILDER_SIGNING_KEY``, its password only from
``TRITON_BUILDER_SIGNING_KEY_PASSWORD`` (never a command-line argument); the public key from
``--public-key`` or ``TRITON_BUILDER_PUBLIC_KEY``. Keys are read, never copied: a key inside the
repository is refused. Keyless Sigstore signing needs network and an OIDC identity: not offered here.

Usage::

    key = signing_key("keys/signing.pem", repository)      # None: no key configured -> unsigned
    sign_version(staged_version_folder, key)               # called by publish_model
    failures = verify_model(Path("model_repository/digits_cnn"), [3], Path("keys/signing.pub"), required=True)
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from builder.core.errors import UserInputError, VerificationError
from builder.core.extras import require
from builder.repository.layout import existing_versions, latest_version, model_dir

SIGNATURE_FILE = "model.sig"
SIGNED_CONFIG = "signed_config.pbtxt"
KEY_ENV = "TRITON_BUILDER_SIGNING_KEY"
PASSWORD_ENV = "TRITON_BUILDER_SIGNING_KEY_PASSWORD"
PUBLIC_KEY_ENV = "TRITON_BUILDER_PUBLIC_KEY"
#: the rollout record `rollback` writes beside a model's config.pbtxt, and its signature
RECORD_FILE = "rollout.yaml"
RECORD_SIGNATURE = "rollout.sig"


@dataclass(frozen=True)
class SigningKey:
    path: Path
    password: str | None = field(default=None, repr=False)


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(Path(folder).resolve())
        return True
    except ValueError:
        return False


def _key_path(value: str | Path | None, env: str, flag: str, repository: Path | None) -> Path | None:
    source = flag if value else env
    value = value or os.environ.get(env) or None
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise UserInputError(f"{source}: {path} is not a file; give the path of a PEM key file")
    if repository is not None and _inside(path, repository):
        raise UserInputError(f"{source}: {path} lies inside the model repository {Path(repository).resolve()}, "
                             "which Triton and its readers see; keep keys outside it")
    return path


def signing_key(value: str | Path | None, repository: Path | None = None) -> SigningKey | None:
    """The private key from ``value`` (the CLI's --signing-key) or $TRITON_BUILDER_SIGNING_KEY; None if neither."""
    path = _key_path(value, KEY_ENV, "--signing-key", repository)
    return None if path is None else SigningKey(path, os.environ.get(PASSWORD_ENV) or None)


def public_key(value: str | Path | None, repository: Path | None = None) -> Path | None:
    """The public key from ``value`` (--public-key) or $TRITON_BUILDER_PUBLIC_KEY; None if neither."""
    return _key_path(value, PUBLIC_KEY_ENV, "--public-key", repository)


def _model_signing():
    require("model_signing", "signing and verifying versions")
    from model_signing import hashing, signing, verifying
    return hashing, signing, verifying


def sign_version(folder: Path, key: SigningKey) -> None:
    """Write ``folder/model.sig`` over every other file of the (staged) version folder."""
    hashing, signing, _ = _model_signing()
    config = hashing.Config().set_ignored_paths(paths=[SIGNATURE_FILE], ignore_git_paths=False)
    # bytes: model-signing 1.1.1 hints str, but hands it to cryptography, which needs bytes
    password = key.password.encode() if key.password else None
    try:
        (signing.Config().use_elliptic_key_signer(private_key=key.path, password=password)
         .set_hashing_config(config).sign(folder, folder / SIGNATURE_FILE))
    except (ValueError, TypeError) as err:  # a wrong password, not an EC private key, ...
        raise UserInputError(f"signing key {key.path}: {err}; give an elliptic-curve private key in PEM "
                             f"(and its password in ${PASSWORD_ENV} if it is encrypted)") from None


def _explain(diff: str, version: int) -> list[str]:
    """model-signing's mismatch text (a list's repr: quotes may come escaped) -> one line per file, naming it."""
    q = r"\\?'"  # a quote, escaped or not
    lines = [f"version {version}: {name}: changed after signing (its hash no longer matches {SIGNATURE_FILE})"
             for name in re.findall(r"Hash mismatch for " + q + r"([^'\\]+)" + q, diff)]
    for kind, what in (("Extra files found", "added after signing"), ("Missing files", "removed after signing")):
        found = re.search(kind + r" in model " + q + r"[^'\\]*" + q + r": ([^\"'\\\]]+)", diff)
        if found:
            lines.extend(f"version {version}: {name.strip()}: {what}" for name in found.group(1).split(", "))
    return lines or [f"version {version}: {SIGNATURE_FILE}: {diff}"]


def verify_version(folder: Path, number: int, key: Path) -> list[str]:
    """Failures (empty: the signature is valid and every signed file is unchanged)."""
    _, _, verifying = _model_signing()
    try:
        verifying.Config().use_elliptic_key_verifier(public_key=key).verify(folder, folder / SIGNATURE_FILE)
    except ValueError as err:
        text = str(err)
        if "Signature mismatch" in text:
            return _explain(text, number)
        return [f"version {number}: {SIGNATURE_FILE}: not a valid signature for the public key {key} ({text}); "
                "was it signed with another key?"]
    except Exception as err:  # noqa: BLE001 - a damaged bundle raises various parser errors
        return [f"version {number}: {SIGNATURE_FILE}: unreadable signature ({type(err).__name__}: {err})"]
    return []


def verify_model(folder: Path, versions: list[int], key: Path | None, required: bool = False,
                 warnings: list[str] | None = None) -> list[str]:
    """Check the signatures of ``versions`` of the model in ``folder`` with ``key`` (None: only
    whether they are signed, if ``required``), and that config.pbtxt is the latest version's signed
    copy. Returns failure lines naming version and file; ``warnings`` (when given) gets a line per
    version a ``key`` could not check (unsigned: only its hashes vouch for it)."""
    failures: list[str] = []
    if required and key is None:
        raise UserInputError(f"--require-signature needs a public key: pass --public-key or set ${PUBLIC_KEY_ENV}")
    for number in versions:
        version_folder = folder / str(number)
        if not (version_folder / SIGNATURE_FILE).is_file():
            if (version_folder / SIGNED_CONFIG).is_file():
                # only a signing publish writes the signed copy, and always with model.sig: a version holding
                # one without the other had its signature removed, which would pass it as merely unsigned
                failures.append(f"version {number}: {SIGNATURE_FILE} is missing but {SIGNED_CONFIG} is there: the "
                                "version was signed and its signature removed (tampered?); restore the version from "
                                "where it was published, or rebuild it with --signing-key")
            elif required:
                failures.append(f"version {number}: unsigned (no {SIGNATURE_FILE}); --require-signature refuses it: "
                                "rebuild with --signing-key (or $" + KEY_ENV + ")")
            elif key is not None and warnings is not None:
                warnings.append(f"version {number}: unsigned (no {SIGNATURE_FILE}): not checked with the public "
                                "key, only against metadata.yaml's hashes (which anyone can rewrite); "
                                "--require-signature refuses unsigned versions")
            continue
        if key is not None:
            failures.extend(verify_version(version_folder, number, key))
    newest = latest_version(folder)
    if newest is not None and key is not None:
        signed = folder / str(newest) / SIGNED_CONFIG
        served = (folder / "config.pbtxt").read_bytes()
        if signed.is_file() and served != signed.read_bytes() and _rolled_back(folder, served, key):
            pass  # `rollback` wrote it: its signed rollout record vouches for it (builder/repository/rollback.py)
        elif signed.is_file() and served != signed.read_bytes():
            failures.append(f"config.pbtxt: differs from {newest}/{SIGNED_CONFIG}, the config signed with "
                            "the latest version (edited or tuned after signing): rebuild, or restore the signed copy")
        elif not signed.is_file() and warnings is not None and not (folder / str(newest) / SIGNATURE_FILE).is_file():
            warnings.append(f"config.pbtxt: not checked with the public key: the latest version {newest} is unsigned, "
                            "so no signed copy vouches for it")
    return failures


def _rolled_back(folder: Path, served: bytes, key: Path) -> bool:
    """Whether a signed rollout record (``rollback``) vouches for the model folder's config.pbtxt ``served``."""
    return not record_vouches(folder, served, key)


def verify_repository(repository: str | Path, key: str | Path | None, required: bool = False) -> None:
    """Before serving: verify every version of every model in ``repository`` (the key from ``key`` or
    $TRITON_BUILDER_PUBLIC_KEY; neither and not ``required``: nothing to do). Raises
    VerificationError listing each refused model, version and file."""
    if str(repository).startswith("s3://"):
        if key or required or os.environ.get(PUBLIC_KEY_ENV):
            raise UserInputError("--public-key/--require-signature: verifying an s3:// repository is not supported; "
                                 "validate the local repository before `publish --to s3://`")
        return
    root = Path(repository)
    path = public_key(key, root)
    if path is None and not required:
        return
    failures = []
    for folder in sorted(p for p in root.iterdir() if (p / "config.pbtxt").is_file()) if root.is_dir() else []:
        failures += [f"{folder.name}: {line}" for line in
                     verify_model(folder, existing_versions(folder), path, required)]
    if failures:
        raise VerificationError("refusing to serve: signature verification failed:\n  "
                                + "\n  ".join(failures))


def sha256_text(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def read_record(folder: Path) -> dict[str, Any]:
    path = Path(folder) / RECORD_FILE
    if not path.is_file():
        return {}
    try:
        record = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return {}
    return record if isinstance(record, dict) else {}


def record_vouches(folder: Path, config_bytes: bytes, key: Path) -> list[str]:
    """Failures ([] when the signed rollout record of model ``folder`` vouches for ``config_bytes``)."""
    record_path, signature = Path(folder) / RECORD_FILE, Path(folder) / RECORD_SIGNATURE
    if not record_path.is_file() or not signature.is_file():
        return ["no signed rollout record"]
    if read_record(folder).get("config_sha256") != sha256_text(config_bytes):
        return [f"{RECORD_FILE}: names another config.pbtxt (its config_sha256 differs)"]
    scratch = Path(tempfile.mkdtemp(prefix="triton-builder-rollout-"))
    try:
        shutil.copyfile(record_path, scratch / RECORD_FILE)
        shutil.copyfile(signature, scratch / SIGNATURE_FILE)
        return [line.replace(f"version 0: {SIGNATURE_FILE}", RECORD_SIGNATURE)
                for line in verify_version(scratch, 0, key)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def resolve_signing_key(value, repository: Path):
    """A SigningKey from ``value`` (a PEM path, a SigningKey, or None: $TRITON_BUILDER_SIGNING_KEY), or None."""
    return value if isinstance(value, SigningKey) else signing_key(value, repository)


def require_key_if_signed(repository: Path, name: str, key) -> None:
    """Refuse to publish an unsigned version on top of a signed latest one: the new version would be the
    served one, and `serve --require-signature` would then refuse the whole repository."""
    main = model_dir(repository, name)
    number = latest_version(main) if main.is_dir() else None
    if key is not None or number is None or not (main / str(number) / SIGNATURE_FILE).is_file():
        return
    raise UserInputError(f"{main / str(number) / SIGNATURE_FILE}: {name} version {number} is signed, but no signing "
                         f"key was given, so the new version would be published unsigned (validate and serve "
                         f"--require-signature refuse it); pass --signing-key PEM or set ${KEY_ENV}")
