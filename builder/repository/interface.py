"""A model's serving interface - max_batch_size, the backend, and each input's and output's name, data
type, dims and reshape, in order - and the rule that keeps it shared by every version Triton serves: a model folder
holds several versions but ONE config.pbtxt, so a new version whose interface differs rewrites the
config under the older versions.

- ``interface_change(repository, name, config_text)``: before a publish. ``None`` when nothing changes;
  a ``UserInputError`` when the new config's version_policy would also serve an older version built
  for another interface (Triton would fail to load the model); else an ``InterfaceChange`` whose
  ``warning(version)`` says what rollback no longer works and what to do instead.
- ``version_mismatch(meta, config)``: for ``validate``: how the interface a version was built for
  (its metadata.yaml's ``spec``) differs from the model folder's config.pbtxt ([] when it matches).

Usage::

    change = interface_change(repo, "digits_cnn", render_config(config))   # raises under version_policy all
    if change: progress("warning: " + change.warning(new_version))
    problems = version_mismatch(read_metadata(folder / "metadata.yaml"), parse_config(text))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.errors import UserInputError
from builder.repository.config import TensorConfig, parse_config
from builder.repository.layout import existing_versions, model_dir
from builder.repository.metadata import read_metadata
from builder.spec.model import TRITON_DTYPES

Tensor = tuple[str, str | None, list[int], list[int] | None]  # name, data_type (None: unknown), dims, reshape


def config_interface(config) -> dict[str, Any]:
    """The interface a parsed config (tritonclient model_config_pb2.ModelConfig) describes."""
    from tritonclient.grpc import model_config_pb2

    def tensors(items) -> list[Tensor]:
        return [(t.name, model_config_pb2.DataType.Name(t.data_type), [int(d) for d in t.dims],
                 [int(d) for d in t.reshape.shape] if t.HasField("reshape") else None) for t in items]
    return {"max_batch_size": int(config.max_batch_size), "backend": config.platform or config.backend,
            "input": tensors(config.input), "output": tensors(config.output)}


def recorded_interface(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The interface a version was built for, from its metadata.yaml (the config publish rendered for it
    follows the same rules: builder/repository/publish.py config_for); None if it records no spec."""
    spec = meta.get("spec") if isinstance(meta, dict) else None
    if not isinstance(spec, dict) or "inputs" not in spec or "outputs" not in spec:
        return None

    def tensors(items) -> list[Tensor]:
        out = []
        for t in items or []:
            per_sample = TensorConfig.per_sample(t["name"], "", [int(d) for d in t.get("shape") or []],
                                                 batching=spec.get("max_batch_size") != 0)
            out.append((t["name"], TRITON_DTYPES.get(str(t.get("dtype"))), per_sample.dims, per_sample.reshape))
        return out
    return {"max_batch_size": spec.get("max_batch_size"), "backend": (meta.get("artifact") or {}).get("backend"),
            "input": tensors(spec["inputs"]), "output": tensors(spec["outputs"])}


def interface_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs from ``old`` to ``new``, one phrase each: ``input 'x' dims [16] -> [32]``."""
    changes = []
    if old["max_batch_size"] is not None and old["max_batch_size"] != new["max_batch_size"]:
        changes.append(f"max_batch_size {old['max_batch_size']} -> {new['max_batch_size']}")
    # one backend serves every version (the python backend's model.py finds each version's own model file)
    if old.get("backend") and new.get("backend") and old["backend"] != new["backend"]:
        changes.append(f"backend {old['backend']} -> {new['backend']}")
    for kind in ("input", "output"):
        before = {t[0]: t for t in old[kind]}
        after = {t[0]: t for t in new[kind]}
        changes += [f"{kind} '{n}' removed" for n in before if n not in after]
        changes += [f"{kind} '{n}' added" for n in after if n not in before]
        for name in (n for n in before if n in after):
            (_, type_a, dims_a, reshape_a), (_, type_b, dims_b, reshape_b) = before[name], after[name]
            if type_a is not None and type_b is not None and type_a != type_b:
                changes.append(f"{kind} '{name}' data_type {type_a} -> {type_b}")
            if dims_a != dims_b:
                changes.append(f"{kind} '{name}' dims {dims_a} -> {dims_b}")
            if reshape_a != reshape_b:
                changes.append(f"{kind} '{name}' reshape {_reshape(reshape_a)} -> {_reshape(reshape_b)}")
        common_a, common_b = [n for n in before if n in after], [n for n in after if n in before]
        if common_a != common_b:
            changes.append(f"{kind} order {common_a} -> {common_b}")
    return changes


def _reshape(value: list[int] | None) -> str:
    return "none" if value is None else str(value)


def version_mismatch(meta: dict[str, Any], config) -> list[str]:
    """How the model folder's config (parsed) differs from the interface this version was built for:
    phrases 'version -> config' ([] when it matches or the version records no spec)."""
    recorded = recorded_interface(meta)
    return [] if recorded is None else interface_changes(recorded, config_interface(config))


def _served_too(config, versions: list[int]) -> bool:
    """Whether the config's version_policy makes Triton load any of ``versions`` (older than the new one)."""
    if not config.HasField("version_policy"):
        return False  # Triton's default: latest 1
    choice = config.version_policy.WhichOneof("policy_choice")
    if choice == "all":
        return True
    if choice == "latest":
        return config.version_policy.latest.num_versions > 1
    return bool(set(versions) & set(config.version_policy.specific.versions))


def _policy_text(config) -> str:
    choice = config.version_policy.WhichOneof("policy_choice") if config.HasField("version_policy") else None
    if choice == "latest":
        return f"latest {{ num_versions: {config.version_policy.latest.num_versions} }}"
    if choice == "specific":
        return f"specific {list(config.version_policy.specific.versions)}"
    return choice or "latest"


def _versions_text(versions: list[int]) -> str:
    return ("version " if len(versions) == 1 else "versions ") + ", ".join(str(v) for v in versions)


@dataclass
class InterfaceChange:
    model: str
    changes: list[str]  # existing config.pbtxt -> the new one
    versions: list[int]  # existing versions built for another interface than the new config's

    def warning(self, version: int) -> str:
        older = _versions_text(self.versions)
        keeps = "keeps" if len(self.versions) == 1 else "keep"
        return (f"model '{self.model}' version {version} changes the interface ({'; '.join(self.changes)}): "
                f"the model's one config.pbtxt now describes version {version}, and {older} {keeps} an "
                f"interface it no longer describes. Triton serves only version {version} (version_policy "
                f"latest), but rolling back by deleting version {version} will not serve {older}. To roll back, "
                "build the previous spec again (a new version whose config.pbtxt matches it); to serve both "
                "interfaces, publish the new one under a new model name")


def interface_change(repository: Path, name: str, config_text: str,
                     compare_backend: bool = True) -> InterfaceChange | None:
    """Compare the config about to be published for ``name`` with its model folder's versions. Raises
    UserInputError (before anything is written) when its version_policy would also serve an older version
    built for another interface (Triton would fail to load the model); None when the interface of the
    folder's config.pbtxt does not change; else the change, for a warning. ``compare_backend=False``: a
    check before the variant (so the backend) is chosen."""
    folder = model_dir(repository, name)
    existing = existing_versions(folder)
    config_path = folder / "config.pbtxt"
    if not existing or not config_path.is_file():
        return None

    new = parse_config(config_text)
    new_interface = config_interface(new)
    if not compare_backend:
        new_interface["backend"] = None
    old_interface = config_interface(parse_config(config_path.read_text(), str(config_path)))
    changes = interface_changes(old_interface, new_interface)
    differs: dict[int, list[str]] = {}  # version -> how the new config differs from what it was built for
    for number in existing:
        meta_path = folder / str(number) / "metadata.yaml"
        try:
            recorded = recorded_interface(read_metadata(meta_path)) if meta_path.is_file() else None
        except Exception:  # noqa: BLE001 - an unreadable record: the version was built for the current config
            recorded = None
        found = interface_changes(recorded or old_interface, new_interface)
        if found:
            differs[number] = found
    affected = sorted(differs)
    if affected and _served_too(new, affected):
        details = "; ".join(f"version {v}: {', '.join(differs[v])}" for v in affected)
        raise UserInputError(
            f"model '{name}': the config.pbtxt this build publishes describes another interface than "
            f"{_versions_text(affected)} of {folder} {'was' if len(affected) == 1 else 'were'} built for "
            f"({details}), and a model folder's versions "
            f"share its one config.pbtxt; deploy.version_policy {_policy_text(new)} serves those too, so Triton "
            "would load them with the new config and fail to serve the model. Nothing was published. Fix: "
            "publish under a new model name (spec field 'name'), or set deploy.version_policy: latest (only the "
            f"newest version is served), or remove {_versions_text(affected)} from {folder} first")
    if not changes or not affected:
        return None  # the shared config keeps its interface, or every version already matches the new one
    return InterfaceChange(name, changes, affected)
