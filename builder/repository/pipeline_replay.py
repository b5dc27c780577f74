"""`validate` of a Hugging Face text pipeline: its raw texts replayed through the PUBLISHED steps in-process.

The version's pipeline_reference.json holds the texts and what transformers' pipeline (or
sentence-transformers) answered at build time. Here they go through the files Triton will run: the
tokenizer step's own text_steps.py and tokenizer.json (``<name>__preprocess`` version N), the model file
(``<name>__model`` version N, in-process), and the post-processing step's text_steps.py
(``<name>__postprocess`` version N; a classifier whose graph carries the label head answers its labels
itself) - and the answers are held to the record as `check` holds the server's.

Usage::

    failures, figures = replay_pipeline(Path("model_repository"), "sentiment", 3, run)   # run: the model runner
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from builder.core.files import module_from_file, sha256_file
from builder.huggingface.reference import compare_pipeline, pipeline_limits
from builder.huggingface.texts import published_encoder
from builder.repository.config import parse_config
from builder.repository.layout import existing_versions
from builder.repository.pipeline import REFERENCE_FILE, pipeline_names


def _step_module(version_folder: Path, file_name: str = "text_steps.py"):
    """A published step's own shared code (text_steps.py / image_steps.py), as Triton will run it."""
    return module_from_file(version_folder / file_name, f"triton_builder_replay_{abs(hash(str(version_folder)))}")


def _parameters(model_folder: Path) -> dict[str, str]:
    config = parse_config((model_folder / "config.pbtxt").read_text())
    return {key: value.string_value for key, value in config.parameters.items()}


def step_version(folder: Path, version: int) -> int:
    """The step version serving beside model version ``version``: its own, else (a model version republished by
    `select --write` or `tune --publish`, which publish no steps) the newest step version before it."""
    older = [v for v in existing_versions(folder) if v <= version]
    return max(older) if older else version


def _folded_labels(outputs: dict) -> dict[str, np.ndarray] | None:
    """label and scores as the model answered them where its graph carries the label head, else None."""
    if "label" not in outputs or "scores" not in outputs:
        return None
    labels = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in np.asarray(outputs["label"]).reshape(-1)]
    return {"label": np.array(labels, dtype=np.object_), "scores": np.asarray(outputs["scores"], dtype=np.float32)}


def changed_step_files(root: Path, version: int, recorded: dict[str, str]) -> list[str]:
    """The step files beside model version ``version`` whose sha256 differs from its record (or that are gone)."""

    changed = []
    for relative, digest in sorted(recorded.items()):
        step, file_name = relative.split("/", 1)
        number = step_version(root / step, version)
        path = root / step / str(number) / file_name
        if not path.is_file() or sha256_file(path) != digest:
            changed.append(f"{step}/{number}/{file_name}")
    return changed


def _replay_images(reference: dict, pre: Path, post: Path, post_params: dict[str, str], run: Callable[[dict], dict],
                   precision: str, rel_l2: float) -> tuple[list[str], dict[str, float]]:
    import base64

    processor = _step_module(pre, "image_steps.py").ImageProcessor(json.loads((pre / "preprocessor_config.json").read_text(encoding="utf-8")))
    pixels, problems = processor.process([base64.b64decode(item) for item in reference["images"]])
    if problems:
        return [f"the published image step refuses {len(problems)} reference image(s): {problems[min(problems)]}"], {}
    outputs = run({"pixel_values": pixels})
    served = _folded_labels(outputs)
    if served is None:
        served = {}
        served["label"], _, served["scores"] = _step_module(post).classify(
            next(iter(outputs.values())), json.loads(post_params["labels"]), post_params.get("activation", "softmax"))
    return compare_pipeline(reference, served, *pipeline_limits(precision, rel_l2))


def replay_pipeline(root: Path, name: str, version: int, run: Callable[[dict], dict], precision: str = "fp32",
                    rel_l2: float = 0.0, recorded: dict[str, str] | None = None) -> tuple[list[str], dict[str, float]]:
    """``recorded``: the model version's metadata pipeline.steps_sha256 (absent for versions built before it)."""
    pre, model, post = (root / step for step in pipeline_names(name))
    changed = changed_step_files(root, version, recorded or {})
    if changed:
        return [f"{', '.join(changed)} differ from what version {version} was built and verified with (metadata.yaml "
                "pipeline.steps_sha256): restore them from where the version was published, or rebuild"], {}
    reference_file = model / str(version) / REFERENCE_FILE
    if not reference_file.is_file():
        return [f"{model.name} version {version} has no {REFERENCE_FILE}: rebuild the version"], {}
    folded = any(o.name == "label" for o in parse_config((model / "config.pbtxt").read_text()).output)
    needed = [pre] + ([post] if (post / "config.pbtxt").is_file() and not folded else [])
    pre_version, post_version = step_version(pre, version), step_version(post, version)
    missing = [f"{folder.name}/{number}/" for folder, number in zip(needed, (pre_version, post_version))
               if not (folder / str(number) / "model.py").is_file()]
    if missing:
        return [f"the steps of version {version} are missing ({', '.join(missing)}): the ensemble would serve this "
                "model version with another version's pre/post-processing; rebuild the version"], {}
    reference = json.loads(reference_file.read_text(encoding="utf-8"))
    if "images" in reference:
        return _replay_images(reference, pre / str(pre_version), post / str(post_version),
                              {} if folded else _parameters(post), run, precision, rel_l2)
    encoder = published_encoder(pre, pre_version)
    encoded = tuple(encoder.encode(reference["texts"]))  # a version published before offsets returns 3 arrays
    ids, mask, problems = encoded[0], encoded[1], encoded[-1]
    offsets = encoded[2] if len(encoded) == 4 else None
    if problems:
        return [f"the published tokenizer refuses {len(problems)} reference text(s): {problems[min(problems)]}"], {}
    outputs = run({"input_ids": ids, "attention_mask": mask})
    served: dict[str, np.ndarray] = {}
    if "embeddings" in reference:
        served["embedding"] = next(iter(outputs.values()))
    elif _folded_labels(outputs) is not None and "entities" not in reference:
        served = _folded_labels(outputs)
    else:
        steps, post_params = _step_module(post / str(post_version)), _parameters(post)
        labels, logits = json.loads(post_params["labels"]), next(iter(outputs.values()))
        if "entities" in reference:
            from tokenizers import Tokenizer

            tokenizer_file = post / str(post_version) / "tokenizer.json"
            tokenizer, special = Tokenizer.from_file(str(tokenizer_file)), steps.special_token_ids(tokenizer_file)
            served["entities"] = np.array([json.dumps(steps.token_entities(text, logits[row], ids[row], offsets[row],
                                                                           labels, tokenizer, special)).encode()
                                           for row, text in enumerate(reference["texts"])], dtype=np.object_)
        else:
            served["label"], _, served["scores"] = steps.classify(logits, labels, post_params.get("activation", "softmax"))
    return compare_pipeline(reference, served, *pipeline_limits(precision, rel_l2))
