"""data.training for stage compress (builder/stages/compress.py): read, checked against the spec and
the model before any training (errors name data.training and the fix), and the output training
scores (``training_output``: the one the labels score, not merely the first).

Usage::

    arrays = load_training(ctx)        # {input: array[N, ...], "labels": int array[N]}
    task = training_output(ctx)        # "logits" of (emb, logits)
"""

from __future__ import annotations

import importlib
import sys

import numpy as np

from builder.accuracy.data_checks import classes_outside, data_fault, spec_input
from builder.accuracy.tensors import score_outputs, top1_hits
from builder.core.errors import UserInputError


def training_output(ctx) -> str | None:
    """The output training scores with cross-entropy: the one the labels score (stage load,
    ``reference.top1_output``) when it holds float class scores; when that is an integer output
    (class ids: the argmax of the logits beside it), the float scores the labels fit best. Never
    merely the first output: of (embedding, logits) the logits. None when no output holds float
    scores of more than one class per label."""

    ref = ctx.reference
    scored = getattr(ref, "top1_output", None)
    outputs = getattr(ref, "validation_outputs", None) or {}
    if not outputs:  # (nothing to look at: only in a context without validation outputs)
        return scored or ctx.spec.outputs[0].name
    candidates = score_outputs(outputs, np.asarray(ref.labels))
    if scored in candidates:
        return scored
    return max(candidates, key=lambda n: top1_hits(outputs[n], ref.labels)) if candidates else None


def _classes(scores: np.ndarray) -> int:
    """The classes of an output (float scores, one row per sample); 0 for anything else."""
    if not np.issubdtype(scores.dtype, np.floating):
        return 0
    return int(np.prod(scores.shape[1:], dtype=np.int64))


def load_training(ctx) -> dict[str, np.ndarray]:
    """data.training as {input: array[N, ...], 'labels': int array[N]}, checked against the spec."""
    spec, source = ctx.spec, ctx.spec.data.training
    if isinstance(source, str):
        data = _call_training(source, spec.spec_dir)
        where = source
    else:
        try:
            with np.load(source, allow_pickle=False) as archive:
                data = {k: archive[k] for k in archive.files}
        except Exception as exc:  # noqa: BLE001
            raise UserInputError(f"data.training: {source} is not a readable .npz of arrays ({exc})") from None
        where = source.name
    for key in [t.name for t in spec.inputs] + ["labels"]:
        if key not in data:
            raise UserInputError(f"data.training: {where} has no array '{key}' (it has: {', '.join(data) or 'nothing'})"
                                 "; give one array per input, keyed by its name, and 'labels' (class ids)")
    counts = {len(data[t.name]) for t in spec.inputs} | {len(data["labels"])}
    if len(counts) > 1:
        raise UserInputError(f"data.training: {where}: the inputs and labels have different sample counts "
                             f"{sorted(counts)}")
    _check_batch_of_one(ctx, counts.pop(), where)
    for tensor in spec.inputs:
        # the rule of data.validation (stage load)
        data[tensor.name] = spec_input("data.training", where, tensor, np.asarray(data[tensor.name]), batching=True)
    _check_training_labels(ctx, np.asarray(data["labels"]), where)
    _check_model_runs(ctx, data, where)
    return data


def _check_training_labels(ctx, labels: np.ndarray, where: str) -> None:
    """Class ids for cross-entropy: integers, one per sample, within the trained output's classes."""

    if not np.issubdtype(labels.dtype, np.integer):
        raise UserInputError(f"data.training: {where}['labels'] is {labels.dtype}; give integer "
                             "class ids (the task metric is top-1 accuracy)")
    if labels.ndim != 1:
        raise UserInputError(f"data.training: {where}['labels'] has shape {list(labels.shape)}; give one class id "
                             "per sample (shape [samples]): training is cross-entropy on one class per sample")
    reference = getattr(ctx, "reference", None)
    task = training_output(ctx) if reference is not None else ctx.spec.outputs[0].name
    scores = (getattr(reference, "validation_outputs", None) or {}).get(task)
    classes = _classes(scores) if scores is not None else 0
    outside = classes_outside(labels, classes or None)
    if outside:
        allowed = f"0..{classes - 1} (output '{task}' scores {classes} classes)" if classes else "0 or more"
        raise UserInputError(f"data.training: {where}['labels'] holds {outside} outside {allowed}; give each "
                             "sample's class index")


def _check_batch_of_one(ctx, samples: int, where: str) -> None:
    """Refuse what would train on batches of one sample: BatchNorm normalises over the batch and
    torch stops with "Expected more than 1 value per channel when training"; one sample alone teaches
    nothing anyway. Batches are never ragged (train.fine_tune reshuffles instead of a short last
    batch), so each holds min(samples, compression.batch_size)."""
    import torch

    if samples < 2:
        raise UserInputError(f"data.training: {where} holds {samples} sample(s); give at least 2 (hundreds to "
                             "fine-tune well): training takes batches of samples")
    model = getattr(ctx, "model", None)
    batch = ctx.spec.compression.batch_size
    if batch < 2 and isinstance(model, torch.nn.Module):
        norms = [n for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        if norms:
            raise UserInputError(f"compression.batch_size: 1 with BatchNorm in the model ({', '.join(norms[:3])}): "
                                 "BatchNorm cannot train on one sample per batch; set compression.batch_size to 2 "
                                 "or more")


def _check_model_runs(ctx, data: dict[str, np.ndarray], where: str) -> None:
    """Run the model on one training batch, with the samples holding each integer input's smallest and
    largest value (ids past the vocabulary), before any training: a bad array is named here rather
    than failing mid-training (or in a parameter count) with torch's words."""
    import torch


    model, spec = getattr(ctx, "model", None), ctx.spec
    if not isinstance(model, torch.nn.Module):
        return
    rows = set(range(min(len(data["labels"]), spec.compression.batch_size)))
    for tensor in spec.inputs:
        array = data[tensor.name]
        if array.size and np.issubdtype(array.dtype, np.integer):
            flat = array.reshape(len(array), -1)
            rows |= {int(flat.max(1).argmax()), int(flat.min(1).argmin())}
    index = sorted(rows)
    arrays = {t.name: np.ascontiguousarray(data[t.name][index]) for t in spec.inputs}
    try:
        with torch.no_grad():
            model(*[torch.from_numpy(arrays[t.name]) for t in spec.inputs])
    except Exception as exc:  # noqa: BLE001 - any failure of the model on this data
        raise data_fault("data.training", where, arrays, spec, exc) from None


def _call_training(ref: str, folder) -> dict[str, np.ndarray]:
    module_name, attr = ref.split(":")
    sys.path.insert(0, str(folder))
    try:
        factory = getattr(importlib.import_module(module_name), attr, None)
    except ModuleNotFoundError as exc:
        raise UserInputError(f"data.training: cannot import '{module_name}' ({exc}); put "
                             f"{module_name.replace('.', '/')}.py in the spec folder {folder}") from None
    finally:
        sys.path.remove(str(folder))
    if not callable(factory):
        raise UserInputError(f"data.training: '{module_name}' has no callable '{attr}'")
    result = factory()
    if isinstance(result, dict):
        return {k: np.asarray(v) for k, v in result.items()}
    batches = [dict(b) for b in result]
    if not batches:
        raise UserInputError(f"data.training: {ref}() gave no batches")
    return {k: np.concatenate([np.asarray(b[k]) for b in batches]) for k in batches[0]}
