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

from builder.compression.train import Budget, TaskLoss, TrainingData, fine_tune, model_outputs


@dataclass
class PruneResult:
    model: Any  # the kept model (None when no step kept the budget: ``last`` is the smallest-ratio try)
    ratio: float
    accuracy: float | None
    last: Any = None
    history: list[dict[str, Any]] = field(default_factory=list)
    stopped_by: str = ""


_LAYERS = ("Linear", "Conv1d", "Conv2d", "Conv3d")  # torch.nn kinds whose output channels torch-pruning removes


def output_layers(model, example: list[Any]) -> list[Any]:
    """The layers whose channels must stay, in the order they run: every Linear / Conv whose output
    reaches a returned tensor without passing through another Linear / Conv - through activations,
    normalisation, residual additions, pooling, flattening - (removing its channels would change
    that tensor's shape: ``relu(fc(h))`` returned as an embedding), and the last Linear / Conv to run
    (the task head). Found on autograd's graph of one forward pass: it records every op, whatever
    the Python does (torch.fx would have to trace the model, which data-dependent code prevents)."""
    from torch import nn

    kinds = tuple(getattr(nn, k) for k in _LAYERS)
    trace = _Trace(model, example, kinds)
    layers = trace.nearest(trace.returned)
    last = trace.order[-1][0] if trace.order else None
    if last is not None and last not in layers:
        layers.append(last)
    ran = [m for m, _ in trace.order]
    return sorted(layers, key=ran.index)


def task_layer(model, example: list[Any], index: int = 0):
    """The last Linear / Conv on the way to the returned tensor number ``index`` (the task head, whose
    input feature matching taps); the last layer to run when no path is found."""
    from torch import nn

    trace = _Trace(model, example, tuple(getattr(nn, k) for k in _LAYERS))
    node = getattr(trace.outputs[index], "grad_fn", None) if index < len(trace.outputs) else None
    ran = [m for m, _ in trace.order]
    layers = trace.nearest([node]) if node is not None else []
    return max(layers, key=ran.index) if layers else (ran[-1] if ran else None)


def rnn_layers(model, example: list[Any]) -> list[Any]:
    """The recurrent modules (nn.RNN / LSTM / GRU), their parameters, and the layers whose output
    feeds them (Linear / Conv / Embedding, through shape-preserving ops): never pruned. torch-pruning
    handles only LSTM, and its input-channel removal fails on real models ("index out of range in
    self" for Embedding -> LSTM); GRU and RNN weights it would cut as unknown parameters."""
    from torch import nn

    rnns = [m for m in model.modules() if isinstance(m, nn.RNNBase)]
    if not rnns:
        return []
    kinds = tuple(getattr(nn, k) for k in _LAYERS) + (nn.Embedding,)
    trace = _Trace(model, example, kinds, taps=rnns)
    feeding = trace.nearest(trace.tapped)
    return rnns + [p for m in rnns for p in m.parameters()] + feeding


class _Trace:
    """One forward pass with autograd recording: each layer's output node, the returned tensors'
    nodes, and the input nodes of the ``taps`` modules."""

    def __init__(self, model, example: list[Any], kinds: tuple, taps=()) -> None:
        import torch


        self.order: list[tuple[Any, Any]] = []  # (module, the grad node of its output), in the order they ran
        self.tapped: list[Any] = []
        self._by_node: dict[Any, Any] = {}
        self._plain: list[tuple[Any, Any]] = []  # (module, output tensor) where no node exists (frozen weights)

        def keep(module, _inputs, output) -> None:
            tensor = output[0] if isinstance(output, (tuple, list)) else output
            node = getattr(tensor, "grad_fn", None)
            self.order.append((module, node))
            if node is not None:
                self._by_node[node] = module  # (holding the node keeps its Python object, so `is` holds)
            else:
                self._plain.append((module, tensor))

        def tap(_module, inputs) -> None:
            first = inputs[0] if inputs else None
            if not isinstance(first, torch.Tensor):
                first = getattr(first, "data", None)  # a PackedSequence
            if getattr(first, "grad_fn", None) is not None:
                self.tapped.append(first.grad_fn)

        hooks = [m.register_forward_hook(keep) for m in model.modules() if isinstance(m, kinds)]
        hooks += [m.register_forward_pre_hook(tap) for m in taps]
        was_training = model.training
        model.eval()
        try:
            with torch.enable_grad():
                result = model(*example)
        finally:
            model.train(was_training)
            for hook in hooks:
                hook.remove()
        self.outputs = returned = model_outputs(result)
        self.returned = [t.grad_fn for t in returned if t.grad_fn is not None]
        # a layer whose output has no node (weights that need no gradient) is kept when returned as is
        self._returned_plain = [m for m, out in self._plain if any(out is t for t in returned)]

    def nearest(self, nodes: list[Any]) -> list[Any]:
        """The layers met first walking back from ``nodes`` along every path (a layer's node ends its path)."""
        found: list[Any] = list(self._returned_plain) if nodes is self.returned else []
        seen: dict[int, Any] = {}  # id -> node: holding each node keeps its Python object (and id) alive
        stack = list(nodes)
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen[id(node)] = node
            module = self._by_node.get(node)
            if module is not None:
                if module not in found:
                    found.append(module)
                continue
            stack.extend(child for child, _ in node.next_functions)
        return found


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
        pruning_ratio=ratio, iterative_steps=steps,
        ignored_layers=output_layers(work, example) + rnn_layers(work, example))


def check_prunable(model, example: list[Any], ratio: float) -> None:
    """Raise ValueError when pruning a copy at ``ratio`` removes no parameter: torch-pruning removes
    channels of Conv / Linear layers (and what follows them), never of an RNN (nor the layers feeding
    one) or attention's inner projections, nor of the output layers; a model of those alone would be
    fine-tuned and reported "pruned" unchanged. Also when the copy returns a tensor of another shape
    (a path to a returned tensor that output_layers missed): the variant would serve other shapes."""
    import torch


    probe = copy.deepcopy(model).eval()
    _pruner(probe, example, ratio, 1).step()
    with torch.no_grad():
        before = [list(t.shape[1:]) for t in model_outputs(model(*example))]
        after = [list(t.shape[1:]) for t in model_outputs(probe(*example))]
    changed = [f"number {i + 1} from {a} to {b}" for i, (a, b) in enumerate(zip(before, after)) if a != b]
    if changed or len(before) != len(after):
        raise ValueError(f"structured pruning would change the returned tensor(s) {', '.join(changed)} per sample "
                         "(a layer reaches an output by a path the pruner cannot see); this model cannot be "
                         "pruned: give onnx_distilled a student of your own (compression.student)")
    if _params(probe) < _params(model):
        return
    kinds = sorted({type(m).__name__ for m in model.modules()
                    if any(True for _ in m.parameters(recurse=False))})
    raise ValueError(f"nothing prunable in {', '.join(kinds)}: structured pruning removes channels of "
                     "Conv / Linear layers other than the output layers and those feeding an RNN (RNN / LSTM / GRU "
                     "are never pruned)")


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def prune_iteratively(model, data: TrainingData, settings, budget: Budget, *, evaluate: Callable[[Any], float],
                      floor: float, progress: Callable[[str], object] | None = None,
                      label: str = "onnx_pruned", judge: Callable[[Any], str] | None = None) -> PruneResult:
    """Prune a COPY of ``model`` in ``settings.prune_steps`` steps toward ``settings.prune_ratio``,
    fine-tuning after each (train.TaskLoss: cross-entropy on ``data``'s task output, ``model``'s other
    float outputs kept); stop at the first step whose accuracy falls below ``floor``, or that
    ``judge`` faults ('' or why: the outputs the labels do not score moved too far), or when
    ``budget`` is spent. ``settings``: builder.spec.compression.CompressionSpec."""
    import torch

    torch.manual_seed(settings.seed)
    example = [x[:2] for x in data.inputs]
    check_prunable(model, example, settings.prune_ratio)
    work = copy.deepcopy(model).eval()
    loss = TaskLoss(model, data)
    pruner = _pruner(work, example, settings.prune_ratio, settings.prune_steps)
    steps_each = max(settings.steps // settings.prune_steps, 1)
    result = PruneResult(model=None, ratio=0.0, accuracy=None)
    for step in range(1, settings.prune_steps + 1):
        pruner.step()
        ratio = settings.prune_ratio * step / settings.prune_steps
        log = fine_tune(work, data, loss, budget, steps=steps_each, lr=settings.learning_rate,
                        seed=settings.seed + step, batch_size=settings.batch_size, evaluate=evaluate,
                        progress=progress, label=f"{label} ratio {ratio:.2f}")
        params, macs = count_params_macs(work, example)
        kept = log.accuracy is not None and log.accuracy >= floor
        fault = judge(work) if kept and judge is not None else ""
        kept = kept and not fault
        result.history.append({"ratio": round(ratio, 4), "accuracy": log.accuracy, "params": params, "macs": macs,
                               "steps": log.steps, "stopped_by": log.stopped_by, "kept": kept,
                               **({"fault": fault} if fault else {})})
        if not kept:
            result.stopped_by = (f"{fault} at ratio {ratio:.2f}" if fault else
                                 f"accuracy {log.accuracy:.2f}% below {floor:.2f}% at ratio {ratio:.2f}")
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
