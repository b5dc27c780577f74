"""Your own steps around any model (spec preprocess / postprocess) served as a Triton ensemble.

A build with ``preprocess:`` and/or ``postprocess:`` publishes, beside the model step ``<name>__model`` (the
standard folder, callable directly with the model's tensors):

- ``<name>__preprocess`` / ``<name>__postprocess``: python steps running templates/pipeline/user_step.py,
  which calls your function from the module file published beside it (version N with model version N);
- ``<name>``: ``platform: "ensemble"``, what clients call: the preprocess inputs in (else the model's), the
  postprocess outputs out (else the model's).

Usage::

    publish_user_pipeline(repository, "digits_text", 3, model_config, steps)   # steps: builder/model/user_steps.py
"""

from __future__ import annotations

from pathlib import Path

from builder.core import assets
from builder.repository.config import ModelConfig, TensorConfig, render_config
from builder.repository.layout import publish_version
from builder.repository.monitored import EnsembleConfig, EnsembleStep, publish_ensemble, render_ensemble
from builder.repository.pipeline import pipeline_names, step_config

REFERENCE_FILE = "user_steps_reference.npz"  # in the model step's version: raw inputs and the answers expected


def _tensors(step) -> list[TensorConfig]:
    return [TensorConfig(t.name, t.triton_dtype, list(t.shape)) for t in step.tensors]


def _wire(tensors: list[TensorConfig]) -> list[TensorConfig]:
    return [TensorConfig(t.name, t.data_type, list(t.dims)) for t in tensors]


def user_step_configs(name: str, model: ModelConfig, steps) -> list[ModelConfig]:
    pre, _, post = pipeline_names(name)
    configs = []
    for step, step_name, inputs, outputs in ((steps.pre, pre, _tensors(steps.pre) if steps.pre else [], _wire(model.inputs)),
                                             (steps.post, post, _wire(model.outputs),
                                              _tensors(steps.post) if steps.post else [])):
        if step is not None:
            configs.append(step_config(step_name, model, inputs, outputs, {
                "module": step.module_file.name, "function": step.function, "kind": step.kind}))
    return configs


def user_ensemble_config(name: str, model: ModelConfig, steps) -> EnsembleConfig:
    pre, model_step, post = pipeline_names(name)
    inputs = _tensors(steps.pre) if steps.pre else _wire(model.inputs)
    outputs = _tensors(steps.post) if steps.post else _wire(model.outputs)
    ids = {t.name: t.name for t in model.inputs}
    results = {t.name: t.name for t in model.outputs}
    chain = []
    if steps.pre:
        chain.append(EnsembleStep(pre, {t.name: t.name for t in inputs}, ids))
    chain.append(EnsembleStep(model_step, ids, results))
    if steps.post:
        chain.append(EnsembleStep(post, results, {t.name: t.name for t in outputs}))
    return EnsembleConfig(name, model.max_batch_size, inputs, outputs, chain)


def publish_user_pipeline(repository: Path, name: str, version: int, model: ModelConfig, steps) -> dict:
    """After ``<name>__model`` version ``version``: each step's version ``version``, then the ensemble, atomically."""
    published = []
    for config in user_step_configs(name, model, steps):
        step = steps.pre if config.parameters["kind"] == "preprocess" else steps.post
        with publish_version(repository, config.name, version) as draft:
            (draft.folder / "model.py").write_bytes(assets.pipeline_step("user_step.py").read_bytes())
            (draft.folder / step.module_file.name).write_bytes(step.module_file.read_bytes())
            draft.config_text = render_config(config)
        published.append(config.name)
    publish_ensemble(repository, name, render_ensemble(user_ensemble_config(name, model, steps)))
    return {"ensemble": name, "steps": published, "steps_version": version}
