"""`triton-builder rollback NAME --repository s3://...`: serve an earlier complete version of a model in object storage.

The bucket's ``<model>/config.pbtxt`` is the switch (builder/storage/s3.py): its ``version_policy { specific }``
names the versions Triton loads, and one PUT of one object is atomic. A rollback checks version N first - complete
(its ``.complete`` marker and every file it lists), then every file downloaded into a scratch folder and checked
as ``validate`` checks a local version, against the config about to be written - then writes
``<model>/rollout.yaml`` (the record: which version served when) and, last, config.pbtxt pinned to [N]: version N's
own config where it kept one (``signed_config.pbtxt``), else the bucket's with only its policy changed.

Signatures are not checked or written here (verifying an s3:// repository is not supported: validate the local
repository before ``publish``). A later ``publish --to`` writes config.pbtxt from the local repository's policy
again, which ends the rollback: roll back the local repository too, or publish after fixing it.

Usage::

    report = rollback_s3("s3://127.0.0.1:9000/models/prod", "digits_cnn", to=1)
"""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path
from typing import Any, Callable

import yaml

from builder.core.errors import UserInputError
from builder.huggingface.ragged import version_ragged
from builder.repository.rollback import (RollbackReport, pinned_config, policy_text, refuse_failed, served_versions,
                                         target_version)
from builder.repository.signing import RECORD_FILE, sha256_text
from builder.repository.validate import validate_model
from builder.repository.warmup_data import read_warmup_files, referenced_files
from builder.storage.s3_location import parse_s3_url
from builder.storage.s3_store import MARKER, S3Store


def _download(store: S3Store, model: str, version: int, dest: Path) -> None:
    marker = store.read_marker(model, version) or {}
    for relative in marker.get("files") or {}:
        data = store.get_bytes(model, version, *relative.split("/"))
        if data is None:
            raise UserInputError(f"{store.location.child_url(model, version, relative)}: missing, though the "
                                 f"{MARKER} marker lists it; publish the version again")
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        (dest / relative).write_bytes(data)


def _history(store: S3Store, model: str) -> dict[str, Any]:
    data = store.get_bytes(model, RECORD_FILE)
    try:
        record = yaml.safe_load(data) if data else {}
    except yaml.YAMLError:
        record = {}
    return record if isinstance(record, dict) else {}


def rollback_s3(url: str, name: str, to: int | None = None, *, client: Any = None,
                progress: Callable[[str], object] = lambda message: None,
                now: Callable[[], dt.datetime] | None = None) -> RollbackReport:
    """Serve version ``to`` (default: the one before the served one) of ``name`` in the s3:// repository ``url``."""

    location = parse_s3_url(url, "--repository")
    store = S3Store(location, client=client)
    store.check_bucket()
    current_text = store.config_text(name)
    if current_text is None:
        models = store.models()
        raise UserInputError(f"model '{name}' is not in {location.url} (its models: {', '.join(models) or 'none'})")
    complete = store.complete_versions(name)
    served = served_versions(current_text, complete, location.child_url(name, "config.pbtxt"))
    current = served[-1] if served else None
    number = target_version(name, complete, current, to, location.url + " (complete versions)")
    own = store.get_bytes(name, number, "signed_config.pbtxt")
    base, source = ((own.decode(), f"version {number}'s own config (its signed copy)") if own is not None else
                    (current_text, f"the served config with only its version_policy changed (version {number} "
                                   "kept no config of its own)"))
    at = (now or (lambda: dt.datetime.now(dt.timezone.utc)))().strftime("%Y-%m-%d %H:%M:%S")
    header = (f"Written by `triton-builder rollback` at {at} UTC: serves version {number} (was {current}).\n"
              "A `publish --to` writes the local repository's policy again; see rollout.yaml.")
    text = pinned_config(base, number, header, location.child_url(name, "config.pbtxt"))
    progress(f"downloading version {number} of {name} to validate it against the config a rollback would serve")
    with tempfile.TemporaryDirectory(prefix="triton-builder-rollback-") as scratch:
        folder = Path(scratch) / name
        (folder / str(number)).mkdir(parents=True)
        (folder / "config.pbtxt").write_text(text)
        _download(store, name, number, folder / str(number))
        ragged = version_ragged(folder / str(number))  # the config made to match the version's graph
        if ragged is not None:
            text = pinned_config(base, number, header, location.child_url(name, "config.pbtxt"), ragged)
            (folder / "config.pbtxt").write_text(text)
        for relative in referenced_files(text):
            data = store.get_bytes(name, *relative.split("/"))
            if data is not None:
                (folder / relative).parent.mkdir(parents=True, exist_ok=True)
                (folder / relative).write_bytes(data)
        read_warmup_files(folder, text)  # a warm-up file the config names and the bucket lacks: refused here
        report = validate_model(folder, number, config_text=text)
    refuse_failed(name, number, report, url)
    record = _history(store, name)
    if record.get("served_version") is None or record.get("config_sha256") != sha256_text(current_text):
        record["replaced_policy"] = policy_text(current_text)
    history = [h for h in record.get("history") or [] if isinstance(h, dict)]
    history.append({"at": at, "version": number, "event": f"rollback from version {current}"})
    record.update({"model": name, "served_version": number, "config_sha256": sha256_text(text),
                   "config_source": source, "history": history[-200:]})
    store.put_bytes(yaml.safe_dump(record, sort_keys=False).encode(), name, RECORD_FILE, content_type="text/yaml")
    store.put_bytes(text.encode(), name, "config.pbtxt", content_type="text/plain")  # last: the switch
    progress(f"{name}: {location.child_url(name, 'config.pbtxt')} now serves version {number}")
    return RollbackReport(model=name, repository=location.url, from_version=current, to_version=number,
                          config_source=source, signed=False, history=history,
                          notes=["Triton polling the bucket switches by itself; in explicit mode load the model again"])

