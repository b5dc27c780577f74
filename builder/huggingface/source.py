"""Stage load's side of a Hugging Face source: the model step, its data and the pipeline's reference.

Usage::

    loaded = load_source(folder, validation=Path("data/texts.txt"), workdir=work)
    loaded.module            # the model step (builder/huggingface/module.py), exported like any module
    loaded.validation        # {'input_ids': ..., 'attention_mask': ...} tokenized texts, or None (generated texts)
    loaded.pipeline          # builder/repository/pipeline.py HuggingFacePipeline: what the steps are published with
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builder.core.errors import UserInputError
from builder.huggingface.folder import Folder
from builder.huggingface.images import generated_images, processed, processor_for, read_images
from builder.huggingface.module import build_module
from builder.huggingface.reference import pipeline_reference
from builder.huggingface.texts import encoder_for, generated_texts, read_texts, text_steps, tokenized
from builder.repository.pipeline import HuggingFacePipeline


@dataclass
class LoadedSource:
    module: Any
    validation: dict[str, np.ndarray] | None
    pipeline: HuggingFacePipeline
    texts_from: str  # where the reference texts came from (said in the build's notes)


def tokenizer_file(folder: Folder, workdir: Path) -> Path:
    """tokenizer.json of the folder; a folder with only slow-tokenizer files gets one converted by transformers."""
    if (folder.path / "tokenizer.json").is_file():
        return folder.path / "tokenizer.json"
    from transformers import AutoTokenizer

    try:
        fast = AutoTokenizer.from_pretrained(str(folder.path), local_files_only=True, use_fast=True)
        target = workdir / "tokenizer.json"
        fast.backend_tokenizer.save(str(target))
    except Exception as exc:  # noqa: BLE001
        raise UserInputError(f"source.huggingface: {folder.path} has no tokenizer.json and transformers cannot make "
                             f"one from its tokenizer files ({' '.join(str(exc).split())[:200]}); save the tokenizer "
                             "with a fast tokenizer's save_pretrained") from None
    return target


def _load_images(folder: Folder, validation: Path | None) -> LoadedSource:
    processor_file = folder.path / "preprocessor_config.json"
    processor = processor_for(processor_file)
    if validation is not None:
        images, images_from = read_images(validation, "data.validation"), f"data.validation ({validation.name})"
    else:
        images = generated_images()
        images_from = (f"{len(images)} images generated (gradients and noise; no data.validation: drift profile off; "
                       "list real images to verify on)")
    pixels = processed(processor, images, "data.validation" if validation is not None else "generated images")
    profile = {}
    if validation is not None:  # generated images are not the traffic to expect: no drift profile
        count, sizes, brightness = processor.statistics(images, {})
        profile = {"pixels_per_image": sizes / count, "mean_brightness": brightness / count}
    reference = pipeline_reference(folder, images)
    pipeline = HuggingFacePipeline(task=folder.task.name, tokenizer_file=processor_file, max_length=0, truncation=False,
                            labels=folder.labels, activation=text_steps().activation(folder.config),
                            reference=json.dumps(reference).encode(), processor_file=processor_file, profile=profile)
    arrays = {"pixel_values": pixels} if validation is not None else None
    return LoadedSource(build_module(folder), arrays, pipeline, images_from)


def load_source(folder: Folder, validation: Path | None, workdir: Path) -> LoadedSource:
    if folder.task.modality == "image":
        return _load_images(folder, validation)
    tokenizer = tokenizer_file(folder, workdir)
    encoder = encoder_for(tokenizer, folder.max_length, folder.truncation)
    if validation is not None:
        texts, texts_from = read_texts(validation, "data.validation"), f"data.validation ({validation.name})"
    else:
        texts = generated_texts(encoder)
        texts_from = (f"{len(texts)} texts generated from the tokenizer's vocabulary (no data.validation: drift "
                      "profile off; give real texts to verify on and profile them)")
    ids, mask = tokenized(encoder, texts, "data.validation" if validation is not None else "generated texts")
    lengths = [int(n) for n in mask.sum(axis=1)]
    buckets = text_steps().length_buckets(lengths, folder.max_length)
    profile = {}
    if validation is not None:  # generated texts are not the traffic to expect: no drift profile
        count, tokens, unknown = encoder.statistics(encoder.encode(texts))
        profile = {"tokens_per_text": tokens / count, "unknown_rate": unknown / max(tokens, 1)}
    reference = pipeline_reference(folder, texts)
    pipeline = HuggingFacePipeline(task=folder.task.name, tokenizer_file=tokenizer, max_length=folder.max_length,
                            truncation=folder.truncation, labels=folder.labels if folder.task.outputs != "embedding" else [],
                            activation=text_steps().activation(folder.config), reference=json.dumps(reference).encode(),
                            profile=profile, length_buckets=buckets, token_lengths=lengths)
    arrays = {"input_ids": ids, "attention_mask": mask} if validation is not None else None
    return LoadedSource(build_module(folder), arrays, pipeline, texts_from)

