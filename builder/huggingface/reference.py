"""What the library users trust answers on raw texts: the reference a served pipeline is held to.

Usage::

    record = pipeline_reference(folder, ["a text", ...])
    record["labels"], record["scores"]       # text-classification: transformers' pipeline(task)
    record["embeddings"]                     # feature-extraction: sentence-transformers' encode where the
                                             # folder is one, else pipeline("feature-extraction") pooled
    compare_pipeline(record, served)         # [] or what differs (labels on every text; scores within tolerance)

The record is JSON (pipeline_reference.json in the model step's version): `check` replays its texts
through the served ensemble.
"""

from __future__ import annotations

import importlib.util
import os
from importlib.metadata import version
from typing import Any

import numpy as np

from builder.huggingface.folder import Folder
from builder.huggingface.module import quiet_transformers


def _pool(tokens: np.ndarray, folder: Folder) -> np.ndarray:
    """One text's token embeddings [tokens, hidden] pooled as the model step pools them (all tokens are real)."""
    pooled = {"cls": lambda t: t[0], "max": lambda t: t.max(axis=0)}.get(folder.pooling, lambda t: t.mean(axis=0))(tokens)
    return pooled / max(float(np.linalg.norm(pooled)), 1e-12) if folder.normalize else pooled


def pipeline_reference(folder: Folder, texts: list) -> dict[str, Any]:
    """``texts``: strings, or for an image task the encoded image files (stored base64 as "images")."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_transformers()
    if folder.task.modality == "image":
        return _image_reference(folder, texts)
    record: dict[str, Any] = {"task": folder.task.name, "texts": list(texts)}
    if folder.task.outputs == "embedding" and folder.sentence_transformers and importlib.util.find_spec(
            "sentence_transformers") is not None:  # else: transformers' pipeline, pooled as the folder says
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(folder.path), device="cpu", local_files_only=True)
        record["library"] = f"sentence-transformers {version('sentence-transformers')} SentenceTransformer.encode"
        record["embeddings"] = np.asarray(model.encode(list(texts), convert_to_numpy=True)).astype(float).tolist()
        return record
    from transformers import pipeline

    runner = pipeline(folder.task.name, model=str(folder.path), tokenizer=str(folder.path), device="cpu")
    record["library"] = f"transformers {version('transformers')} pipeline('{folder.task.name}')"
    call = {"truncation": True, "max_length": folder.max_length} if folder.truncation else {}
    if folder.task.outputs == "embedding":
        record["embeddings"] = [_pool(np.asarray(runner(text, **call))[0], folder).astype(float).tolist()
                                for text in texts]
        return record
    if folder.task.outputs == "token_logits":  # aggregation none, "O" ignored: the pipeline's defaults
        record["entities"] = [[{k: (float(v) if k == "score" else int(v) if k in ("index", "start", "end") else v)
                                for k, v in entity.items()} for entity in runner(text, **call)] for text in texts]
        return record
    _classes(record, runner(list(texts), top_k=None, **call), folder.labels)
    return record


def _image_reference(folder: Folder, images: list[bytes]) -> dict[str, Any]:
    import base64
    import io

    from PIL import Image, ImageOps
    from transformers import pipeline

    runner = pipeline(folder.task.name, model=str(folder.path), device="cpu")
    record: dict[str, Any] = {"task": folder.task.name, "images": [base64.b64encode(b).decode() for b in images],
                              "library": f"transformers {version('transformers')} pipeline('{folder.task.name}')"}
    decoded = [ImageOps.exif_transpose(Image.open(io.BytesIO(b))).convert("RGB") for b in images]
    _classes(record, runner(decoded, top_k=None), folder.labels)
    return record


def _classes(record: dict[str, Any], answers: list, labels: list[str]) -> None:
    """labels (the top one per input) and scores (every label's, in id order) from the pipeline's answers."""
    order = {label: i for i, label in enumerate(labels)}
    record["labels"] = [answer[0]["label"] for answer in answers]  # top_k=None: sorted by score
    scores = []
    for answer in answers:
        row = [0.0] * len(labels)
        for item in answer:
            row[order[item["label"]]] = float(item["score"])
        scores.append(row)
    record["scores"] = scores


FP32_SCORE_TOLERANCE = 1e-4  # relative to the largest score: what an FP32 model's scores may differ by
FP32_COSINE_MINIMUM = 0.9999
REDUCED_COSINE_MINIMUM = 0.99  # fp16/int8 versions: the embedding task's own bar (builder/accuracy/task_metrics.py)


def pipeline_limits(precision: str, rel_l2: float) -> tuple[float, float]:
    """(score tolerance, embedding cosine minimum) for a version of ``precision`` verified within ``rel_l2``:
    what `check` and `validate` hold a pipeline's answers to."""
    if precision == "fp32":
        return FP32_SCORE_TOLERANCE, FP32_COSINE_MINIMUM
    return max(FP32_SCORE_TOLERANCE, rel_l2), REDUCED_COSINE_MINIMUM


def compare_pipeline(record: dict[str, Any], served: dict[str, np.ndarray], rel_tolerance: float = 1e-4,
                     cosine_minimum: float = 0.999) -> tuple[list[str], dict[str, float]]:
    """(what differs, the figures): labels must be identical on every text; scores within ``rel_tolerance``
    (relative to the largest); embeddings' per-text cosine >= ``cosine_minimum``."""
    failures, figures = [], {}
    if "labels" in record:
        got = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in np.asarray(served["label"]).reshape(-1)]
        wrong = [i for i, (want, have) in enumerate(zip(record["labels"], got)) if want != have]
        figures["label_agreement"] = 1.0 - len(wrong) / max(len(got), 1)
        if wrong or len(got) != len(record["labels"]):
            first = wrong[0] if wrong else len(got)
            shown = repr(record["texts"][first][:60]) if "texts" in record and first < len(record["texts"]) else ""
            failures.append(f"labels differ on {len(wrong)} of {len(record['labels'])} inputs (first: input {first} "
                            f"{shown}: pipeline "
                            f"{record['labels'][first] if first < len(record['labels']) else '-'}, served "
                            f"{got[first] if first < len(got) else '-'})")
        want = np.asarray(record["scores"], dtype=np.float64)
        have = np.asarray(served["scores"], dtype=np.float64).reshape(want.shape)
        error = float(np.abs(have - want).max() / max(float(np.abs(want).max()), 1e-12))
        figures["scores_rel_error"] = error
        if error > rel_tolerance:
            failures.append(f"scores differ from the pipeline's by {error:.2e} (relative), over {rel_tolerance:g}")
    if "entities" in record:
        failures += _compare_entities(record, served, rel_tolerance, figures)
    if "embeddings" in record:
        want = np.asarray(record["embeddings"], dtype=np.float64)
        have = np.asarray(served["embedding"], dtype=np.float64).reshape(want.shape)
        cosine = (want * have).sum(axis=1) / np.maximum(np.linalg.norm(want, axis=1) * np.linalg.norm(have, axis=1),
                                                        1e-12)
        figures["cosine_min"] = float(cosine.min())
        if cosine.min() < cosine_minimum:
            failures.append(f"embeddings differ from the reference's: per-text cosine min {cosine.min():.6f} "
                            f"(text {int(cosine.argmin())}), under {cosine_minimum}")
    return failures, figures


def _compare_entities(record: dict[str, Any], served: dict[str, np.ndarray], rel_tolerance: float,
                      figures: dict[str, float]) -> list[str]:
    """Token-classification: the same tagged tokens (entity, index, word, start, end) on every text; scores close."""
    import json

    got = [json.loads(v.decode("utf-8") if isinstance(v, bytes) else v) for v in np.asarray(served["entities"]).reshape(-1)]
    keys = ("entity", "index", "word", "start", "end")
    wrong = [i for i, (want, have) in enumerate(zip(record["entities"], got))
             if [tuple(e[k] for k in keys) for e in want] != [tuple(e[k] for k in keys) for e in have]]
    figures["texts_tagged_alike"] = 1.0 - len(wrong) / max(len(got), 1)
    failures = []
    if wrong or len(got) != len(record["entities"]):
        first = wrong[0] if wrong else len(got)
        failures.append(f"tagged tokens differ on {len(wrong)} of {len(record['entities'])} texts (first: text {first} "
                        f"{record['texts'][first][:60]!r})")
    pairs = [(a["score"], b["score"]) for i, (want, have) in enumerate(zip(record["entities"], got)) if i not in wrong
             for a, b in zip(want, have)]
    error = max([abs(a - b) / max(abs(a), 1e-12) for a, b in pairs] or [0.0])
    figures["scores_rel_error"] = error
    if error > rel_tolerance:
        failures.append(f"token scores differ from the pipeline's by {error:.2e} (relative), over {rel_tolerance:g}")
    return failures
