"""Writing a tuned config back into the repository: ``config.pbtxt`` and ``tuning.json`` beside it.

Version folders are immutable once published, so the measurements that justify a tuned config live
in ``<model>/tuning.json``, next to the config they produced, and the config's header comment names
that file. Both files are replaced atomically (a temporary file in the repository folder - the model
folder's parent, so Triton never sees a half-written file in a model folder - then ``os.replace``),
under the repository lock that publishing takes. Nothing else in the model folder is touched.

Usage::

    text = config_text_from_dict(config_dict, header=["# Tuned by triton-builder tune ..."])
    config_path, record_path = write_tuned_config(repository, "digits_cnn", text, record)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from builder.core.errors import BuilderError, UserInputError
from builder.repository.config import config_as_dict, parse_config
from builder.repository.layout import _repository_lock, atomic_write, latest_version, model_dir
from builder.repository.signing import SIGNED_CONFIG

TUNING_RECORD = "tuning.json"
TUNED_MARK = "# Tuned by triton-builder tune"
#: top-level fields in the order the templates write them; others follow in the schema's order
FIELD_ORDER = ["name", "platform", "backend", "default_model_filename", "max_batch_size", "input", "output",
               "dynamic_batching", "sequence_batching", "ensemble_scheduling", "instance_group", "version_policy",
               "optimization", "model_warmup", "parameters"]


def config_text_from_dict(config: dict[str, Any], header: list[str] | None = None) -> str:
    """Triton config text (protobuf text format, checked with Triton's schema) from its JSON form.

    ``header`` lines are written first, each as a ``#`` comment.
    """
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    message = model_config_pb2.ModelConfig()
    try:
        json_format.ParseDict(config, message)
    except json_format.ParseError as exc:
        raise BuilderError(f"config does not fit Triton's schema: {exc}") from None
    present = [f.name for f, _ in message.ListFields()]
    present.sort(key=lambda n: FIELD_ORDER.index(n) if n in FIELD_ORDER else len(FIELD_ORDER))
    parts = []
    for name in present:  # one top-level field at a time: the templates' order, not the schema's
        part = model_config_pb2.ModelConfig()
        part.CopyFrom(message)
        for other in present:
            if other != name:
                part.ClearField(other)
        parts.append(text_format.MessageToString(part, as_utf8=True, use_short_repeated_primitives=True).rstrip())
    body = "\n".join(parts)
    comments = [line if line.startswith("#") else f"# {line}" for line in (header or [])]
    text = "\n".join(comments + [body]) + "\n"
    if parse_config(text) != message:
        raise BuilderError("config text does not read back as the config it was written from")
    return text


def original_header(text: str) -> list[str]:
    """The leading comment lines of a config, without an earlier tuning's lines."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if line.startswith(TUNED_MARK) or line.startswith("#   "):
            continue  # an earlier tuning's header (its continuation lines are indented)
        lines.append(line)
    return lines


def refuse_if_signed(repository: str | Path, name: str) -> None:
    """A signed latest version's signature covers a copy of the config it was published with
    (signing.SIGNED_CONFIG): rewriting config.pbtxt in place would make `serve --public-key` refuse it.
    Raises UserInputError naming the way that keeps it signed: ``tune --publish`` (a new, signed version)."""

    folder = model_dir(Path(repository).resolve(), name)
    version = latest_version(folder) if folder.is_dir() else None
    if version is not None and (folder / str(version) / SIGNED_CONFIG).is_file():
        raise UserInputError(f"{name} version {version} is signed: writing the tuned config into {folder / 'config.pbtxt'}"
                             " in place would break its signature (serve --public-key would refuse it); use "
                             "`tune --publish` with --signing-key (or $TRITON_BUILDER_SIGNING_KEY) to publish the "
                             "tuned config as a new signed version")


def monitored_step(repository: str | Path, name: str, say: Callable[[str], object]) -> str:
    """The model to tune for ``name``: itself, or the model step of a monitored ensemble (deploy.monitor),
    which has no scheduling of its own to tune."""
    step = model_dir(Path(repository), name).name
    if step == name:
        return name
    say(f"note: '{name}' is a monitored ensemble: tuning its model step '{step}' (measured without the monitor "
        "step, whose cost is in docs/benchmarks.md)")
    return step


def write_tuned_config(repository: str | Path, name: str, config_text: str,
                       record: dict[str, Any]) -> tuple[Path, Path]:
    """Replace ``<repository>/<name>/config.pbtxt`` with ``config_text`` and write ``record`` as
    ``<repository>/<name>/tuning.json``, each atomically; returns both paths.

    The new config must parse with Triton's schema, name this model, and keep its backend/platform,
    inputs and outputs (tuning changes how a model is scheduled, never what it is); otherwise
    ``BuilderError`` and nothing is written. A signed latest version is refused (``refuse_if_signed``).
    """
    refuse_if_signed(repository, name)
    root = Path(repository).resolve()
    folder = model_dir(root, name)
    current_path = folder / "config.pbtxt"
    if not current_path.is_file():
        raise UserInputError(f"{current_path} is missing: model '{name}' is not in {root}; pass --repository")
    new = config_as_dict(config_text)  # parses with Triton's schema (BuilderError if not)
    old = config_as_dict(current_path.read_text(encoding="utf-8"))
    if new.get("name") != name:
        raise BuilderError(f"tuned config names model {new.get('name')!r}, not '{name}'")
    for key in ("backend", "platform", "input", "output"):
        if new.get(key) != old.get(key):
            raise BuilderError(f"tuned config of '{name}' changes '{key}' ({old.get(key)!r} -> {new.get(key)!r}); "
                               "tuning may only change batching, instances and max_batch_size")
    record_text = json.dumps(record, indent=2, default=str) + "\n"
    with _repository_lock(root):
        atomic_write(root, folder / TUNING_RECORD, record_text)
        atomic_write(root, current_path, config_text)
    return current_path, folder / TUNING_RECORD
