"""Checks of the user's data (data.validation with its labels, data.calibration) against the model, at
stage load (stage compress uses data_fault and classes_outside for data.training): a wrong array is
refused there, naming the file and array, rather than failing a later stage with the runtime's own
words (an onnxruntime Gather error) or passing silently (labels out of the classes scoring 0%, a
calibrator fed invalid ids).

Usage::

    outputs = run_on_data(runner, arrays, "data.validation", path, spec)    # UserInputError names the array
    ctx.reference.top1_output = check_labels(ctx, path, labels, outputs)   # None: no output to score
    calibration_warning(spec, path, count)                                 # "" or the warning
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from builder.accuracy.tensors import class_id_outputs, label_classes, score_outputs, top1_accuracy, top1_output
from builder.core.errors import UserInputError

# fewer calibration samples than this give unreliable INT8 ranges (one batch of outliers decides them)
MIN_CALIBRATION = 32
RECOMMENDED_CALIBRATION = 100
CHECK_BATCHES = 4  # calibration batches run through the model at load: a wrong file shows in the first ones


def spec_input(field: str, file: str, tensor, array: np.ndarray, batching: bool) -> np.ndarray:
    """``array`` (of ``field``'s ``file``) checked against the spec's input ``tensor``, cast to its dtype:
    per-sample shape (-1 takes any size), and a dtype of the same kind (float ids would be truncated
    without a word); UserInputError naming the array otherwise."""
    per_sample = list(array.shape[1:]) if batching else list(array.shape)
    if len(per_sample) != len(tensor.shape) or any(s not in (-1, a) for s, a in zip(tensor.shape, per_sample)):
        raise UserInputError(f"{field}: {file}['{tensor.name}'] has per-sample shape {per_sample}, the spec says "
                             f"{tensor.shape}")
    if not np.can_cast(array.dtype, np.dtype(tensor.dtype), casting="same_kind"):
        raise UserInputError(f"{field}: {file}['{tensor.name}'] is {array.dtype}, the spec says {tensor.dtype}; "
                             f"save it as {tensor.dtype}")
    return array.astype(tensor.dtype)


def run_on_data(runner: Callable, arrays: dict[str, np.ndarray], field: str, path: Path, spec,
                limit: int | None = None) -> dict[str, np.ndarray] | None:
    """The model's outputs on ``arrays`` (batches of max_batch_size; the first ``limit`` samples when
    given). The model already ran on generated inputs of the spec's shapes, so a failure here is the
    data's: refused naming the file and the arrays most likely at fault. None where the batches'
    outputs do not concatenate (no batch dimension: stage load's own check says so)."""
    if limit is not None and spec.batching:
        arrays = {k: v[:limit] for k, v in arrays.items()}
    count = len(next(iter(arrays.values()))) if spec.batching else 1
    step = spec.max_batch_size if spec.batching else 1
    pieces: dict[str, list[np.ndarray]] = {}
    for start in range(0, count, step):
        chunk = {k: v[start:start + step] for k, v in arrays.items()} if spec.batching else arrays
        try:
            outputs = runner(chunk)
        except UserInputError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the model on this data
            raise data_fault(field, path.name, chunk, spec, exc) from None
        for name, value in outputs.items():
            pieces.setdefault(name, []).append(value)
    if not spec.batching:
        return {k: v[0] for k, v in pieces.items()}
    try:
        return {k: np.concatenate(v) for k, v in pieces.items()}
    except ValueError:
        return None


def data_fault(field: str, where: str, arrays: dict[str, np.ndarray], spec, exc: Exception) -> UserInputError:
    """The error for a model that fails on the user's arrays but ran on generated inputs of the spec's
    shapes: names ``field['<input>']`` (the integer inputs outside the generated range when there are
    such, else every input) and the model's own words."""
    detail = " ".join(str(exc).split())[:300] or type(exc).__name__
    suspects = _suspects(arrays, spec)
    named = ", ".join(f"{field}['{name}']" for name in (suspects or [t.name for t in spec.inputs]))
    why = "; ".join(suspects.values())
    return UserInputError(
        f"{named}: the model fails on {where} ({detail}) but runs on generated inputs of the spec's shapes, so "
        f"the data is at fault{': ' + why if why else ''}. Fix the values in {where} (integer ids within the "
        "model's vocabulary, which inputs[].value_range states)")


def _suspects(arrays: dict[str, np.ndarray], spec) -> dict[str, str]:
    """Integer inputs whose values leave the range generated inputs use (value_range, given or probed),
    {name: 'ids holds 0..99, outside [0, 30)'}; the arrays themselves say nothing more."""
    found = {}
    for tensor in spec.inputs:
        array = arrays.get(tensor.name)
        if array is None or not array.size or not np.issubdtype(array.dtype, np.integer):
            continue
        low, high = tensor.value_range or (0, None)
        if array.min() < low or (high is not None and array.max() >= high):
            bounds = f"[{low:g}, {high:g})" if high is not None else f">= {low:g}"
            found[tensor.name] = f"'{tensor.name}' holds {array.min()}..{array.max()}, outside {bounds}"
    return found


def check_labels(ctx, path: Path, labels: np.ndarray, outputs: dict[str, np.ndarray]) -> str | None:
    """The output ``labels`` score (tensors.top1_output), after checking them against it: their shape
    (one class id per sample, or per position of the output's class axis) and their range (0 ..
    classes - 1). None, said in the progress and the notes, when no output holds classes."""
    spec = ctx.spec
    where = f"data.validation['labels'] ({path.name})"
    labels = np.asarray(labels)
    per_sample = list(labels.shape[1:] if spec.batching else labels.shape)
    shapes = ", ".join(f"{name} {list(a.shape[1:] if spec.batching else a.shape)} {a.dtype}"
                       for name, a in outputs.items())
    name = top1_output(outputs, labels)
    if name is None and per_sample:
        raise UserInputError(
            f"{where} has per-sample shape {per_sample}, which no output's fits (outputs per sample: {shapes}); "
            "give one class id per sample (shape [samples]), or one per position of an output's class axis "
            "(labels [samples, T] for an output [samples, T, classes])")
    if name is None:
        text = (f"data.validation has labels but no output holds classes (an integer class id per sample, or "
                f"float scores for more than one class; outputs per sample: {shapes}): top-1 accuracy is not "
                "measured and variants are held to the tolerance alone")
        ctx.progress(f"  warning: {text}")
        ctx.notes.append(f"warning: {text}")
        return None
    candidates = score_outputs(outputs, labels)
    scores = name if name in candidates else (candidates[0] if candidates else None)
    every = class_id_outputs(outputs, labels) + candidates
    if len(every) > 1:  # which one is scored decides what the gate guards: say it
        shares = ", ".join(f"'{n}' {top1_accuracy(outputs[n], labels):.1f} %" for n in every)
        fit = "its argmax" if name in candidates else "it"
        text = (f"top-1 accuracy is scored on output '{name}': of the outputs that could hold class ids or scores "
                f"({shares} top-1 in the reference), the labels fit {fit} best")
        ctx.progress(f"  {text}")
        ctx.notes.append(text)
    classes = label_classes(outputs[scores], labels) if scores else None
    outside = classes_outside(labels, classes)
    if outside:
        allowed = f"0..{classes - 1} (output '{scores}' scores {classes} classes)" if classes else "0 or more"
        raise UserInputError(f"{where} holds {outside} outside {allowed}; give each sample's class index")
    return name


def classes_outside(labels: np.ndarray, classes: int | None) -> str:
    """'' when every label is in 0 .. classes - 1 (>= 0 when ``classes`` is None), else which are not:
    '3 class ids (99 at sample 0, -1 at sample 5, ...)'."""
    bad = labels < 0 if classes is None else (labels < 0) | (labels >= classes)
    if not bad.any():
        return ""
    where = np.argwhere(bad)
    shown = ", ".join(f"{labels[tuple(i)]} at " + (f"sample {i[0]}" if len(i) == 1 else str(list(map(int, i))))
                      for i in where[:3])
    return f"{len(where)} class id{'s' if len(where) != 1 else ''} ({shown}{', ...' if len(where) > 3 else ''})"


def check_label_array(path: Path, labels: np.ndarray, samples: int | None) -> None:
    """What needs no model: integer class ids, one entry per sample (``samples``; None: unbatched)."""
    where = f"data.validation['labels'] ({path.name})"
    if not np.issubdtype(labels.dtype, np.integer):
        raise UserInputError(f"{where} is {labels.dtype}; give integer class ids (e.g. labels.astype(np.int64))")
    if samples is not None and (labels.ndim == 0 or len(labels) != samples):
        count = 0 if labels.ndim == 0 else len(labels)
        raise UserInputError(f"{where} has {count} label(s) for {samples} samples; give one per sample, in the "
                             "inputs' order")


def calibration_warning(spec, path: Path, count: int) -> str:
    """'' or why ``count`` calibration samples are too few (INT8 ranges from them are unreliable)."""
    if count >= MIN_CALIBRATION:
        return ""
    return (f"data.calibration ({path.name}) holds {count} sample{'s' if count != 1 else ''}, too few for INT8 "
            f"calibration (ranges from so few are unreliable): give {RECOMMENDED_CALIBRATION} or more "
            f"representative samples (up to quantization.calibration_samples = "
            f"{spec.quantization.calibration_samples} are used)")
