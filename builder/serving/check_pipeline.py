"""`check` of a Hugging Face text pipeline: raw texts through the SERVED ensemble vs the library's answers.

The model step is checked with tensors like any model (builder/serving/check.py); this replays the texts of
the version's pipeline_reference.json (what transformers' pipeline or sentence-transformers answered at build
time) through the ensemble ``<name>`` - tokenizer step, model, post-processing - and holds the answers to it:
the same label on every text, scores within the version's tolerance, embeddings by per-text cosine.

Usage::

    failures, figures = check_pipeline(client, "sentiment", reference, max_batch_size=16, precision="fp32",
                                       tolerance={"rel_l2": 1e-5})
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from builder.huggingface.reference import compare_pipeline
from builder.serving.client import TritonClient, TritonError

FP32_SCORE_TOLERANCE = 1e-4  # relative to the largest score: what an FP32 model's scores may differ by
FP32_COSINE_MINIMUM = 0.9999
REDUCED_COSINE_MINIMUM = 0.99  # fp16/int8 versions: the embedding task's own bar (builder/task_metrics.py)


def read_pipeline_reference(version_folder: Path) -> dict[str, Any] | None:
    path = version_folder / "pipeline_reference.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def text_batch(texts: list[str]) -> dict[str, np.ndarray]:
    """The ensemble's input for ``texts``: TYPE_STRING, one per sample."""
    return {"text": np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)}


def check_pipeline(client: TritonClient, name: str, reference: dict[str, Any], max_batch_size: int,
                   precision: str, tolerance: dict[str, float]) -> tuple[list[str], dict[str, float]]:
    texts = reference["texts"]
    step = max(1, max_batch_size)
    outputs = (["label", "score", "scores"] if "labels" in reference else ["entities"] if "entities" in reference
               else ["embedding"])
    answers: dict[str, list[np.ndarray]] = {o: [] for o in outputs}
    try:
        for start in range(0, len(texts), step):
            got = client.infer(name, text_batch(texts[start:start + step]), outputs)
            for key in outputs:
                answers[key].append(got[key])
    except TritonError as exc:
        return [f"pipeline: request failed: {' '.join(exc.reason.split())[:300]}"], {}
    served = {key: np.concatenate(parts) for key, parts in answers.items()}
    if precision == "fp32":
        return compare_pipeline(reference, served, FP32_SCORE_TOLERANCE, FP32_COSINE_MINIMUM)
    return compare_pipeline(reference, served, max(FP32_SCORE_TOLERANCE, float(tolerance.get("rel_l2", 0.0))),
                            REDUCED_COSINE_MINIMUM)
