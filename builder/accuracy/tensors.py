"""Numeric helpers shared by stages, validation and the served check: dtypes, generated inputs,
verification cases and the equivalence metrics.

Usage::

    cases = build_cases(spec, validation=None)          # [{"id": "gen_b1_dopt", "inputs": {...}}, ...]
    metrics = compare_outputs(ref, got)                  # {"logits": {"rel_l2": ..., ...}}
    failures = tolerance_failures(metrics, {"rel_l2": 1e-5})
"""

from __future__ import annotations

from typing import Any

import numpy as np

from builder.accuracy.input_rules import rule_for
from builder.accuracy.task_metrics import (NUMBERS as EMBEDDING_NUMBERS, embedding_failures, embedding_metrics,
                                           judged_as_task, label_metrics)
from builder.spec.model import ModelSpec, TensorSpec

EPS = 1e-12


def np_dtype(name: str) -> np.dtype:
    return np.dtype(name)


# Where a generated case puts the dynamic (-1) dims: a number (verify.dynamic_sizes: every -1 dim takes
# it), or a point of each axis's OWN min/opt/max_shape range ("mid": an odd size between opt and max,
# which catches kernels that only work on round sizes). The skew points give neighbouring dynamic dims
# opposite ends of their ranges (H high and W low, src long and tgt short): a trace or export frozen on
# equal sizes is caught there. Inputs whose dynamic dims have the same ranges (ids and their mask) move
# together; stage load keeps a skew case only where the model runs on it.
SHARED_POINTS = ("min", "opt", "mid", "max")
SKEW_POINTS = ("skew_hl", "skew_lh")


def dims_at(tensor: TensorSpec, point: int | str, index: int = 0) -> list[int]:
    """The per-sample shape of ``tensor`` with its dynamic dims at ``point``; at a skew point they
    alternate high/low starting from ``index`` (skew_groups: inputs of other ranges start elsewhere)."""
    if not isinstance(point, str):
        return tensor.concrete_shape(int(point))
    profile = tensor.profile_shapes()
    dims, k = [], index
    for axis, d in enumerate(tensor.shape):
        if d != -1:
            dims.append(d)
            continue
        low, opt, high = max(profile["min"][axis], 1), profile["opt"][axis], profile["max"][axis]
        if point == "mid":
            dims.append(min(high, max(low, (opt + high) // 2 | 1)))
        elif point in SKEW_POINTS:
            dims.append(high if (k % 2 == 0) == (point == "skew_hl") else low)
            k += 1
        else:
            dims.append({"min": low, "opt": opt, "max": high}[point])
    return dims


def generated_inputs(spec: ModelSpec, batch: int | None, point: int | str, rng: np.random.Generator
                     ) -> dict[str, np.ndarray]:
    """One generated feed: every input at ``batch`` (None: unbatched) with its dynamic dims at ``point``."""
    groups = skew_groups(spec)
    return {t.name: random_tensor(t, batch, point, rng, groups[i]) for i, t in enumerate(spec.inputs)}


def skew_groups(spec: ModelSpec) -> list[int]:
    """Per input, the index of its group: inputs whose dynamic dims have the same min/opt/max ranges
    share one (a mask is as long as its ids); another range is another group, so src and tgt differ."""
    groups: dict[tuple, int] = {}
    result = []
    for t in spec.inputs:
        profile = t.profile_shapes()
        key = tuple((profile["min"][a], profile["opt"][a], profile["max"][a]) for a, d in enumerate(t.shape) if d == -1)
        result.append(groups.setdefault(key, len(groups)))
    return result


def random_tensor(tensor: TensorSpec, batch: int | None, dynamic_size: int | str, rng: np.random.Generator,
                  index: int = 0) -> np.ndarray:
    """A random array for one input, valid for it (builder/accuracy/input_rules.py: the spec's rule, the data's,
    transformers' names, else integers in [0, 100) and normal floats); dynamic dims at ``dynamic_size``
    (a number or a point, see dims_at)."""
    shape = dims_at(tensor, dynamic_size, index)
    if batch is not None:
        shape = [batch, *shape]
    return rule_for(tensor).generate(tensor.dtype, shape, rng)


def to_wire(array: np.ndarray, dims: list[int], batching: bool) -> np.ndarray:
    """An array shaped as the model sees it, shaped as clients send/receive it: a scalar per sample
    travels as dims [1] (config ``dims: [1]`` with ``reshape: {shape: []}``); others are unchanged."""
    array = np.asarray(array)
    if list(dims) == [1] and array.ndim == (1 if batching else 0):
        return array.reshape((len(array), 1) if batching else (1,))
    return array


def from_wire(array: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """A served output back in the reference's shape when only the scalar convention differs."""
    array = np.asarray(array)
    ref_shape = np.shape(reference)
    if array.shape != ref_shape and array.size == int(np.prod(ref_shape)) and \
            [d for d in array.shape if d != 1] == [d for d in ref_shape if d != 1]:
        return array.reshape(ref_shape)
    return array


def default_batch_sizes(spec: ModelSpec) -> list[int]:
    if spec.verify.batch_sizes:
        return list(spec.verify.batch_sizes)
    if not spec.batching:
        return [0]
    sizes = [1, 3, spec.max_batch_size]
    return sorted({s for s in sizes if s <= spec.max_batch_size})


def _shapes_at(spec: ModelSpec, point: int | str) -> tuple:
    groups = skew_groups(spec)
    return tuple(tuple(dims_at(t, point, groups[i])) for i, t in enumerate(spec.inputs))


def default_dynamic_sizes(spec: ModelSpec) -> list[int | str]:
    """The points (see dims_at) every generated case size runs at: verify.dynamic_sizes when given,
    else min, opt, mid and max of each axis's own range (those giving the same shapes once)."""
    if not spec.has_dynamic_dims:
        return [0]
    if spec.verify.dynamic_sizes:
        return list(spec.verify.dynamic_sizes)
    seen: dict[tuple, str] = {}
    for point in SHARED_POINTS:
        seen.setdefault(_shapes_at(spec, point), point)
    return list(seen.values())


def skew_points(spec: ModelSpec) -> list[str]:
    """The skew points whose shapes no shared point has (none with a single dynamic dim)."""
    if not spec.has_dynamic_dims or spec.verify.dynamic_sizes:
        return []
    taken = {_shapes_at(spec, p) for p in SHARED_POINTS}
    points: dict[tuple, str] = {}
    for point in SKEW_POINTS:
        if _shapes_at(spec, point) not in taken:
            points.setdefault(_shapes_at(spec, point), point)
    return list(points.values())


def trace_example(spec: ModelSpec, seed: int = 12345) -> dict[str, np.ndarray]:
    """The example used for tracing/export: batch 2 and each input's opt sizes, so neither specialises to 1."""
    batch = min(2, spec.max_batch_size) if spec.batching else None
    return generated_inputs(spec, batch, "opt" if spec.has_dynamic_dims else 0, np.random.default_rng(seed))


def build_cases(spec: ModelSpec, validation: dict[str, np.ndarray] | None) -> list[dict[str, Any]]:
    """Verification cases: validation batches when given, generated ones at every batch size and
    dynamic size otherwise (and in addition, for dynamic dims validation data does not vary)."""
    rng = np.random.default_rng(spec.verify.seed)
    cases: list[dict[str, Any]] = []
    batch_sizes = default_batch_sizes(spec)
    if validation is not None:
        count = len(next(iter(validation.values()))) if spec.batching else 1
        start = 0
        for batch in batch_sizes:
            if spec.batching:
                take = batch  # fewer samples than the batch: they repeat, so every batch size still runs
                idx = [(start + i) % count for i in range(take)]
                start += take
                inputs = {t.name: np.ascontiguousarray(validation[t.name][idx]) for t in spec.inputs}
                cases.append({"id": f"val_b{take}", "inputs": inputs})
            else:
                cases.append({"id": "val", "inputs": {t.name: validation[t.name] for t in spec.inputs}})
                break
    if validation is None or spec.has_dynamic_dims:
        # unbatched: three draws, not one - a trace frozen on its example's values (a loop's trip count,
        # a branch) must meet other values to be caught, as batched cases meet them in their other rows
        draws = batch_sizes if spec.batching else [0, 1, 2]
        for dyn in default_dynamic_sizes(spec):
            for draw in draws:
                b = draw if spec.batching else None
                label = (f"gen_b{draw}" if spec.batching else f"gen{draw}") + (f"_d{dyn}" if spec.has_dynamic_dims else "")
                # the odd in-between size is the builder's pick: a model that takes only even sizes drops it
                cases.append({"id": label, "inputs": generated_inputs(spec, b, dyn, rng), "optional": dyn == "mid"})
    # optional: stage load keeps them only where the model runs (dims it needs equal make it refuse)
    batch = batch_sizes[len(batch_sizes) // 2] if spec.batching else None
    for point in skew_points(spec):
        cases.append({"id": f"gen_b{batch or 0}_d{point}", "inputs": generated_inputs(spec, batch, point, rng),
                      "optional": True})
    return cases


def compare_outputs(reference: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Per output: max abs / max relative / relative L2 error and cosine similarity; for an integer or
    bool output (class ids, token ids, masks) also the count of values that differ (``mismatched``),
    which is what tolerance_failures judges it by: a class id off by one is wrong, not 8 % off."""
    metrics: dict[str, dict[str, float]] = {}
    for name, ref in reference.items():
        if name not in got:
            metrics[name] = {"missing": 1.0}
            continue
        out = got[name]
        if tuple(np.shape(out)) != tuple(np.shape(ref)):
            metrics[name] = {"shape_mismatch": 1.0, "expected": list(np.shape(ref)), "got": list(np.shape(out))}
            continue
        r = np.asarray(ref, dtype=np.float64).ravel()
        o = np.asarray(out, dtype=np.float64).ravel()
        exact = {}
        if np.asarray(ref).dtype.kind in "biu":
            exact = {"integer": 1.0, "mismatched": float(np.count_nonzero(np.asarray(ref).ravel() != np.asarray(out).ravel()))}
        finite = np.isfinite(r)
        broken = finite & ~np.isfinite(o)
        if broken.any():  # NaN/Inf where the reference is finite: NaN metrics would pass every "> tol" test
            metrics[name] = {"nonfinite_in_variant": float(broken.sum()), "compared": float(np.size(ref)),
                             "finite": float(finite.sum())}
            continue
        if finite.any() and not finite.all():  # NaN/Inf where the reference has them must match, not poison
            if not np.array_equal(r[~finite], o[~finite], equal_nan=True):
                metrics[name] = {"nonfinite_mismatch": 1.0, "compared": float(r.size), "finite": float(finite.sum())}
                continue
            r, o = r[finite], o[finite]
        diff = np.abs(r - o)
        ref_norm = float(np.linalg.norm(r))
        out_norm = float(np.linalg.norm(o))
        metrics[name] = {
            "max_abs": float(diff.max()) if diff.size else 0.0,
            "max_rel": float((diff / (np.abs(r) + 1e-6)).max()) if diff.size else 0.0,
            "rel_l2": float(np.linalg.norm(r - o) / max(ref_norm, EPS)) if ref_norm > 0 else float(np.linalg.norm(o)),
            "cosine": float(r @ o / max(ref_norm * out_norm, EPS)) if ref_norm and out_norm else float(ref_norm == out_norm),
            "compared": float(np.size(ref)),  # values compared (summed over cases): 0 = nothing was checked
            "finite": float(finite.sum()),
            "ref_min": float(r.min()) if r.size else 0.0,  # equal over every case: the output ignores its input
            "ref_max": float(r.max()) if r.size else 0.0,
            **exact,
            **({} if exact else _lost_column(np.asarray(ref, dtype=np.float64), np.asarray(out, dtype=np.float64))),
            **({} if exact else embedding_metrics(np.asarray(ref), np.asarray(out))),
            **({} if exact else label_metrics(np.asarray(ref), np.asarray(out))),
        }
    return metrics


LOST_COLUMN_REL_L2 = 0.5     # a column off by half its own size has lost what it held, at any precision
SMALL_COLUMN_RATIO = 1e-2    # columns 100x smaller than the largest: a mixed-scale output ([boxes | probs])
COLUMN_NOISE_FLOOR = 1e-6    # below this share of the largest column: numerical residue, not a signal
COLUMN_MIN_ROWS = 8          # a column's scale read from fewer values is chance (one near-zero logit)


def _lost_column(ref: np.ndarray, out: np.ndarray) -> dict:
    """The worst small-scale column of a mixed-scale output, judged by its own size: one rel L2 over
    the whole tensor is ruled by its large columns, so an INT8 variant that rounded every probability
    of a [boxes 0..640 | probs 0..1] output to 0 read 3.9e-3 and passed. Columns are the last axis;
    only those far smaller than the largest are judged ({} otherwise, and for outputs too small to tell)."""
    if ref.ndim < 2 or ref.shape[-1] < 2 or ref.size // ref.shape[-1] < COLUMN_MIN_ROWS:
        return {}
    r, o = ref.reshape(-1, ref.shape[-1]), out.reshape(-1, ref.shape[-1])
    if not np.isfinite(r).all():
        return {}
    scale = np.sqrt((r ** 2).mean(axis=0))
    top = float(scale.max())
    small = np.flatnonzero((scale <= top * SMALL_COLUMN_RATIO) & (scale >= top * COLUMN_NOISE_FLOOR) & (scale > 0))
    if not small.size:
        return {}
    errors = np.linalg.norm(r[:, small] - o[:, small], axis=0) / np.linalg.norm(r[:, small], axis=0)
    worst = int(np.argmax(errors))
    return {"lost_column_rel_l2": float(errors[worst]),
            "lost_column": f"column {int(small[worst])} of the last axis (values ~{scale[small[worst]]:.2g}, "
                           f"beside ~{top:.2g} in its largest column)"}


def merge_case_metrics(per_case: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Worst value over all cases for each output and metric (cosine: the lowest)."""
    merged: dict[str, dict[str, float]] = {}
    for metrics in per_case:
        for name, m in metrics.items():
            into = merged.setdefault(name, {})
            for key, value in m.items():
                if key == "lost_column":  # the worst case's column, with its number
                    if m.get("lost_column_rel_l2", 0.0) >= into.get("lost_column_rel_l2", 0.0):
                        into[key] = value
                elif not isinstance(value, (int, float)):
                    into[key] = value
                elif key in ("cosine", "ref_min", *EMBEDDING_NUMBERS):
                    into[key] = min(into.get(key, value if key == "ref_min" else 1.0), value)
                elif key in ("compared", "finite", "mismatched", "nonfinite_in_variant"):
                    into[key] = into.get(key, 0.0) + value
                else:
                    into[key] = max(into.get(key, 0.0), value)
    return merged


def worst_metric(metrics: dict[str, dict[str, float]], key: str = "rel_l2") -> float | None:
    """The largest ``key`` over the outputs of (merged) metrics; None where no output has it."""
    values = [m[key] for m in metrics.values() if isinstance(m.get(key), (int, float))]
    return max(values) if values else None


# what compare_outputs records where an output has no distance to read (tolerance_failures fails each, and the
# regression gate counts it as an infinite one)
UNMEASURED = ("missing", "shape_mismatch", "nonfinite_mismatch", "nonfinite_in_variant")


def tolerance_failures(metrics: dict[str, dict[str, float]], tolerance: dict[str, float]) -> list[str]:
    """One line per failing output, with its numbers, e.g. 'logits: rel L2 3.1e-02 > 1e-05 (...)'."""
    failures = []
    constant = [n for n, m in metrics.items() if m.get("compared") and m.get("ref_min", 0) == m.get("ref_max", 1)]
    if constant and len(constant) == len(metrics):
        # every output is one value whatever the input: comparing it proves nothing about the variant
        return [f"{n}: the reference is {metrics[n]['ref_min']:g} for every input of every case "
                f"({metrics[n]['compared']:.0f} values): the output does not depend on the inputs, so nothing was "
                "verified (a degenerate model, e.g. random weights whose activations vanish, or inputs that "
                "exercise nothing); give data.validation with real inputs, or inputs[].value_range" for n in constant]
    for name, m in metrics.items():
        if "missing" in m:
            failures.append(f"{name}: output missing from the variant's results")
            continue
        if "shape_mismatch" in m:
            failures.append(f"{name}: shape {m['got']} != reference {m['expected']}")
            continue
        if "nonfinite_mismatch" in m:
            failures.append(f"{name}: NaN/Inf where the reference has them differ from the reference's")
            continue
        if "nonfinite_in_variant" in m:
            failures.append(f"{name}: {m['nonfinite_in_variant']:.0f} of {m['compared']:.0f} values are NaN/Inf in "
                            "the variant where the reference is finite")
            continue
        if m.get("compared", 1) == 0:
            failures.append(f"{name}: every case gave an EMPTY output (0 values compared), so nothing was verified: "
                            "the inputs exercise nothing (e.g. no detection above the threshold); give "
                            "data.validation with inputs that produce output, or inputs[].value_range")
            continue
        if m.get("finite", 1) == 0:
            failures.append(f"{name}: the reference is NaN/Inf everywhere ({m['compared']:.0f} values), so nothing "
                            "was verified; give data.validation with real inputs, or inputs[].value_range")
            continue
        if m.get("integer"):
            failures += _mismatch_failure(name, m, tolerance)
            continue
        broken = []  # "not <=": a NaN metric fails, where "> tol" would let it pass
        if not m["rel_l2"] <= tolerance.get("rel_l2", float("inf")):
            broken.append(f"rel L2 {m['rel_l2']:.1e} > {tolerance.get('rel_l2', float('inf')):.0e}")
        if not m["max_abs"] <= tolerance.get("max_abs", float("inf")):
            broken.append(f"max abs {m['max_abs']:.1e} > atol {tolerance.get('max_abs', float('inf')):.0e}")
        if "min_cosine" in tolerance and not m["cosine"] >= tolerance["min_cosine"]:  # a flipped sign rounds below -1
            broken.append(f"cosine {m['cosine']:.6f} < {tolerance['min_cosine']}")
        broken += embedding_failures(m, tolerance)
        # an embedding is judged as whole vectors, a classifier by its labels (task_metrics): a near-zero
        # dimension or a small logit is no lost signal there
        if not judged_as_task(tolerance) and \
                not m.get("lost_column_rel_l2", 0.0) <= max(LOST_COLUMN_REL_L2, tolerance.get("rel_l2", 0.0)):
            broken.append(f"{m['lost_column']} is lost: rel L2 {m['lost_column_rel_l2']:.1e} of its own values "
                          "(a mixed-scale output keeps its small part only as separate outputs, or in a variant "
                          "that does not quantize it)")
        if broken:
            failures.append(
                f"{name}: {'; '.join(broken)} (max abs {m['max_abs']:.1e}, max rel {m['max_rel']:.1e}, "
                f"rel L2 {m['rel_l2']:.1e}, cosine {m['cosine']:.6f})"
            )
    return failures


def beyond_the_cases(metrics: dict[str, dict[str, float]], tolerance: dict[str, float], already: list[str],
                     samples: int) -> list[str]:
    """The tolerance on every validation sample (``metrics``: compare_outputs over the whole set), not
    only on those the verification cases (and so reference.npz) hold: a variant can match the first
    few samples and drift on the rest (INT8 calibrated on another range). Outputs already failing
    on the cases (``already``: their failure lines) are not listed twice."""
    failing = {line.split(":", 1)[0] for line in already}
    return [f"{line} on all {samples} samples of data.validation" for line in tolerance_failures(metrics, tolerance)
            if line.split(":", 1)[0] not in failing]


def _mismatch_failure(name: str, m: dict[str, float], tolerance: dict[str, float]) -> list[str]:
    """Integer and bool outputs match exactly, or within ``max_mismatch`` (a fraction of the values:
    an INT8 variant may flip a class id where the top two scores nearly tie). A version recorded
    before this rule has no ``max_mismatch``: exact."""
    limit = tolerance.get("max_mismatch", 0.0)
    share = m["mismatched"] / m["compared"] if m["compared"] else 0.0
    if share <= limit:
        return []
    return [f"{name}: {m['mismatched']:.0f} of {m['compared']:.0f} values differ ({share:.1%} > max_mismatch "
            f"{limit:.1%}; integer/bool outputs are compared exactly, not by rel L2; max abs difference "
            f"{m['max_abs']:g})"]


def top1_output(outputs: dict[str, np.ndarray], labels: np.ndarray) -> str | None:
    """The output top-1 accuracy scores against ``labels``: of the integer outputs holding one class id per
    label (scored as they are) and the float outputs with more than one class per label (scored by their
    argmax), the one whose answers the labels fit best (``outputs`` are the reference's: of (features,
    logits) the logits, not the embedding that comes first; of (token count, logits) the logits, not an
    integer that merely has one value per sample); a tie goes to the integer output, the model's own
    answer. None when neither kind exists. Each label covers the output's leading dims of the labels'
    shape (one per sample, or one per token for labels [N, T] and an output [N, T, classes])."""
    candidates = class_id_outputs(outputs, labels) + score_outputs(outputs, labels)
    return max(candidates, key=lambda n: top1_hits(outputs[n], labels)) if candidates else None  # a tie: the first


def class_id_outputs(outputs: dict[str, np.ndarray], labels: np.ndarray) -> list[str]:
    """The integer outputs that hold one class id per label (top1_output's other candidates)."""
    return [name for name, array in outputs.items()
            if np.issubdtype(np.asarray(array).dtype, np.integer) and label_classes(array, labels) == 1]


def score_outputs(outputs: dict[str, np.ndarray], labels: np.ndarray) -> list[str]:
    """The float outputs that hold more than one class score per label (top1_output's candidates)."""
    return [name for name, array in outputs.items()
            if np.issubdtype(np.asarray(array).dtype, np.floating) and (label_classes(array, labels) or 0) > 1]


def label_classes(output: np.ndarray, labels: np.ndarray) -> int | None:
    """How many values ``output`` holds per label (its classes for scores, 1 for class ids); None
    where its leading dims are not the labels' shape, or more than one axis is left after them (a
    map [C, H, W] against one label per sample: which axis holds the classes is not known, and an
    argmax over the flattened map would score nonsense)."""
    shape, lead = np.shape(output), np.shape(labels)
    if tuple(shape[:len(lead)]) != tuple(lead):
        return None
    rest = [d for d in shape[len(lead):] if d != 1]
    return None if len(rest) > 1 else int(np.prod(rest, dtype=np.int64))


def top1_hits(output: np.ndarray, labels: np.ndarray) -> int:
    """How many labels ``output`` gets right: class ids compared as they are, scores by their argmax."""
    output, labels = np.asarray(output), np.asarray(labels)
    if np.issubdtype(output.dtype, np.integer):
        predicted = output.reshape(labels.shape)
    else:
        predicted = np.argmax(output.reshape(*labels.shape, -1), axis=-1)
    return int((predicted == labels).sum())


def top1_accuracy(output: np.ndarray, labels: np.ndarray) -> float:
    """Percentage of labels the output gets right (see top1_hits; the output is top1_output's choice)."""
    return 100.0 * top1_hits(output, labels) / max(np.size(labels), 1)


def run_batched(run, inputs: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """Run ``run(inputs) -> outputs`` over the whole set in batches and concatenate."""
    count = len(next(iter(inputs.values())))
    pieces: dict[str, list[np.ndarray]] = {}
    for start in range(0, count, max(batch, 1)):
        chunk = {k: v[start:start + batch] for k, v in inputs.items()}
        for name, value in run(chunk).items():
            pieces.setdefault(name, []).append(value)
    return {k: np.concatenate(v) for k, v in pieces.items()}
