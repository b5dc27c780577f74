"""Build-time half of drift detection: reference profiles from validation tensors.

builder/monitoring/drift.py is the half that runs inside the served model (copied next to the
python-backend model.py, numpy only); this module builds and writes what it reads.

Usage::

    from builder.monitoring.drift_profile import build_profile, save_profile
    profile = build_profile({"image": x_ref}, {"logits": y_ref}, bins=10)
    save_profile("drift_profile.json", profile)     # drift.load_profile reads it back
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, Mapping, Optional

import numpy as np

from builder.monitoring.drift import (DEFAULT_THRESHOLDS, PROFILE_FORMAT, PROFILE_VERSION, _bin_categorical, _extract,
                                      _is_integer, _is_numeric, _positions)

__all__ = ["build_profile", "profile_text", "save_profile"]

_MAX_REFERENCE_VALUES = 2_000_000  # per feature, for the quantile computation


# --------------------------------------------------------------------------- #
# profile
# --------------------------------------------------------------------------- #
def _stats(v: np.ndarray) -> Dict[str, float]:
    return {
        "mean": float(v.mean()),
        "std": float(v.std()),
        "min": float(v.min()),
        "max": float(v.max()),
        "count": int(v.size),
    }


def _subsample_rows(vals: np.ndarray, cap: int, seed: int) -> np.ndarray:
    pos = _positions(vals.shape[1], cap, seed)
    return vals if pos is None else vals[:, pos]


def _numeric_feature(spec: Dict[str, Any], vals: np.ndarray, bins: int) -> Optional[Dict[str, Any]]:
    v = vals.astype(np.float64, copy=False).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return None
    if v.size > _MAX_REFERENCE_VALUES:
        v = np.random.default_rng(0).choice(v, size=_MAX_REFERENCE_VALUES, replace=False)
    qs = np.linspace(0.0, 1.0, bins + 1)[1:-1]
    edges = np.unique(np.quantile(v, qs)) if qs.size else np.zeros(0)
    counts = np.bincount(np.searchsorted(edges, v, side="right"), minlength=edges.size + 1)
    spec.update(kind="numeric", edges=[float(e) for e in edges])
    spec["ref_props"] = [float(c) for c in counts / counts.sum()]
    spec.update(_stats(v))
    return spec


def _categorical_feature(
    spec: Dict[str, Any], vals: np.ndarray, max_categories: int, cats: Optional[np.ndarray] = None
) -> Optional[Dict[str, Any]]:
    v = vals.ravel()
    if v.dtype.kind == "b":
        v = v.astype(np.int64)
    if v.size == 0:
        return None
    if cats is None:
        uniq, cnt = np.unique(v, return_counts=True)
        if uniq.size > max_categories:
            keep = np.argsort(-cnt, kind="stable")[:max_categories]
            uniq = np.sort(uniq[keep])
        cats = uniq
    idx = _bin_categorical(v, cats)
    counts = np.bincount(idx, minlength=cats.size + 1)
    spec.update(kind="categorical", values=[int(c) for c in cats])
    spec["ref_props"] = [float(c) for c in counts / counts.sum()]
    spec.update(_stats(v.astype(np.float64)))
    return spec


MIN_VALUES_PER_BIN = 10


def build_profile(
    inputs: Mapping[str, np.ndarray],
    outputs: Mapping[str, np.ndarray],
    bins: int = 10,
    *,
    max_features: int = 32,
    max_channels: int = 8,
    max_classes: int = 100,
    max_categories: int = 64,
    max_values_per_row: int = 256,
    position_seed: int = 0,
    thresholds: Optional[Mapping[str, float]] = None,
) -> Dict[str, Any]:
    """Reference profile from reference ``inputs`` and ``outputs`` (rows = first axis).

    Returns a JSON-serialisable dict::

        {"format": ..., "version": 1, "bins": 10, "reference_rows": N,
         "thresholds": {"psi": 0.25, "js": 0.2}, "max_values_per_row": 256,
         "position_seed": 0,
         "features": {name: {"source", "tensor", "kind", "select", ...,
                             "edges" | "values", "ref_props",
                             "mean", "std", "min", "max", "count"}},
         "skipped": {"input:name": "reason"}}

    Tensors it cannot profile (strings, complex, scalars, empty) are listed in
    ``skipped`` instead of raising.
    """
    if bins < 2:
        raise ValueError("bins must be >= 2")
    features: Dict[str, Dict[str, Any]] = {}
    skipped: Dict[str, str] = {}
    rows = 0

    def add(name: str, spec: Dict[str, Any], vals: Optional[np.ndarray], categorical: bool = False,
            cats: Optional[np.ndarray] = None) -> None:
        if vals is None:
            skipped[name] = "unsupported shape"
            return
        vals = _subsample_rows(vals, max_values_per_row, position_seed)
        if categorical:
            f = _categorical_feature(spec, vals, max_categories, cats)
        else:
            f = _numeric_feature(spec, vals, bins)
        if f is None:
            skipped[name] = "no finite values"
            return
        # bin proportions from a few values are noise: PSI against 100+ served rows then reads ~bins/N
        # (0.6-1.9 seen with 8-12 rows), so the drift alert would fire on the build's own data
        enough = MIN_VALUES_PER_BIN * (bins if not categorical else max(2, len(f["values"]) + 1))
        if f["count"] < enough:
            skipped[name] = (f"too few reference values ({f['count']}; at least {enough} for "
                             f"{'its categories' if categorical else f'{bins} bins'}): give more rows in data.validation")
        else:
            features[name] = f

    for source, tensors in (("input", inputs), ("output", outputs)):
        for tname, raw in tensors.items():
            base = f"{source}:{tname}"
            try:
                arr = np.asarray(raw)
            except Exception as exc:  # noqa: BLE001 - anything odd is just skipped
                skipped[base] = f"not an array: {exc}"
                continue
            if arr.ndim == 0 or arr.shape[0] == 0 or arr.size == 0:
                skipped[base] = f"needs a non-empty batch axis, got shape {list(arr.shape)}"
                continue
            if not _is_numeric(arr):
                skipped[base] = f"unsupported dtype {arr.dtype}"
                continue
            rows = max(rows, int(arr.shape[0]))
            common = {"source": source, "tensor": tname}

            # classification-like outputs
            if (source == "output" and arr.dtype.kind == "f" and arr.ndim == 2
                    and 2 <= arr.shape[1] <= max_classes):
                k = int(arr.shape[1])
                finite = arr[np.isfinite(arr).all(axis=1)]
                if finite.shape[0] == 0:
                    skipped[base] = "no finite rows"
                    continue
                score_sel = "max" if (finite.min() >= 0.0 and finite.max() <= 1.0) else "max_softmax"
                cspec = dict(common, select="argmax", columns=k)
                add(f"{base}:class", cspec, _extract(cspec, finite), categorical=True,
                    cats=np.arange(k))
                sspec = dict(common, select=score_sel, columns=k)
                add(f"{base}:score", sspec, _extract(sspec, finite))
                continue

            if arr.ndim == 4:
                axis = 1 if arr.shape[1] <= max_channels else (3 if arr.shape[3] <= max_channels else None)
                if axis is not None:
                    nch = int(arr.shape[axis])
                    for c in range(nch):
                        spec = dict(common, select="channel", axis=axis, index=c, channels=nch)
                        add(f"{base}[ch{c}]", spec, _extract(spec, arr))
                    continue

            if _is_integer(arr) and arr.ndim <= 3:
                spec = dict(common, select="all")
                add(base, spec, _extract(spec, arr), categorical=True)
                continue

            if arr.ndim == 2 and 2 <= arr.shape[1] <= max_features:
                ncol = int(arr.shape[1])
                for j in range(ncol):
                    spec = dict(common, select="column", index=j, columns=ncol)
                    add(f"{base}[{j}]", spec, _extract(spec, arr))
                continue

            spec = dict(common, select="all")
            add(base, spec, _extract(spec, arr))

    return {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "bins": int(bins),
        "reference_rows": rows,
        "thresholds": dict(thresholds if thresholds is not None else DEFAULT_THRESHOLDS),
        "max_values_per_row": int(max_values_per_row),
        "position_seed": int(position_seed),
        "features": features,
        "skipped": skipped,
    }


def profile_text(profile: Mapping[str, Any]) -> str:
    """``profile`` as the JSON text :func:`save_profile` writes."""
    return json.dumps(profile, indent=1, sort_keys=True, allow_nan=False) + "\n"


def save_profile(path: str, profile: Mapping[str, Any]) -> None:
    """Write ``profile`` as JSON (atomically: temp file + rename)."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".drift_profile.", suffix=".json", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(profile_text(profile))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
