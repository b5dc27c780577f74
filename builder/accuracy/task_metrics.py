"""Task metrics for outputs that users judge by something other than element-wise closeness.

An embedding is judged as its users use it: each sample's vector points the same way (per-sample cosine),
the set keeps its similarity order (Spearman correlation of the pairwise cosine similarities) and its
nearest neighbours (top-k agreement). A whole-tensor relative L2 refuses a dynamic INT8 MiniLM at rel L2
0.138 whose per-sample cosine is 0.9905 - what a retrieval user sees is the latter.

A classifier is judged by the labels it gives: ``text_classification`` (one label per sample) and
``token_classification`` (one per token) count the positions whose argmax over the last axis is kept.

``verify.metric`` picks it (``rel_l2``, the default: element-wise, every output; ``embedding``: the three
above, ``text_classification``/``token_classification``: label agreement, for lossy variants, FP16 and INT8;
an FP32 variant is still held to rel L2). Add a metric by adding
its tolerance keys to ``METRICS`` and its numbers to ``embedding_metrics``-like function called from
builder/accuracy/tensors.py compare_outputs.

Usage::

    m = embedding_metrics(reference, variant)     # {"row_cosine_min", "spearman", "neighbours_kept"}
    m |= label_metrics(reference, variant)        # {"label_agreement"}
    embedding_failures("embedding", m, {"min_row_cosine": 0.99, "min_spearman": 0.99})
"""

from __future__ import annotations

import numpy as np

from builder.core.errors import unknown_choice

#: metric -> the tolerance keys it judges by, with their defaults for lossy (fp16/int8) variants
METRICS: dict[str, dict[str, float]] = {
    "rel_l2": {},
    "embedding": {"min_row_cosine": 0.99, "min_spearman": 0.99, "min_neighbours": 0.9},
    # the label each sample (text) or each token (token classification) gets: argmax of the last axis
    "text_classification": {"min_label_agreement": 0.99},
    "token_classification": {"min_label_agreement": 0.99},
}
TOLERANCE_KEYS = tuple(dict.fromkeys(key for keys in METRICS.values() for key in keys))
#: the metrics' numbers in compare_outputs (merged over cases: the lowest)
NUMBERS = ("row_cosine_min", "spearman", "neighbours_kept", "label_agreement")
#: the numbers a verdict by each metric reports
METRIC_NUMBERS = {"embedding": NUMBERS[:3], "text_classification": NUMBERS[3:], "token_classification": NUMBERS[3:]}
NEIGHBOURS = 5  # top-k of each sample's nearest neighbours (fewer where the set is smaller)
MIN_ROWS_FOR_ORDER = 4  # pairwise order and neighbours say nothing about 2-3 samples
MAX_ORDER_ROWS = 512  # order and neighbours over the first 512 samples (pairwise: rows^2)
_EPS = 1e-12


def check_metric(name: str) -> str:
    if name not in METRICS:
        raise unknown_choice("verify.metric", name, list(METRICS),
                             "add it to METRICS in builder/accuracy/task_metrics.py with the numbers it judges by")
    return name


CASES_LABEL_AGREEMENT = 0.9  # on the verification cases: most labels kept, a broken graph keeps few
CASES_ROW_COSINE = 0.95  # on the verification cases (generated inputs too): a broken graph, not quantisation noise
ORDER_KEYS = ("min_spearman", "min_neighbours")


def on_cases(tolerance: dict[str, float]) -> dict[str, float]:
    """The tolerance for the verification cases, which hold generated inputs (random token ids, odd sizes):
    the task's thresholds describe its own data, so there order and neighbours are not judged and the
    per-sample cosine only has to show the same function (>= CASES_ROW_COSINE); data.validation is held to
    the full tolerance; labels likewise only have to be mostly kept (>= CASES_LABEL_AGREEMENT). Unchanged for
    a tolerance without task keys."""
    if "min_row_cosine" not in tolerance and "min_label_agreement" not in tolerance:
        return tolerance
    relaxed = {k: v for k, v in tolerance.items() if k not in ORDER_KEYS}
    if "min_row_cosine" in tolerance:
        relaxed["min_row_cosine"] = min(tolerance["min_row_cosine"], CASES_ROW_COSINE)
    if "min_label_agreement" in tolerance:  # random inputs give near-tied logits: a flip there is no lost task
        relaxed["min_label_agreement"] = min(tolerance["min_label_agreement"], CASES_LABEL_AGREEMENT)
    return relaxed


def lossy_tolerance(metric: str) -> dict[str, float]:
    """The tolerance keys ``metric`` adds for an FP16/INT8 variant ({} for rel_l2)."""
    return dict(METRICS[metric])


def _rows(array: np.ndarray) -> np.ndarray:
    return np.asarray(array, dtype=np.float64).reshape(len(array), -1)


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), _EPS)


def _ranks(values: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(values))
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
    return ranks


def embedding_metrics(reference: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Per-sample cosine (the lowest), and over 4+ samples the Spearman correlation of the pairwise cosine
    similarities and the share of each sample's top-k neighbours kept. {} for fewer than 2 dims or rows."""
    if np.ndim(reference) < 2 or len(reference) < 1:
        return {}
    ref, out = _rows(reference), _rows(got)
    if not (np.isfinite(ref).all() and np.isfinite(out).all()):
        return {}
    ref_n, out_n = _unit(ref), _unit(out)
    numbers = {"row_cosine_min": float(np.min(np.sum(ref_n * out_n, axis=1)))}
    rows = len(ref)
    if rows >= MIN_ROWS_FOR_ORDER:
        ref_n, out_n = ref_n[:MAX_ORDER_ROWS], out_n[:MAX_ORDER_ROWS]
        rows = len(ref_n)
        sim_ref, sim_out = ref_n @ ref_n.T, out_n @ out_n.T
        upper = np.triu_indices(rows, k=1)
        a, b = _ranks(sim_ref[upper]), _ranks(sim_out[upper])
        a, b = a - a.mean(), b - b.mean()
        denominator = float(np.linalg.norm(a) * np.linalg.norm(b))
        numbers["spearman"] = float(a @ b / denominator) if denominator > 0 else 1.0
        k = min(NEIGHBOURS, rows - 1)
        np.fill_diagonal(sim_ref, -np.inf)
        np.fill_diagonal(sim_out, -np.inf)
        top_ref = np.argsort(-sim_ref, axis=1)[:, :k]
        top_out = np.argsort(-sim_out, axis=1)[:, :k]
        kept = [len(set(r) & set(o)) / k for r, o in zip(top_ref.tolist(), top_out.tolist())]
        numbers["neighbours_kept"] = float(np.mean(kept))
    return numbers


def label_metrics(reference: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """The share of positions (samples of [batch, classes], tokens of [batch, tokens, labels]) whose label
    (argmax of the last axis) the variant keeps. {} for outputs without a class axis."""
    if np.ndim(reference) < 2 or np.shape(reference)[-1] < 2 or np.shape(reference) != np.shape(got):
        return {}
    ref, out = np.asarray(reference), np.asarray(got)
    if not (np.isfinite(ref).all() and np.isfinite(out).all()):
        return {}
    return {"label_agreement": float(np.mean(np.argmax(ref, axis=-1) == np.argmax(out, axis=-1)))}


def embedding_failures(metrics: dict[str, float], tolerance: dict[str, float]) -> list[str]:
    """The broken limits of the embedding metric, each with its number ([] where none is set or measured)."""
    checks = (("min_row_cosine", "row_cosine_min", "per-sample cosine {:.4f} < {}"),
              ("min_spearman", "spearman", "similarity-order Spearman {:.4f} < {}"),
              ("min_neighbours", "neighbours_kept", f"top-{NEIGHBOURS} neighbours kept {{:.3f}} < {{}}"),
              ("min_label_agreement", "label_agreement", "labels kept {:.4f} < {}"))
    broken = []
    for limit, number, text in checks:
        if limit in tolerance and number in metrics and not metrics[number] >= tolerance[limit]:
            broken.append(text.format(metrics[number], tolerance[limit]))
    return broken


def judged_as_task(tolerance: dict[str, float]) -> bool:
    """Whether a tolerance judges whole vectors or labels (a task metric), not each value."""
    return any(key in tolerance for key in TOLERANCE_KEYS)
