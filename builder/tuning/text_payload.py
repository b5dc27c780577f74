"""Text (Triton ``BYTES`` / config ``TYPE_STRING``) request inputs for loadtest, sweep and tune.

- ``as_bytes``: a payload array of strings - numpy unicode (``<U``), bytes (``S``) or, in memory only,
  Python objects - as the object array of UTF-8 ``bytes`` tritonclient sends for a BYTES input.
  Numbers are refused: the server would answer every request with a datatype error.
- ``generated_texts``: short ASCII sentences for a BYTES input that has no payload (deterministic).
- ``pipeline_texts``: the texts of the latest version's ``pipeline_reference.json`` of a Hugging Face
  pipeline ensemble (``<name>`` over ``<name>__preprocess`` / ``<name>__model``; builder/repository/layout.py
  ``is_pipeline``): the texts the build checked the pipeline on, the default payload of such an ensemble.
- ``texts_npz``: those texts written as a payload .npz Locust reads by itself: the input's name keys a numpy
  unicode array of shape [texts, 1] (``np.savez``, never an object array: payloads are read without pickle).
- ``model_step_samples``: for the model step of such a pipeline (``<name>__model``), those texts tokenized by the
  published tokenizer step (its tokenizer.json, limit and length buckets), one request per text: what the step
  receives when the ensemble is served - realistic lengths, not one fixed shape - so sweep and tune measure
  (and tune sizes its queue delay and batch sizes for) the shapes that really arrive.

Usage::

    texts, source = pipeline_texts(repository, "minilm_sentiment")   # None when it is no pipeline
    samples, said = model_step_samples(repository, "minilm_sentiment__model", ["input_ids", "attention_mask"])
    write_texts_npz(path, "text", texts)
    request = {"text": as_bytes(np.array([["a short text"]]), "text")}
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from builder.core.errors import UserInputError
from builder.huggingface.texts import published_encoder
from builder.repository.layout import (MODEL_SUFFIX, PREPROCESS_SUFFIX, is_pipeline, latest_version, model_dir,
                                       require_model_repository)

BYTES = "BYTES"
REFERENCE_FILE = "pipeline_reference.json"  # builder/repository/pipeline.py writes it into the model step's version
_WORDS = ("the service was quick and friendly", "delivery took far too long", "great value for the price",
          "the screen cracked after a week", "a calm and pleasant evening", "support never answered my email",
          "fresh bread every morning", "the battery lasts all day", "noisy room next to the lift",
          "easy to set up in minutes", "the food arrived cold", "would happily come back again")


def is_text(array: np.ndarray) -> bool:
    """Whether ``array`` holds strings (unicode, bytes or objects) rather than numbers."""
    return np.asarray(array).dtype.kind in "USO"


def as_bytes(array: np.ndarray, name: str) -> np.ndarray:
    """``array`` as an object array of UTF-8 ``bytes`` (tritonclient's BYTES form), same shape."""
    array = np.asarray(array)
    if array.dtype.kind == "U":
        return np.vectorize(lambda s: s.encode("utf-8"), otypes=[object])(array) if array.size else \
            array.astype(object)
    if array.dtype.kind == "S":
        return np.array([bytes(v) for v in array.reshape(-1)] or [], dtype=object).reshape(array.shape)
    if array.dtype == object:
        values = [v.encode("utf-8") if isinstance(v, str) else v for v in array.reshape(-1)]
        if not all(isinstance(v, bytes) for v in values):
            raise UserInputError(f"{name}: the model takes text (BYTES); its values must be strings")
        return np.array(values or [], dtype=object).reshape(array.shape)
    raise UserInputError(f"{name} is {array.dtype}, the model takes text (BYTES): save it as a numpy string "
                         "array (np.array(['a text', ...]), dtype <U), not numbers")


def generated_texts(count: int, seed: int = 0) -> list[str]:
    """``count`` short ASCII sentences (one to three phrases), the same ones for the same seed."""
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(count):
        picks = rng.choice(len(_WORDS), size=int(rng.integers(1, 4)), replace=False)
        texts.append(", ".join(_WORDS[i] for i in picks).capitalize() + ".")
    return texts


def generated_text_array(shape: list[int], seed: int) -> np.ndarray:
    """An object array of ``shape`` holding generated texts as UTF-8 bytes."""
    count = int(np.prod(shape)) if shape else 1
    return np.array([t.encode("ascii") for t in generated_texts(count, seed)], dtype=object).reshape(shape)


def pipeline_texts(repository: str | Path | None, model: str) -> tuple[list[str], Path] | None:
    """(texts, the pipeline_reference.json they come from) of the latest version of pipeline ensemble ``model``
    in ``repository``; None when ``model`` is no text pipeline there or its latest version has no texts."""
    if repository is None:
        return None

    root = require_model_repository(Path(repository))
    if not is_pipeline(root, model):
        return None
    folder = model_dir(root, model)  # <name>__model: the steps' version N goes with the model's version N
    version = latest_version(folder)
    path = folder / str(version) / REFERENCE_FILE if version is not None else None
    if path is None or not path.is_file():
        return None
    try:
        texts = json.loads(path.read_text(encoding="utf-8")).get("texts") or []
    except (OSError, ValueError, AttributeError) as exc:
        raise UserInputError(f"{path}: not a readable pipeline reference ({exc}); give --payload with the texts "
                             "to send (an .npz holding a string array keyed by the input's name)") from None
    texts = [t for t in texts if isinstance(t, str) and t]
    return (texts, path) if texts else None


def write_texts_npz(path: Path, name: str, texts: list[str]) -> Path:
    """``texts`` as a payload .npz: ``name`` -> unicode array [len(texts), 1] (no pickle needed to read it)."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        np.savez(out, **{name: np.array(texts, dtype=str).reshape(-1, 1)})
    os.replace(tmp, path)
    return path


def model_step_samples(repository: str | Path | None, model: str,
                       inputs: list[str]) -> tuple[list[dict[str, np.ndarray]], str] | None:
    """One request per reference text for ``model`` when it is the model step of a text pipeline in
    ``repository`` (``<name>__model`` beside ``<name>__preprocess``): the texts tokenized as the served tokenizer
    step does, each [1, its length bucket]. None when ``model`` is no such step."""
    if repository is None or not model.endswith(MODEL_SUFFIX):
        return None
    name = model[: -len(MODEL_SUFFIX)]
    found = pipeline_texts(repository, name)
    pre = Path(repository) / (name + PREPROCESS_SUFFIX)
    version = latest_version(pre) if pre.is_dir() else None
    if found is None or version is None or not (pre / str(version) / "text_steps.py").is_file():
        return None
    encoder = published_encoder(pre, version)
    samples = []
    for text in found[0]:
        ids, mask, _, problems = encoder.encode([text])
        if problems:
            continue
        arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        samples.append({n: arrays[n] for n in inputs if n in arrays})
    if not samples or any(len(s) != len(inputs) for s in samples):
        return None
    lengths = sorted({s["input_ids"].shape[1] for s in samples}) if "input_ids" in inputs else []
    return samples, (f"the {len(samples)} texts of {found[1]}, tokenized by {pre.name} "
                     f"(lengths {', '.join(map(str, lengths))})")
