"""deploy.monitor: a model served by a standard backend, monitored on the stock Triton image.

Drift gauges and the NaN/Inf counters need Python code that sees the request's tensors. A standard
folder (onnxruntime_onnx, pytorch_libtorch, openvino, tensorrt_plan) has none, so a monitored model is
published as three ordinary Triton models:

- ``<name>``: ``platform: "ensemble"``, the name clients call (inputs and outputs as the model's);
  its version folder ``1/`` stays empty (ensembles carry no files);
- ``<name>__model``: the standard folder with its versions, metadata and reference cases, exactly as
  it would be served without monitoring (Triton's dynamic batcher and instances run here);
- ``<name>__monitor``: a python step (templates/monitor/model.py, numpy only: the stock image's python
  backend runs it) that takes the inputs and the model's outputs (as ``<output>__model``), counts or
  refuses NaN/Inf inputs, feeds the drift window and hands the outputs on. Its version N carries the
  drift profile of the model's version N.

Why an ensemble: Triton has no hook that shows a C++ backend's tensors to other code (metrics carry
counts and durations, never values), and an ensemble is the one mechanism the stock image runs that
puts a step in the request path without changing the model folder or the clients. A pure side-effect
step is illegal in an ensemble (every tensor must be consumed), so the monitor passes the outputs on.

Usage::

    model, monitor = monitored_names("digits_cnn")            # digits_cnn__model, digits_cnn__monitor
    publish_monitor(repository, "digits_cnn", 3, model_config, deploy, drift_profile=b"...")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from builder.core import assets
from builder.core.errors import UserInputError
from builder.repository.config import (DynamicBatching, InstanceGroup, ModelConfig, TensorConfig, render_config,
                                       render_template)
from builder.repository.layout import (MODEL_SUFFIX, MONITOR_SUFFIX, _repository_lock, atomic_write, is_monitored,
                                       model_dir, publish_version)
from builder.spec.model import DeploySpec

#: the monitor step's input for model output X is X + PASSED_SUFFIX (templates/monitor/model.py reads it)
PASSED_SUFFIX = "__model"
ENSEMBLE_VERSION = 1


@dataclass
class EnsembleStep:
    model: str
    inputs: dict[str, str]  # the step's tensor -> the ensemble's tensor
    outputs: dict[str, str]


@dataclass
class EnsembleConfig:
    name: str
    max_batch_size: int
    inputs: list[TensorConfig]
    outputs: list[TensorConfig]
    steps: list[EnsembleStep] = field(default_factory=list)


def monitored_names(name: str) -> tuple[str, str]:
    """The model folder and the monitor step behind ensemble ``name``."""
    return name + MODEL_SUFFIX, name + MONITOR_SUFFIX


def _wire(tensors: list[TensorConfig], suffix: str = "") -> list[TensorConfig]:
    """The tensors as clients send them (dims; the model folder's reshape stays the model's business)."""
    return [TensorConfig(t.name + suffix, t.data_type, list(t.dims)) for t in tensors]


def ensemble_config(name: str, model: ModelConfig) -> EnsembleConfig:
    model_name, monitor_name = monitored_names(name)
    passed = {o.name: o.name + PASSED_SUFFIX for o in model.outputs}
    inputs = {t.name: t.name for t in model.inputs}
    return EnsembleConfig(name, model.max_batch_size, _wire(model.inputs), _wire(model.outputs), [
        EnsembleStep(model_name, inputs, passed),
        EnsembleStep(monitor_name, {**inputs, **{v: v for v in passed.values()}}, {o.name: o.name for o in model.outputs}),
    ])


def monitor_config(name: str, model: ModelConfig, deploy: DeploySpec) -> ModelConfig:
    """The python step's config: one CPU instance per model instance (a GPU model: one), requests
    gathered without delay so that a busy step answers several per call."""
    cpu_instances = sum(g.count for g in model.instance_groups if g.kind != "KIND_GPU") or 1
    return ModelConfig(
        name=monitored_names(name)[1], backend="python", max_batch_size=model.max_batch_size,
        inputs=_wire(model.inputs) + _wire(model.outputs, PASSED_SUFFIX), outputs=_wire(model.outputs),
        dynamic_batching=DynamicBatching(0) if model.max_batch_size > 0 else None,
        instance_groups=[InstanceGroup("KIND_CPU", cpu_instances)],
        parameters={"monitored_model": name, "non_finite_inputs": deploy.non_finite_inputs,
                    **({"drift": "off"} if deploy.monitor is False else {})})


def monitor_files() -> dict[str, Path]:
    """The monitor version's code: the step, the python-backend model it borrows its counters and drift
    window from, and the drift module."""
    return {"model.py": assets.monitor_step_model(), "served_model.py": assets.python_backend_model(),
            "drift.py": assets.drift_module()}


def render_ensemble(config: EnsembleConfig) -> str:
    return render_template("ensemble.pbtxt.j2", config)


def refuse_mixed(repository: Path, name: str, monitor: bool) -> None:
    """A build must not turn a served model into an ensemble or back behind its versions' backs: the
    repository holds ``name`` one way, the spec asks for the other."""
    root = Path(repository)
    if not (root / name / "config.pbtxt").is_file():
        return
    monitored = is_monitored(root, name)
    if monitor and not monitored:
        raise UserInputError(
            f"deploy.monitor: true, but '{name}' in {root} is served unmonitored (its versions are in {root / name}): "
            f"a monitored model is an ensemble '{name}' over '{name}{MODEL_SUFFIX}'; publish under another name, "
            f"or set deploy.monitor: false to add a version to '{name}' as it is")
    if not monitor and monitored:
        raise UserInputError(
            f"deploy.monitor is off, but '{name}' in {root} is served monitored (an ensemble over "
            f"'{name}{MODEL_SUFFIX}' and '{name}{MONITOR_SUFFIX}'); set deploy.monitor: true to add a version to it, "
            "or publish under another name")


def publish_monitor(repository: Path, name: str, version: int, model: ModelConfig, deploy: DeploySpec,
                    drift_profile: bytes | None) -> dict:
    """After ``<name>__model`` version ``version`` is published: the monitor step's version ``version``
    (with the drift profile of that model version), then the ensemble, each atomically. A build killed
    between them leaves ``<name>__model`` served alone under its own name until the next build."""
    _, monitor_name = monitored_names(name)
    with publish_version(repository, monitor_name, version) as draft:
        for file_name, source in monitor_files().items():
            (draft.folder / file_name).write_bytes(source.read_bytes())
        if drift_profile is not None:
            (draft.folder / "drift_profile.json").write_bytes(drift_profile)
        draft.config_text = render_config(monitor_config(name, model, deploy))
    publish_ensemble(repository, name, render_ensemble(ensemble_config(name, model)))
    return {"ensemble": name, "monitor": monitor_name, "monitor_version": version}


def publish_ensemble(repository: Path, name: str, ensemble_text: str) -> None:
    """The ensemble ``name``'s config: its version 1 folder (empty) with it the first time, atomically; later
    rewritten in place only where the interface changed (the ensemble follows its steps)."""
    config_path = model_dir(repository, name, resolve=False) / "config.pbtxt"
    if not config_path.is_file():
        with publish_version(repository, name, ENSEMBLE_VERSION) as ensemble:
            ensemble.config_text = ensemble_text
    elif config_path.read_text() != ensemble_text:
        root = Path(repository).resolve()
        with _repository_lock(root):
            atomic_write(root, config_path, ensemble_text)

