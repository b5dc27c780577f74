"""A Hugging Face pipeline served by Triton: text (or an encoded image) in, labels (or embeddings) out, as an ensemble.

A build of ``source: {huggingface: DIR, task: ...}`` publishes ordinary Triton models:

- ``<name>``: ``platform: "ensemble"``, the name clients call: ``text`` (``image`` for image-classification:
  the encoded file) (TYPE_STRING, one per sample) in;
  ``label`` (TYPE_STRING), ``score`` and ``scores`` (FP32) out for text-classification, ``embedding`` for
  feature-extraction;
- ``<name>__preprocess``: the tokenizer (templates/pipeline/preprocess.py + text_steps.py + tokenizer.json), or
  the image step (preprocess_image.py + image_steps.py + preprocessor_config.json);
- ``<name>__model``: the standard model folder with its versions, callable directly with ids;
- ``<name>__postprocess``: classification only: softmax/sigmoid and id2label (templates/pipeline/postprocess.py);
  token-classification: ``entities``, a JSON list per text of its tagged tokens with their character offsets.
  A classifier whose model step is an ONNX graph has no such step: the build folded the same arithmetic into the
  graph (builder/huggingface/label_head.py), whose ``label``, ``score`` and ``scores`` the ensemble answers.

The steps' version N goes with the model's version N (the tokenizer the version was verified with).
Ensembles carry no files: the ensemble's version 1 folder stays empty.

Usage::

    pipeline = HuggingFacePipeline(task="text-classification", tokenizer_file=Path("tokenizer.json"), max_length=128,
                            truncation=False, labels=["NEG", "POS"])
    publish_pipeline(repository, "sentiment", 3, model_config, pipeline)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from builder.core import assets
from builder.core.files import sha256_file
from builder.repository.config import DynamicBatching, InstanceGroup, ModelConfig, TensorConfig, render_config
from builder.repository.layout import MODEL_SUFFIX, POSTPROCESS_SUFFIX, PREPROCESS_SUFFIX, publish_version
from builder.repository.monitored import EnsembleConfig, EnsembleStep, publish_ensemble, render_ensemble

TEXT_INPUT = "text"
IMAGE_INPUT = "image"  # image-classification: the encoded file's bytes (JPEG, PNG, ...)
OFFSETS = "offsets"  # token-classification: each token's character span in the text (tokenizer -> post-processing)
REFERENCE_FILE = "pipeline_reference.json"  # in the model step's version: texts and what the pipeline answered


@dataclass
class HuggingFacePipeline:
    task: str  # text-classification | token-classification | feature-extraction
    tokenizer_file: Path
    max_length: int
    truncation: bool
    labels: list[str] = field(default_factory=list)  # classification: id2label in id order
    activation: str = "softmax"
    reference: bytes | None = None  # pipeline_reference.json (builder/huggingface/reference.py)
    # the validation texts' tokens_per_text and unknown_rate (the tokenizer step's drift profile); {} without them
    profile: dict[str, float] = field(default_factory=dict)
    processor_file: Path | None = None  # image-classification: preprocessor_config.json (no tokenizer)
    #: text: the sequence lengths the tokenizer step pads to (text_steps.length_buckets); [] pads to the longest
    length_buckets: list[int] = field(default_factory=list)
    token_lengths: list[int] = field(default_factory=list)  #: text: the validation texts' tokens (the buckets' cost)
    buckets_why: str = ""  #: why the buckets are (not) used (builder/huggingface/texts.py bucket_decision)
    ragged_why: str = ""  #: text: why the model step takes ragged batches, or not (builder/huggingface/ragged.py)

    @property
    def images(self) -> bool:
        return self.task == "image-classification"

    @property
    def input_name(self) -> str:
        return IMAGE_INPUT if self.images else TEXT_INPUT

    @property
    def classifies(self) -> bool:
        return bool(self.labels)

    @property
    def tags_tokens(self) -> bool:
        return self.task == "token-classification"


def pipeline_names(name: str) -> tuple[str, str, str]:
    """The preprocess, model and postprocess steps behind ensemble ``name``."""
    return name + PREPROCESS_SUFFIX, name + MODEL_SUFFIX, name + POSTPROCESS_SUFFIX


def head_folded(model: ModelConfig) -> bool:
    """The model step answers the labels itself (builder/huggingface/label_head.py): no post-processing step."""
    return any(o.name == "label" for o in model.outputs)


def pipeline_steps(name: str, model: ModelConfig, pipeline: HuggingFacePipeline) -> list[str]:
    """The models ensemble ``name`` runs, in order."""
    pre, model_step, post = pipeline_names(name)
    return [pre, model_step] + ([post] if pipeline.classifies and not head_folded(model) else [])


def step_config(name: str, model: ModelConfig, inputs: list[TensorConfig], outputs: list[TensorConfig],
                 parameters: dict[str, str]) -> ModelConfig:
    """A python step sized like the model: one CPU instance per model instance, requests gathered without
    delay (the tokenizer pads the requests of one call to one length, which the model's batcher merges)."""
    cpu_instances = sum(g.count for g in model.instance_groups if g.kind != "KIND_GPU") or 1
    return ModelConfig(name=name, backend="python", max_batch_size=model.max_batch_size, inputs=inputs,
                       outputs=outputs, dynamic_batching=DynamicBatching(0) if model.max_batch_size > 0 else None,
                       instance_groups=[InstanceGroup("KIND_CPU", cpu_instances)], parameters=parameters)


def classification_outputs(labels: list[str]) -> list[TensorConfig]:
    """What a classifier answers: the post-processing step, or the model whose graph carries the label head."""
    return [TensorConfig("label", "TYPE_STRING", [1]), TensorConfig("score", "TYPE_FP32", [1]),
            TensorConfig("scores", "TYPE_FP32", [len(labels)])]


def _outputs(pipeline: HuggingFacePipeline, model: ModelConfig) -> list[TensorConfig]:
    if pipeline.tags_tokens:
        return [TensorConfig("entities", "TYPE_STRING", [1])]
    if pipeline.classifies:
        return classification_outputs(pipeline.labels)
    return [TensorConfig(o.name, o.data_type, list(o.dims)) for o in model.outputs]


def step_configs(name: str, model: ModelConfig, pipeline: HuggingFacePipeline) -> list[ModelConfig]:
    """The python steps' configs: preprocess, then postprocess where the task has one."""
    pre, _, post = pipeline_names(name)
    ids = [TensorConfig(t.name, t.data_type, list(t.dims)) for t in model.inputs]
    offsets = [TensorConfig(OFFSETS, "TYPE_INT64", [-1, 2])] if pipeline.tags_tokens else []
    text = TensorConfig(pipeline.input_name, "TYPE_STRING", [1])
    profile = {f"profile_{k}": f"{v:.6g}" for k, v in pipeline.profile.items()}
    parameters = {"served_as": name, **profile} if pipeline.images else {
        "max_length": str(pipeline.max_length), "truncation": "true" if pipeline.truncation else "false",
        "served_as": name, **profile,
        **({"length_buckets": ",".join(map(str, pipeline.length_buckets))} if pipeline.length_buckets else {})}
    configs = [step_config(pre, model, [text], ids + offsets, parameters)]
    if post in pipeline_steps(name, model, pipeline):
        logits = model.outputs[0]
        inputs = [TensorConfig(logits.name, logits.data_type, list(logits.dims))]
        if pipeline.tags_tokens:  # the tags name their tokens: the text, the ids and where each token is in the text
            inputs = [text] + inputs + [t for t in ids if t.name == "input_ids"] + offsets
        configs.append(step_config(post, model, inputs, _outputs(pipeline, model),
                                    {"labels": json.dumps(pipeline.labels), "activation": pipeline.activation,
                                     "task": pipeline.task}))
    return configs


def ensemble_config(name: str, model: ModelConfig, pipeline: HuggingFacePipeline) -> EnsembleConfig:
    pre, model_step, post = pipeline_names(name)
    ids = {t.name: t.name for t in model.inputs}
    outputs = _outputs(pipeline, model)
    raw = pipeline.input_name
    if pipeline.tags_tokens:
        logits = model.outputs[0].name
        steps = [EnsembleStep(pre, {TEXT_INPUT: TEXT_INPUT}, {**ids, OFFSETS: OFFSETS}),
                 EnsembleStep(model_step, ids, {logits: logits}),
                 EnsembleStep(post, {TEXT_INPUT: TEXT_INPUT, logits: logits, "input_ids": "input_ids", OFFSETS: OFFSETS},
                              {o.name: o.name for o in outputs})]
    elif pipeline.classifies and head_folded(model):
        steps = [EnsembleStep(pre, {raw: raw}, ids),
                 EnsembleStep(model_step, ids, {o.name: o.name for o in outputs})]
    elif pipeline.classifies:
        logits = model.outputs[0].name
        steps = [EnsembleStep(pre, {raw: raw}, ids),
                 EnsembleStep(model_step, ids, {logits: logits}),
                 EnsembleStep(post, {logits: logits}, {o.name: o.name for o in outputs})]
    else:
        steps = [EnsembleStep(pre, {TEXT_INPUT: TEXT_INPUT}, ids),
                 EnsembleStep(model_step, ids, {o.name: o.name for o in outputs})]
    return EnsembleConfig(name, model.max_batch_size, [TensorConfig(raw, "TYPE_STRING", [1])], outputs, steps)


def _step_files(config: ModelConfig, pipeline: HuggingFacePipeline) -> dict[str, Path]:
    files = {"text_steps.py": assets.pipeline_step("text_steps.py")}
    if config.name.endswith(PREPROCESS_SUFFIX) and pipeline.images:
        return {"model.py": assets.pipeline_step("preprocess_image.py"),
                "image_steps.py": assets.pipeline_step("image_steps.py"),
                "preprocessor_config.json": pipeline.processor_file}
    if config.name.endswith(PREPROCESS_SUFFIX):
        return {"model.py": assets.pipeline_step("preprocess.py"), "tokenizer.json": pipeline.tokenizer_file, **files}
    if pipeline.tags_tokens:  # the tags name their tokens
        files["tokenizer.json"] = pipeline.tokenizer_file
    return {"model.py": assets.pipeline_step("postprocess.py"), **files}


def step_file_hashes(name: str, model: ModelConfig, pipeline: HuggingFacePipeline) -> dict[str, str]:
    """``<step>/<file>`` -> sha256 of every file the steps of a version are published with: recorded in the model
    version's metadata, so that `validate` finds a step file changed after the build."""

    return {f"{config.name}/{file_name}": sha256_file(Path(source))
            for config in step_configs(name, model, pipeline) for file_name, source in _step_files(config, pipeline).items()}


def publish_pipeline(repository: Path, name: str, version: int, model: ModelConfig, pipeline: HuggingFacePipeline) -> dict:
    """After ``<name>__model`` version ``version`` is published: each step's version ``version``, then the
    ensemble, each atomically. A build killed between them leaves ``<name>__model`` served under its own name
    (and the previous steps with the ensemble) until the next build."""
    steps = []
    for config in step_configs(name, model, pipeline):
        with publish_version(repository, config.name, version) as draft:
            for file_name, source in _step_files(config, pipeline).items():
                (draft.folder / file_name).write_bytes(Path(source).read_bytes())
            draft.config_text = render_config(config)
        steps.append(config.name)
    publish_ensemble(repository, name, render_ensemble(ensemble_config(name, model, pipeline)))
    return {"ensemble": name, "steps": steps, "steps_version": version}
