"""Serving a model repository that lives in object storage (``s3://...``).

Usage::

    from builder.storage.served import inspect_repository, check_served_at

    models, left_out, versions = inspect_repository("s3://127.0.0.1:9000/models/prod")
    # models: every model folder; left_out: {name: reason}; versions: {name: [versions Triton will load]}

    report = check_served_at("digits_cnn", "s3://127.0.0.1:9000/models/prod", url="127.0.0.1:8000")

``EmbeddedServer`` calls ``inspect_repository`` when its repository is an ``s3://`` URL, so
``triton-builder serve --repository s3://...`` leaves out the same models a local folder would
(configs read from the bucket and judged by ``unsupported_models``) plus every model whose config
would make Triton load a version without a valid ``.complete`` marker (an upload in progress or
interrupted: see builder/storage/s3.py). Triton itself reads the model files straight from
the bucket (its own S3 support, credentials from the same AWS environment variables).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from builder.core.host import host_warnings
from builder.serving.backends import unsupported_models
from builder.serving.check import check_served
from builder.spec.model import NAME_PATTERN
from builder.storage.s3 import MARKER, S3Location, S3Store, is_s3_url, parse_s3_url, policy_versions, snapshot_for_check

__all__ = ["inspect_repository", "check_served_at", "served_versions", "s3_host_warnings"]


def served_versions(store: S3Store, model: str) -> tuple[list[int], list[int]]:
    """``(versions the config makes Triton load, those of them without a valid marker)``."""
    config = store.config_text(model)
    if config is None:
        return [], []
    wanted = policy_versions(config, store.version_dirs(model), store.location.child_url(model, "config.pbtxt"))
    complete = set(store.complete_versions(model))
    return wanted, [v for v in wanted if v not in complete]


def inspect_repository(location: S3Location | str, client: Any = None
                       ) -> tuple[list[str], dict[str, str], dict[str, list[int]]]:
    """``(model names, {left-out name: reason}, {served name: versions})`` of an object-store repository."""

    store = S3Store(location, client=client)
    store.check_bucket()
    names = store.models()
    left_out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="triton-builder-s3-configs-") as tmp:
        skeleton = Path(tmp)
        for name in names:
            if not NAME_PATTERN.match(name):
                left_out[name] = "not a valid model name (letters, digits, '_' and '-')"
                continue
            (skeleton / name).mkdir()
            text = store.config_text(name)
            if text is not None:
                (skeleton / name / "config.pbtxt").write_text(text)
        for name, reason in unsupported_models(skeleton).items():
            left_out[name] = reason.replace(str(skeleton), store.location.url)
    versions: dict[str, list[int]] = {}
    for name in names:
        if name in left_out:
            continue
        wanted, incomplete = served_versions(store, name)
        if not wanted:
            left_out[name] = f"no version folder in {store.location.child_url(name)}/ that its config would serve"
        elif incomplete:
            left_out[name] = (f"version {', '.join(map(str, incomplete))} named by its config has no valid {MARKER} "
                              "marker (an upload in progress or an interrupted one); publish with "
                              "`triton-builder publish`, which makes a version visible only once complete")
        else:
            versions[name] = wanted
    return names, {n: left_out[n] for n in names if n in left_out}, versions


def check_served_at(name: str, repository: str | Path, **kwargs: Any):
    """``check_served`` for a local folder or an ``s3://`` repository (its reference files fetched
    into a scratch folder first); same arguments and report as ``builder.serving.check.check_served``."""

    if not is_s3_url(repository):
        return check_served(name, repository=repository, **kwargs)
    location = parse_s3_url(str(repository), "--repository")
    with tempfile.TemporaryDirectory(prefix="triton-builder-check-") as tmp:
        version = snapshot_for_check(location, name, Path(tmp), kwargs.pop("version", None))
        return check_served(name, repository=tmp, version=version, **kwargs)


def s3_host_warnings(location: S3Location | str, models: list[str], current_host: dict | None = None,
                     client: Any = None) -> list[str]:
    """builder/core/host.py's warnings for each model's newest served version in an object-store repository
    (its metadata.yaml read from the bucket), as ``serve`` gives them for a local folder."""
    import yaml


    store = S3Store(location, client=client)
    out: list[str] = []
    for name in models:
        wanted, incomplete = served_versions(store, name)
        complete = [v for v in wanted if v not in incomplete]
        data = store.get_bytes(name, complete[-1], "metadata.yaml") if complete else None
        if data is not None:
            out += host_warnings(yaml.safe_load(data) or {}, name, current_host)
    return out
