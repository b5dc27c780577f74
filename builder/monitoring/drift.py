"""Lightweight input/output drift detection for served models (numpy only).

This module is deliberately self-contained: it imports only numpy and the
standard library, because it is copied next to a Triton python-backend
``model.py`` inside a model version folder and imported from there.

Three pieces:

* ``drift_profile.build_profile`` (build time, not copied) turns reference tensors (the data the model was
  validated on) into a JSON-serialisable *profile*: for every *feature* the
  reference bin edges (quantiles of the reference) and the reference bin
  proportions, plus mean/std/min/max.
* :class:`DriftWindow` keeps the binned counts of the last ``window`` sampled
  rows seen in production and scores them against the profile with
  :func:`psi` (population stability index) and :func:`js_distance`
  (Jensen-Shannon distance, base 2, in [0, 1]).
* :func:`load_profile` reads the profile's JSON (drift_profile.py writes it).

Features (names are what the ``feature`` label of the drift gauges carries):

=====================================  ==========================================
tensor                                 features
=====================================  ==========================================
float ``[N, C, H, W]`` (C <= 8)        ``input:image[ch0]`` ... one per channel
                                       (channels-last ``[N, H, W, C]`` is detected
                                       when ``shape[1] > 8 >= shape[3]``)
float ``[N, F]`` (2 <= F <= 32)        ``input:x[0]`` ... one per column
float, any other shape                 ``input:x`` (all values pooled)
integer/bool, ndim <= 3 (token ids)    ``input:ids`` histogram over the values
                                       (the 64 most frequent reference values,
                                       plus one "other" bucket)
integer/bool, ndim 4 (uint8 images)    per channel, like float images
float output ``[N, K]`` (2 <= K <= 100) ``output:logits:class`` (argmax class
                                       distribution) and ``output:logits:score``
                                       (quantile bins of the max softmax; of the
                                       max value if outputs already lie in [0,1])
other outputs                          pooled like inputs (``output:y``)
strings / object / complex             skipped (listed in ``profile["skipped"]``)
=====================================  ==========================================

Numeric bins are ``(-inf, e0), [e0, e1), ..., [e_last, +inf)`` where ``e_i`` are
the distinct inner quantiles of the reference, so values outside the
reference range land in the (usually thin) outer bins; NaN/inf land in the
last bin. A row that holds more than ``max_values_per_row`` values for one
feature (e.g. a 64x64 channel) contributes a fixed, seeded subset of
positions; the reference proportions are computed from the same positions so
the two stay comparable.

Usage (inside a python-backend model.py)::

    import drift  # copied next to model.py
    profile = drift.load_profile(os.path.join(version_dir, "drift_profile.json"))
    window = drift.DriftWindow(profile, window=512, sample_every=10)
    ...
    window.observe({"image": image_np}, {"logits": logits_np})   # per request
    ...
    for feature, s in window.scores().items():                   # from time to time
        psi_gauge.set(s["psi"], labels={"feature": feature})
    thresholds = profile["thresholds"]   # {"psi": 0.25, "js": 0.2}

Building a profile (at build time, outside the served model): see
builder/monitoring/drift_profile.py (``build_profile``, ``save_profile``).

Interpreting PSI: < 0.1 no real change, 0.1-0.25 moderate, > 0.25
significant. With 10 quantile bins a mean shift of 0.5 standard deviations of a
*Gaussian* feature gives PSI of about 0.24 (right at the 0.25 threshold); a
bounded feature (e.g. normalised pixels) shifted by 0.5 sd, a 2x rescale, or a
different class mix score far above it. The default JS-distance threshold
0.2 is roughly equivalent to PSI 0.25 for small shifts
(JS distance ~= sqrt(PSI / (8 ln 2))).

``DriftWindow`` is not thread-safe within one process (Triton's python backend
calls ``execute`` from a single thread per instance). Several processes (one
stub per model instance) can share one window: pass each the same writable
``buffer`` of :func:`state_bytes` bytes (an mmap of one file) and a ``lock``
(a context manager that excludes the other processes, e.g. ``flock``).
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

__all__ = [
    "PROFILE_FORMAT",
    "PROFILE_VERSION",
    "DEFAULT_THRESHOLDS",
    "psi",
    "js_distance",
    "DriftWindow",
    "load_profile",
    "state_bytes",
]

PROFILE_FORMAT = "triton-builder-drift-profile"
PROFILE_VERSION = 1
#: Default alert thresholds stored in new profiles (the drift_threshold gauge).
DEFAULT_THRESHOLDS = {"psi": 0.25, "js": 0.2}



# --------------------------------------------------------------------------- #
# divergences
# --------------------------------------------------------------------------- #
def _as_props(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).ravel()
    s = a.sum()
    if not np.isfinite(s) or s <= 0:
        raise ValueError("bin proportions must be non-negative with a positive sum")
    return a / s


def psi(ref_props: Sequence[float], cur_props: Sequence[float], eps: float = 1e-4) -> float:
    """Population stability index ``sum((c - r) * ln(c / r))``.

    Both inputs are normalised to sum to 1 (raw counts are accepted), then
    clipped below at ``eps`` so empty bins give a large but finite value.
    """
    r = _as_props(ref_props)
    c = _as_props(cur_props)
    if r.shape != c.shape:
        raise ValueError(f"bin count mismatch: {r.size} reference vs {c.size} current")
    r = np.maximum(r, eps)
    c = np.maximum(c, eps)
    return float(np.sum((c - r) * np.log(c / r)))


def js_distance(ref_props: Sequence[float], cur_props: Sequence[float]) -> float:
    """Jensen-Shannon distance (square root of the JS divergence, base 2): 0..1."""
    p = _as_props(ref_props)
    q = _as_props(cur_props)
    if p.shape != q.shape:
        raise ValueError(f"bin count mismatch: {p.size} reference vs {q.size} current")
    m = 0.5 * (p + q)

    def _kl(a: np.ndarray) -> float:
        nz = a > 0
        return float(np.sum(a[nz] * np.log2(a[nz] / m[nz])))

    d = 0.5 * _kl(p) + 0.5 * _kl(q)
    return float(math.sqrt(min(max(d, 0.0), 1.0)))


# --------------------------------------------------------------------------- #
# feature extraction (shared by build_profile and DriftWindow)
# --------------------------------------------------------------------------- #
def _positions(length: int, cap: int, seed: int) -> Optional[np.ndarray]:
    """Fixed subset of value positions in a row (None: use them all)."""
    if cap <= 0 or length <= cap:
        return None
    rng = np.random.default_rng([int(seed), int(length)])
    return np.sort(rng.choice(length, size=cap, replace=False))


def _is_numeric(a: np.ndarray) -> bool:
    return a.dtype.kind in "fiub"


def _is_integer(a: np.ndarray) -> bool:
    return a.dtype.kind in "iub"


def _softmax_max(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64, copy=False)
    z = np.exp(x - x.max(axis=1, keepdims=True))
    return 1.0 / z.sum(axis=1)


def _extract(spec: Mapping[str, Any], arr: np.ndarray) -> Optional[np.ndarray]:
    """Values of one feature as ``[rows, L]`` (before row subsampling), or None."""
    sel = spec["select"]
    if arr.ndim == 0 or not _is_numeric(arr):
        return None
    n = arr.shape[0]
    if sel == "all":
        return arr.reshape(n, -1)
    if sel == "channel":
        axis = spec["axis"]
        if arr.ndim != 4 or arr.shape[axis] != spec["channels"]:
            return None
        c = spec["index"]
        v = arr[:, c] if axis == 1 else arr[..., c]
        return v.reshape(n, -1)
    if arr.ndim != 2 or arr.shape[1] != spec["columns"]:
        return None
    if sel == "column":
        return arr[:, spec["index"] : spec["index"] + 1]
    if sel == "argmax":
        return arr.argmax(axis=1)[:, None]
    if sel == "max_softmax":
        return _softmax_max(arr)[:, None]
    if sel == "max":
        return arr.max(axis=1)[:, None]
    return None


def _bin_numeric(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    if values.dtype.kind != "f":
        values = values.astype(np.float64)
    # NaN sorts after every edge, so NaN (like +inf) lands in the last bin.
    return np.searchsorted(edges, values, side="right")


def _bin_categorical(values: np.ndarray, cats: np.ndarray) -> np.ndarray:
    k = cats.size
    pos = np.searchsorted(cats, values)
    np.minimum(pos, k - 1, out=pos)
    hit = cats[pos] == values
    return np.where(hit, pos, k)


def _row_counts(idx: np.ndarray, nbins: int) -> np.ndarray:
    """Per-row histogram ``[rows, nbins]`` of bin indices ``[rows, L]``."""
    m = idx.shape[0]
    if idx.shape[1] == 1:
        out = np.zeros((m, nbins), dtype=np.int32)
        out[np.arange(m), idx[:, 0]] = 1
        return out
    flat = idx + (np.arange(m, dtype=idx.dtype) * nbins)[:, None]
    return np.bincount(flat.ravel(), minlength=m * nbins).reshape(m, nbins).astype(np.int32)


def load_profile(path: str) -> Dict[str, Any]:
    """Read a profile written by :func:`save_profile` (checks its format/version)."""
    with open(path, encoding="utf-8") as fh:
        profile = json.load(fh)
    if not isinstance(profile, dict) or profile.get("format") != PROFILE_FORMAT:
        raise ValueError(f"{path}: not a {PROFILE_FORMAT} file")
    if profile.get("version") != PROFILE_VERSION:
        raise ValueError(f"{path}: unsupported profile version {profile.get('version')!r}")
    return profile


# --------------------------------------------------------------------------- #
# sliding window
# --------------------------------------------------------------------------- #
class _Feature:
    __slots__ = ("name", "spec", "source", "tensor", "kind", "select", "edges", "cats",
                 "ref", "nbins", "ring", "total")

    def __init__(self, name: str, spec: Mapping[str, Any]) -> None:
        self.name = name
        self.spec = spec
        self.source = spec["source"]
        self.tensor = spec["tensor"]
        self.kind = spec["kind"]
        self.select = spec["select"]
        if self.kind == "numeric":
            self.edges = np.asarray(spec["edges"], dtype=np.float64)
            self.cats = None
            self.nbins = self.edges.size + 1
        else:
            self.edges = None
            self.cats = np.asarray(spec["values"], dtype=np.int64)
            self.nbins = self.cats.size + 1
        self.ref = np.asarray(spec["ref_props"], dtype=np.float64)
        if self.ref.size != self.nbins:
            raise ValueError(f"feature {name}: {self.ref.size} ref_props for {self.nbins} bins")
        self.ring = self.total = None  # views into the window's state buffer (DriftWindow)

    def bin(self, vals: np.ndarray) -> Optional[np.ndarray]:
        if self.kind == "numeric":
            return _bin_numeric(vals, self.edges)
        if self.select == "argmax":
            return vals
        if vals.dtype.kind not in "iub":
            return None
        if vals.dtype.kind == "b":
            vals = vals.astype(np.int64)
        return _bin_categorical(vals, self.cats)


class DriftWindow:
    """Binned counts of the last ``window`` sampled rows, scored against a profile.

    ``observe(inputs, outputs)`` takes one request's (or batch's) tensors by
    name, rows on the first axis. Only every ``sample_every``-th call is kept
    (a counter; ``seed`` picks which call of each group of ``sample_every``
    is the kept one, so several model instances do not all sample the same
    calls). Each kept row's per-feature bin counts go into a ring of
    ``window`` slots; a running total is updated by subtracting the evicted
    rows and adding the new ones, so ``observe`` costs O(rows x features)
    (x values per row, capped by the profile's ``max_values_per_row``) and
    ``scores`` costs O(features x bins).

    Features whose tensor is missing, has an unexpected shape or dtype are
    skipped for that call (their slot counts are zero); a call where no
    feature could be used is not counted as a sample at all. The row count
    of a call is the first axis of the first profiled tensor present; a
    tensor with a different first axis is skipped for that call.
    """

    def __init__(self, profile: Mapping[str, Any], window: int = 512, sample_every: int = 1,
                 seed: int = 0, buffer: Any = None, lock: Any = None) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        if sample_every < 1:
            raise ValueError("sample_every must be >= 1")
        self.profile = profile
        self.window = int(window)
        self.sample_every = int(sample_every)
        self._cap = int(profile.get("max_values_per_row", 0))
        self._pos_seed = int(profile.get("position_seed", 0))
        self._features = [_Feature(n, s) for n, s in profile.get("features", {}).items()]
        self._positions: Dict[int, Optional[np.ndarray]] = {}
        self._phase = int(np.random.default_rng(seed).integers(self.sample_every))
        self._calls = 0
        self._sampled_calls = 0
        need = state_bytes(profile, self.window)
        if buffer is None:
            buffer = bytearray(need)
        elif len(buffer) < need:
            raise ValueError(f"state buffer of {len(buffer)} bytes: this profile and window need {need}")
        # [write position, rows filled], every feature's running totals, then the rings: the int64
        # parts first keep every array aligned. A zeroed buffer is an empty window, so a fresh shared
        # file needs no initialisation, whichever process maps it first.
        self._state = np.frombuffer(buffer, np.int64, 2, 0)
        offset = 16
        for f in self._features:
            f.total = np.frombuffer(buffer, np.int64, f.nbins, offset)
            offset += 8 * f.nbins
        for f in self._features:
            f.ring = np.frombuffer(buffer, np.int32, self.window * f.nbins, offset).reshape(self.window, f.nbins)
            offset += 4 * self.window * f.nbins
        self._lock = lock if lock is not None else _Unlocked()

    # -- properties -------------------------------------------------------- #
    @property
    def samples(self) -> int:
        """Number of sampled rows currently in the window (<= ``window``)."""
        return int(self._state[1])

    @property
    def calls(self) -> int:
        """observe() calls so far (sampled or not)."""
        return self._calls

    @property
    def sampled_calls(self) -> int:
        """observe() calls that were kept."""
        return self._sampled_calls

    @property
    def features(self) -> list:
        """Feature names from the profile, in profile order."""
        return [f.name for f in self._features]

    @property
    def thresholds(self) -> Dict[str, float]:
        return dict(self.profile.get("thresholds", DEFAULT_THRESHOLDS))

    # -- hot path ---------------------------------------------------------- #
    def _subsample(self, vals: np.ndarray) -> np.ndarray:
        length = vals.shape[1]
        if self._cap <= 0 or length <= self._cap:
            return vals
        pos = self._positions.get(length)
        if pos is None:
            pos = _positions(length, self._cap, self._pos_seed)
            self._positions[length] = pos
        return vals[:, pos]

    def observe(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> bool:
        """Record one call's tensors; returns True when this call was sampled."""
        call = self._calls
        self._calls = call + 1
        if call % self.sample_every != self._phase:
            return False
        arrays: Dict[tuple, Optional[np.ndarray]] = {}
        per_feature = []
        rows = None
        for f in self._features:
            key = (f.source, f.tensor)
            if key not in arrays:
                src = inputs if f.source == "input" else outputs
                raw = src.get(f.tensor) if src is not None else None
                a = None
                if raw is not None:
                    try:
                        a = np.asarray(raw)
                    except Exception:  # noqa: BLE001
                        a = None
                    if a is not None and (a.ndim == 0 or a.shape[0] == 0):
                        a = None
                arrays[key] = a
            a = arrays[key]
            counts = None
            if a is not None:
                if rows is None:
                    rows = a.shape[0]
                if a.shape[0] == rows:
                    try:
                        vals = _extract(f.spec, a)
                        if vals is not None:
                            idx = f.bin(self._subsample(vals))
                            if idx is not None:
                                counts = _row_counts(idx, f.nbins)
                    except (ValueError, TypeError, IndexError):
                        counts = None
            per_feature.append(counts)
        if rows is None or all(c is None for c in per_feature):
            return False  # nothing this profile could use: not a sample
        self._sampled_calls += 1
        m = rows
        start = 0
        if m > self.window:
            start = m - self.window
            m = self.window
        with self._lock:
            self._store(per_feature, m, start)
        return True

    def _store(self, per_feature: list, m: int, start: int) -> None:
        """Write one call's last ``m`` rows of counts into the ring (the caller holds the lock)."""
        w = self.window
        pos, filled = int(self._state[0]), int(self._state[1])
        if m == 1:
            slots: Any = pos
        else:
            slots = (pos + np.arange(m)) % w
        evict = filled + m > w  # some written slots already hold data
        for f, counts in zip(self._features, per_feature):
            if evict:
                old = f.ring[slots]
                f.total -= old if m == 1 else old.sum(axis=0)
            if counts is None:
                f.ring[slots] = 0
            else:
                new = counts[start:] if start else counts
                if m == 1:
                    new = new[0]
                    f.ring[slots] = new
                    f.total += new
                else:
                    f.ring[slots] = new
                    f.total += new.sum(axis=0)
        self._state[0] = (pos + m) % w
        self._state[1] = min(w, filled + m)

    # -- scoring ----------------------------------------------------------- #
    def _totals(self) -> list:
        """(feature, a copy of its totals): one consistent snapshot, scored outside the lock."""
        with self._lock:
            return [(f, f.total.copy()) for f in self._features]

    def current_props(self) -> Dict[str, list]:
        """Current window bin proportions per feature (features with data only)."""
        out = {}
        for f, total in self._totals():
            t = total.sum()
            if t > 0:
                out[f.name] = (total / t).tolist()
        return out

    def scores(self) -> Dict[str, Dict[str, float]]:
        """``{feature: {"psi": float, "js": float}}`` for features with data in the window."""
        out: Dict[str, Dict[str, float]] = {}
        for f, total in self._totals():
            t = total.sum()
            if t <= 0:
                continue
            cur = total / t
            out[f.name] = {"psi": psi(f.ref, cur), "js": js_distance(f.ref, cur)}
        return out

    def reset(self) -> None:
        """Forget everything in the window (keeps the call counter)."""
        with self._lock:
            for f in self._features:
                f.ring[:] = 0
                f.total[:] = 0
            self._state[:] = 0


class _Unlocked:
    """The lock of a window that no other process shares."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def state_bytes(profile: Mapping[str, Any], window: int) -> int:
    """Size of a window's state (what a shared ``buffer`` must hold) for this profile and window."""
    bins = sum(_Feature(n, s).nbins for n, s in profile.get("features", {}).items())
    return 16 + bins * (8 + 4 * int(window))
