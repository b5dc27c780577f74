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

from builder.huggingface.reference import compare_pipeline, pipeline_limits
from builder.serving.client import TritonClient, TritonError


def read_pipeline_reference(version_folder: Path) -> dict[str, Any] | None:
    """A Hugging Face pipeline's record (texts and the library's answers), or your own steps' (user_steps: the .npz
    of raw inputs and the answers expected), or None."""
    path = version_folder / "pipeline_reference.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    steps = version_folder / "user_steps_reference.npz"
    return {"user_steps": steps} if steps.is_file() else None


def _wire(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind == "U":  # strings travel as BYTES
        return np.array([v.encode("utf-8") for v in array.reshape(-1)], dtype=np.object_).reshape(array.shape)
    return array


def check_user_steps(client: TritonClient, name: str, path: Path, max_batch_size: int,
                     tolerance: dict[str, float]) -> tuple[list[str], dict[str, float]]:
    """The raw inputs through the served ensemble (your preprocess -> model -> your postprocess): strings equal,
    numbers within the version's tolerance (rel L2)."""
    with np.load(path, allow_pickle=False) as archive:
        inputs = {k.split("/", 1)[1]: archive[k] for k in archive.files if k.startswith("input/")}
        wanted = {k.split("/", 1)[1]: archive[k] for k in archive.files if k.startswith("output/")}
    rows = len(next(iter(inputs.values())))
    step = max(1, max_batch_size) if max_batch_size else rows
    parts: dict[str, list[np.ndarray]] = {k: [] for k in wanted}
    try:
        for start in range(0, rows, step):
            got = client.infer(name, {k: _wire(v[start:start + step]) for k, v in inputs.items()}, list(wanted))
            for key in wanted:
                parts[key].append(got[key])
    except TritonError as exc:
        return [f"pipeline: request failed: {' '.join(exc.reason.split())[:300]}"], {}
    failures, figures = [], {}
    limit = max(float(tolerance.get("rel_l2", 1e-5)), 1e-5)
    for key, want in wanted.items():
        have = np.concatenate(parts[key]).reshape(want.shape)
        if want.dtype.kind == "U":
            text = np.array([v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in have.reshape(-1)])
            agreement = float((text == want.reshape(-1)).mean())
            figures[f"{key}_agreement"] = agreement
            if agreement < 1.0:
                failures.append(f"'{key}' differs from the in-process steps on {int(round((1 - agreement) * text.size))} "
                                f"of {text.size} values")
            continue
        error = float(np.linalg.norm((have - want).astype(np.float64)) / max(np.linalg.norm(want.astype(np.float64)),
                                                                             1e-12))
        figures[f"{key}_rel_l2"] = error
        if error > limit:
            failures.append(f"'{key}' differs from the in-process steps by rel L2 {error:.2e}, over {limit:g}")
    return failures, figures


def text_batch(texts: list[str]) -> dict[str, np.ndarray]:
    """The ensemble's input for ``texts``: TYPE_STRING, one per sample."""
    return {"text": np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)}


def check_pipeline(client: TritonClient, name: str, reference: dict[str, Any], max_batch_size: int,
                   precision: str, tolerance: dict[str, float]) -> tuple[list[str], dict[str, float]]:
    if "user_steps" in reference:
        return check_user_steps(client, name, reference["user_steps"], max_batch_size, tolerance)
    if "images" in reference:
        import base64

        texts = [base64.b64decode(item) for item in reference["images"]]
    else:
        texts = reference["texts"]
    step = max(1, max_batch_size)
    outputs = (["label", "score", "scores"] if "labels" in reference else ["entities"] if "entities" in reference
               else ["embedding"])
    answers: dict[str, list[np.ndarray]] = {o: [] for o in outputs}
    try:
        for start in range(0, len(texts), step):
            batch = texts[start:start + step]
            sent = ({"image": np.array([[b] for b in batch], dtype=np.object_)} if "images" in reference
                    else text_batch(batch))
            got = client.infer(name, sent, outputs)
            for key in outputs:
                answers[key].append(got[key])
    except TritonError as exc:
        return [f"pipeline: request failed: {' '.join(exc.reason.split())[:300]}"], {}
    served = {key: np.concatenate(parts) for key, parts in answers.items()}
    return compare_pipeline(reference, served, *pipeline_limits(precision, float(tolerance.get("rel_l2", 0.0))))
