"""Structured channel pruning with torch-pruning's dependency graph: removing a conv's output
channels also removes the matching input channels of every layer that reads them, through residual
additions and concatenations alike, so the pruned model is a smaller dense model (really faster,
unlike a mask).

Iterative: ``prune_steps`` equal steps toward ``prune_ratio`` (fraction of channels removed per
layer), each followed by fine-tuning; the largest ratio whose accuracy stays within the budget is
kept.

Usage::

    result = prune_iteratively(model, data, settings, budget, evaluate=acc_fn, floor=reference_acc - 1.0)
    result.model, result.ratio, result.history   # the kept model, its ratio, one row per step
    count_params_macs(result.model, example)     # (params, MACs) via tp.utils.count_ops_and_params
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

from builder.compression.train import Budget, TrainingData, cross_entropy, fine_tune


@dataclass
class PruneResult:
    model: Any  # the kept model (None when no step kept the budget: ``last`` is the smallest-ratio try)
    ratio: float
    accuracy: float | None
    last: Any = None
    history: list[dict[str, Any]] = field(default_factory=list)
    stopped_by: str = ""


def output_layers(model, example: list[Any]) -> list[Any]:
    """The layers whose channels must stay: every Linear / Conv whose result is returned as is, and
    the last Linear / Conv to run (the task head)."""
    import torch
    from torch import nn

    kinds = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    order: list[tuple[Any, Any]] = []
    hooks = [m.register_forward_hook(lambda mod, _inp, out: order.append((mod, out)))
             for m in model.modules() if isinstance(m, kinds)]
    try:
        with torch.no_grad():
            result = model(*example)
    finally:
        for hook in hooks:
            hook.remove()
    returned = _tensors(result)
    layers = [mod for mod, out in order if any(out is r for r in returned)]
    if order and order[-1][0] not in layers:
        layers.append(order[-1][0])
    return layers


def _tensors(result) -> list[Any]:
    import torch
    if isinstance(result, torch.Tensor):
        return [result]
    items = result.values() if isinstance(result, dict) else result
    return [t for item in items for t in _tensors(item)]


def count_params_macs(model, example: list[Any]) -> tuple[int, int]:
    """(parameters, multiply-accumulates per sample) by torch-pruning's counter (``example``: any batch)."""
    import torch
    import torch_pruning as tp
    with torch.no_grad():
        macs, params = tp.utils.count_ops_and_params(model, tuple(example) if len(example) > 1 else example[0])
    return int(params), int(macs)


def _pruner(work, example: list[Any], ratio: float, steps: int):
    import torch_pruning as tp
    return tp.pruner.MetaPruner(
        work, tuple(example) if len(example) > 1 else example[0],
        importance=tp.importance.GroupMagnitudeImportance(p=2),
        pruning_ratio=ratio, iterative_steps=steps, ignored_layers=output_layers(work, example))


def check_prunable(model, example: list[Any], ratio: float) -> None:
    """Raise ValueError when pruning a copy at ``ratio`` removes no parameter: torch-pruning removes
    channels of Conv / Linear layers (and what follows them), never of an RNN or attention's inner
    projections, nor of the output layers; a model of those alone would be fine-tuned and reported
    "pruned" unchanged."""
    probe = copy.deepcopy(model).eval()
    _pruner(probe, example, ratio, 1).step()
    if _params(probe) < _params(model):
        return
    kinds = sorted({type(m).__name__ for m in model.modules()
                    if any(True for _ in m.parameters(recurse=False))})
    raise ValueError(f"nothing prunable in {', '.join(kinds)}: structured pruning removes channels of "
                     "Conv / Linear layers other than the output layers")


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def prune_iteratively(model, data: TrainingData, settings, budget: Budget, *, evaluate: Callable[[Any], float],
                      floor: float, progress: Callable[[str], object] | None = None,
                      label: str = "onnx_pruned") -> PruneResult:
    """Prune a COPY of ``model`` in ``settings.prune_steps`` steps toward ``settings.prune_ratio``,
    fine-tuning after each (cross-entropy on ``data``); stop at the first step whose accuracy falls
    below ``floor`` or when ``budget`` is spent. ``settings``: builder.spec_compression.CompressionSpec."""
    import torch

    torch.manual_seed(settings.seed)
    example = [x[:2] for x in data.inputs]
    check_prunable(model, example, settings.prune_ratio)
    work = copy.deepcopy(model).eval()
    pruner = _pruner(work, example, settings.prune_ratio, settings.prune_steps)
    steps_each = max(settings.steps // settings.prune_steps, 1)
    result = PruneResult(model=None, ratio=0.0, accuracy=None)
    for step in range(1, settings.prune_steps + 1):
        pruner.step()
        ratio = settings.prune_ratio * step / settings.prune_steps
        log = fine_tune(work, data, cross_entropy, budget, steps=steps_each, lr=settings.learning_rate,
                        seed=settings.seed + step, batch_size=settings.batch_size, evaluate=evaluate,
                        progress=progress, label=f"{label} ratio {ratio:.2f}")
        params, macs = count_params_macs(work, example)
        kept = log.accuracy is not None and log.accuracy >= floor
        result.history.append({"ratio": round(ratio, 4), "accuracy": log.accuracy, "params": params, "macs": macs,
                               "steps": log.steps, "stopped_by": log.stopped_by, "kept": kept})
        if not kept:
            result.stopped_by = f"accuracy {log.accuracy:.2f}% below {floor:.2f}% at ratio {ratio:.2f}"
            if result.model is None:
                result.last, result.ratio, result.accuracy = work, ratio, log.accuracy
            break
        result.model, result.ratio, result.accuracy = copy.deepcopy(work), ratio, log.accuracy
        if log.stopped_by.startswith("budget"):
            result.stopped_by = f"{log.stopped_by} spent at ratio {ratio:.2f}"
            break
    else:
        result.stopped_by = f"target ratio {settings.prune_ratio:g} reached"
    return result
