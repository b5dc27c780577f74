"""Publishing a version's files again as a new version of a model, with another config and metadata
(no re-export): `triton-builder select` (builder/repository/reselect.py, the winner re-measured on the
serving host) and `tune --publish` (``publish_tuned``, the tuned config). Signed while staged where a
signing key is given, as build signs; an unsigned version is refused on top of a signed latest one.

Usage::

    publish_tuned(Path("model_repository"), "digits_cnn", tuned_config_text, tuning_record, signing_key=key)
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from builder.core.errors import BuilderError, UserInputError
from builder.repository.config import (DynamicBatching, ModelConfig, TensorConfig, config_as_dict, parse_config,
                                       thread_parameter)
from builder.repository.description import VersionDescription
from builder.repository.layout import is_monitored, latest_version, model_dir, not_in_repository, reserve_version
from builder.repository.metadata import read_metadata
from builder.repository.publish import publish_model
from builder.repository.rollback import restore_policy
from builder.repository.signing import require_key_if_signed, resolve_signing_key
from builder.repository.warmup_data import read_warmup_files

COPIED_EXTRAS = ("drift_profile.json",)  # besides reference.npz: copied with the model files
TUNED = "by triton-builder tune"  # metadata.yaml serving.sized of a version `tune --publish` published


def version_model_files(folder: Path, artifact: dict[str, Any]) -> list[Path]:
    """The version's model file first, then its companions (ONNX external data; an IR's model.bin)."""
    main = artifact["file"]
    companions = [p for p in folder.iterdir() if p.name != main and (
        p.name.startswith(main) or (artifact["format"] == "openvino" and p.name == Path(main).stem + ".bin"))]
    return [folder / main, *sorted(companions)]


def renamed_config(winner_model: Path, name: str, sizing: tuple[int, int | None] | None, text: str | None = None,
                   delay_us: int | None = None):
    """The config.pbtxt of model folder ``winner_model`` (or ``text``) renamed to ``name`` and sized
    (``sizing``: instances x threads, threads None: kept; ``delay_us``: the batching delay, where it
    batches), through Triton's schema: (text, the ModelConfig of its name, backend and tensors that
    publish_model checks)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2


    where = str(winner_model / "config.pbtxt")
    message = parse_config(text if text is not None else Path(where).read_text(), where)
    message.name = name
    restore_policy(winner_model, message)  # on top of a rollback: the new version is served (rollback.py)
    for group in message.instance_group if sizing else ():
        if group.kind != group.KIND_GPU:
            group.count = sizing[0]
    key = thread_parameter(message.parameters)
    if sizing and sizing[1] and key:
        message.parameters[key].string_value = str(sizing[1])
    if delay_us is not None and message.HasField("dynamic_batching"):
        message.dynamic_batching.max_queue_delay_microseconds = delay_us

    def tensors(items):  # with their reshape: what publish_model's checks and the warm-up replay read
        return [TensorConfig(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims) or [1],
                             reshape=list(t.reshape.shape) if t.HasField("reshape") else None) for t in items]
    batching = DynamicBatching() if message.HasField("dynamic_batching") else None
    config = ModelConfig(name=name, backend=message.backend or message.platform, max_batch_size=message.max_batch_size,
                         inputs=tensors(message.input), outputs=tensors(message.output), dynamic_batching=batching)
    return text_format.MessageToString(message), config






def refuse_monitored(repository, name: str) -> None:
    """A monitored model's new version needs its monitor step's version too, which only a build writes."""
    if is_monitored(Path(repository), name):
        raise UserInputError(f"'{name}' is a monitored ensemble (deploy.monitor): a new version of it is published by "
                             "`triton-builder build` (which also writes the monitor step's version), not by select "
                             "or tune --publish; rebuild it, or tune with --write to change its model step's config")


def republish(repository, name, model_format, model_files, runtime, extra, record, text, config, source: Path,
              key=None) -> dict[str, Any]:
    """A new version of ``name`` from these parts, signed while staged when ``key`` is given (as build does);
    ``source``: the model folder ``text`` was taken from (its warm-up files travel with it)."""

    refuse_monitored(repository, name)
    warmup_files = read_warmup_files(source, text)  # before a version is reserved: a missing file is the user's
    with reserve_version(repository, name, None) as reservation:
        description = VersionDescription(name=name, version=reservation.version, config=config,
                                         model_format=model_format, model_files=model_files,
                                         runtime_files=runtime, extra_files=extra, metadata=record,
                                         config_text=text, signing_key=key, warmup_files=warmup_files)
        return publish_model(repository, description, reservation)


def publish_tuned(repository: str | Path, name: str, config_text: str, tuning: dict[str, Any],
                  signing_key=None) -> dict[str, Any]:
    """`tune --publish`: the latest version of ``name`` again (same files, no re-export) as a new version
    served with ``config_text`` (the tuned config), ``tuning.json`` inside it and the chosen instances and
    threads in metadata.yaml's ``serving``; signed with ``signing_key`` (a PEM path or SigningKey;
    default $TRITON_BUILDER_SIGNING_KEY). Only scheduling may change (the backend, inputs and outputs
    must stay: BuilderError otherwise)."""
    import json


    repository = Path(repository)
    signer = resolve_signing_key(signing_key, repository)
    main = model_dir(repository, name)
    if not main.is_dir():
        raise not_in_repository(name, repository)
    number = latest_version(main)
    if number is None:
        raise UserInputError(f"model '{name}' has no version in {repository.resolve()}; build it first")
    require_key_if_signed(repository, name, signer)
    folder = main / str(number)
    new, old = config_as_dict(config_text), config_as_dict((main / "config.pbtxt").read_text())
    for key in ("backend", "platform", "input", "output"):
        if new.get(key) != old.get(key):
            raise BuilderError(f"tuned config of '{name}' changes '{key}': tuning may only change scheduling")
    text, config = renamed_config(main, name, None, config_text)
    meta = read_metadata(folder / "metadata.yaml")
    artifact = meta["artifact"]
    model_files = version_model_files(folder, artifact)
    runtime = {n: folder / n for n in ("model.py", "drift.py") if (folder / n).is_file()}
    extra: dict[str, bytes] = {n: (folder / n).read_bytes() for n in ("reference.npz",) + COPIED_EXTRAS
                               if (folder / n).is_file()}
    extra["tuning.json"] = (json.dumps(tuning, indent=2, default=str) + "\n").encode()
    threads = (new.get("parameters") or {}).get(thread_parameter(new.get("parameters") or {}) or "", {}).get("string_value")
    record = dict(meta)
    record.update({
        "build_date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "serving": {"instances": sum(int(g.get("count", 1)) for g in new.get("instance_group") or [{}]),
                    "intra_op_threads": int(threads) if threads else None,
                    "sized": f"{TUNED} (measured on the running server; tuning.json)"},
        "tuned_from": {"version": number},
    })
    return republish(repository, name, artifact["format"], model_files, runtime, extra, record, text, config,
                     main, signer)
