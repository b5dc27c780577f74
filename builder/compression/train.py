"""The fine-tuning loop every compression variant uses: seeded, budgeted (optimizer steps AND
wall-clock seconds, whichever ends first), reporting steps, loss and accuracy through progress.

Usage::

    data = TrainingData.from_arrays({"image": x, "labels": y}, ["image"])
    budget = Budget(steps=600, seconds=120)
    loss = TaskLoss(user_model, data)   # cross-entropy on the output the labels score (data.output), plus
                                        # the user's model's other float outputs kept (relative squared error)
    log = fine_tune(model, data, loss, budget, steps=200, lr=1e-3, seed=0,
                    evaluate=lambda m: accuracy(m, val, labels, ["image"], output=data.output), progress=print,
                    label="onnx_pruned")
    log.stopped_by      # "steps" (the run's own share) | "budget steps" | "budget seconds"

A rerun with the same seed and the same data gives the same weights, as long as the step budget
(not the clock) ends training; ``stopped_by`` says which did.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

LOG_EVERY = 4  # progress lines per fine-tuning run
# below this many multiply-accumulates per sample, training runs on one thread: the threads' hand-offs cost
# more than they give, and on a busy host spinning threads slow it 20x (digits: 1 s vs 45 ms a step, load 7 on 2 cores)
SMALL_MODEL_MACS = 20e6


# the weight of the other outputs' relative squared error (TaskLoss): an output at the INT8 tolerance (rel L2
# 0.1, squared 0.01) then costs about what a trained classifier's cross-entropy does (~0.1); at weight 1 the
# pruned digits-sized MLP's embedding drifted to rel L2 0.25 unopposed
KEEP_WEIGHT = 10.0


def training_threads(macs_per_sample: float) -> int | None:
    """1 for a small model, None (torch's default: every core) otherwise."""
    return 1 if macs_per_sample < SMALL_MODEL_MACS else None


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """torch's intra-op threads set to ``threads`` for the block (None: unchanged), then restored."""
    import torch
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Budget:
    """Optimizer steps and seconds one variant may spend, over all its fine-tuning runs together."""

    steps: int
    seconds: float
    clock: Callable[[], float] = time.perf_counter
    used_steps: int = 0
    started: float | None = None

    def start(self) -> None:
        if self.started is None:
            self.started = self.clock()

    @property
    def elapsed(self) -> float:
        return 0.0 if self.started is None else self.clock() - self.started

    def exhausted(self) -> str:
        """'' while there is budget left, else what ran out ('budget steps' | 'budget seconds')."""
        if self.used_steps >= self.steps:
            return "budget steps"
        if self.started is not None and self.elapsed >= self.seconds:
            return "budget seconds"
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "seconds": self.seconds, "used_steps": self.used_steps,
                "used_seconds": round(self.elapsed, 2)}


@dataclass
class TrainingData:
    """The labelled training set as torch tensors, inputs in the spec's order."""

    inputs: list[Any]  # torch tensors, one per model input, [N, ...]
    labels: Any  # torch int64 [N]
    # the position, among the tensors the model returns (the spec's outputs), of the class scores the labels
    # score: the task output, which is not always the first ((embedding, logits))
    output: int = 0

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], input_names: list[str], output: int = 0) -> "TrainingData":
        import torch
        return cls([torch.from_numpy(np.ascontiguousarray(arrays[n])) for n in input_names],
                   torch.from_numpy(np.asarray(arrays["labels"]).astype(np.int64)), output)

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class TrainLog:
    steps: int = 0
    stopped_by: str = ""
    losses: list[float] = field(default_factory=list)
    accuracy: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "stopped_by": self.stopped_by,
                "last_loss": round(self.losses[-1], 5) if self.losses else None,
                "accuracy": None if self.accuracy is None else round(self.accuracy, 3)}


def model_outputs(result) -> list[Any]:
    """The tensors a model returns (tensor, tuple/list, dict, nested), flattened in the order
    builder.model.runtime.flatten_outputs gives them the spec's output names."""
    import torch
    if isinstance(result, torch.Tensor):
        return [result]
    if result is None:
        return []
    items = result.values() if isinstance(result, Mapping) else result
    return [t for item in items for t in model_outputs(item)]


def task_output(result, index: int = 0):
    """The tensor at ``index`` among those a model returns: the class scores the labels score."""
    outputs = model_outputs(result)
    if index >= len(outputs):
        raise ValueError(f"the model returns {len(outputs)} tensor(s); the task output is number {index + 1}")
    return outputs[index]


def cross_entropy(model, inputs: list[Any], labels, index: int = 0):
    """Cross-entropy of the output at ``index`` (class scores) against one class id per sample."""
    import torch.nn.functional as F
    logits = task_output(model(*inputs), index)
    return F.cross_entropy(logits.reshape(len(labels), -1), labels)


def relative_squared_error(got, wanted):
    """||got - wanted||^2 / ||wanted||^2 over the batch: the square of the rel L2 stage verify measures,
    so an output's term weighs the same whatever its scale."""
    return (got - wanted).pow(2).sum() / wanted.pow(2).sum().clamp(min=1e-12)


class TaskLoss:
    """``loss_fn`` for fine_tune: cross-entropy on the task output (``data.output``) against the
    labels, plus, for every OTHER float output of the user's model (an embedding beside the logits),
    its relative squared error to what ``teacher`` (the user's model, frozen) returns for the same
    batch. The labels say nothing about those outputs: without the term, fine-tuning for the task
    output would change them unseen, and the served variant would return a different embedding
    under the same name. Integer outputs (counts, class ids) cannot be trained; verify judges them."""

    def __init__(self, teacher, data: TrainingData) -> None:
        import torch

        self.index, self.teacher = data.output, teacher
        teacher.eval()
        with torch.no_grad():
            returned = model_outputs(teacher(*[x[:2] for x in data.inputs]))
        task_output(returned, self.index)  # the index exists
        self.kept = [i for i, t in enumerate(returned) if i != self.index and t.is_floating_point()]

    def __call__(self, model, inputs: list[Any], labels):
        import torch.nn.functional as F

        returned = model_outputs(model(*inputs))
        loss = F.cross_entropy(returned[self.index].reshape(len(labels), -1), labels)
        if self.kept:
            loss = loss + self.keep_term(returned, self.teacher_outputs(inputs))
        return loss

    def teacher_outputs(self, inputs: list[Any]) -> list[Any]:
        import torch
        with torch.no_grad():
            return model_outputs(self.teacher(*inputs))

    def keep_term(self, returned: list[Any], wanted: list[Any]):
        """The sum of the kept outputs' relative squared errors (0 when there are none)."""
        return KEEP_WEIGHT * sum((relative_squared_error(returned[i], wanted[i]) for i in self.kept), 0.0)


def accuracy(model, inputs: dict[str, np.ndarray], labels: np.ndarray, input_names: list[str],
             batch: int = 256, output: int = 0) -> float:
    """Top-1 accuracy (%) of a torch model's output number ``output`` on labelled arrays (eval mode, no
    gradients)."""
    import torch
    was_training = model.training
    model.eval()
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(labels), batch):
            args = [torch.from_numpy(np.ascontiguousarray(inputs[n][start:start + batch])) for n in input_names]
            logits = task_output(model(*args), output).reshape(len(args[0]), -1)
            correct += int((logits.argmax(1).numpy() == labels[start:start + batch]).sum())
    model.train(was_training)
    return 100.0 * correct / max(len(labels), 1)


def fine_tune(model, data: TrainingData, loss_fn: Callable, budget: Budget, *, steps: int, lr: float, seed: int,
              batch_size: int = 64, evaluate: Callable[[Any], float] | None = None,
              progress: Callable[[str], object] | None = None, label: str = "", extra_parameters=()) -> TrainLog:
    """At most ``steps`` Adam steps of ``loss_fn(model, inputs, labels)`` on shuffled batches (the
    order drawn from ``seed``), fewer when ``budget`` runs out; ``model`` is left in eval mode."""
    import torch

    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad] + list(extra_parameters)
    optimizer = torch.optim.Adam(params, lr=lr)
    log = TrainLog()
    budget.start()
    every = max(steps // LOG_EVERY, 1)
    model.train()
    order = torch.randperm(len(data), generator=generator)
    cursor = 0
    while True:
        if log.steps >= steps:
            log.stopped_by = "steps"
            break
        log.stopped_by = budget.exhausted()
        if log.stopped_by:
            break
        if cursor + batch_size > len(order) and cursor > 0:
            order, cursor = torch.randperm(len(data), generator=generator), 0
        index = order[cursor:cursor + batch_size]
        cursor += batch_size
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, [x[index] for x in data.inputs], data.labels[index])
        loss.backward()
        optimizer.step()
        log.steps += 1
        budget.used_steps += 1
        log.losses.append(float(loss.detach()))
        if progress is not None and (log.steps % every == 0 or log.steps == steps):
            progress(f"    {label}: step {log.steps}/{steps}, loss {np.mean(log.losses[-every:]):.4f}, "
                     f"{budget.elapsed:.1f}/{budget.seconds:g} s")
    model.eval()
    if evaluate is not None:
        log.accuracy = evaluate(model)
        if progress is not None:
            progress(f"    {label}: {log.steps} steps ({log.stopped_by}), accuracy {log.accuracy:.2f}%")
    return log
