"""The fine-tuning loop every compression variant uses: seeded, budgeted (optimizer steps AND
wall-clock seconds, whichever ends first), reporting steps, loss and accuracy through progress.

Usage::

    data = TrainingData.from_arrays({"image": x, "labels": y}, ["image"])
    budget = Budget(steps=600, seconds=120)
    log = fine_tune(model, data, cross_entropy, budget, steps=200, lr=1e-3, seed=0,
                    evaluate=lambda m: accuracy(m, val, labels, ["image"]), progress=print, label="onnx_pruned")
    log.stopped_by      # "steps" (the run's own share) | "budget steps" | "budget seconds"

A rerun with the same seed and the same data gives the same weights, as long as the step budget
(not the clock) ends training; ``stopped_by`` says which did.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

LOG_EVERY = 4  # progress lines per fine-tuning run
# below this many multiply-accumulates per sample, training runs on one thread: the threads' hand-offs cost
# more than they give, and on a busy host spinning threads slow it 20x (digits: 1 s vs 45 ms a step, load 7 on 2 cores)
SMALL_MODEL_MACS = 20e6


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

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], input_names: list[str]) -> "TrainingData":
        import torch
        return cls([torch.from_numpy(np.ascontiguousarray(arrays[n])) for n in input_names],
                   torch.from_numpy(np.asarray(arrays["labels"]).astype(np.int64)))

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


def first_output(result):
    """The first tensor a model returns (tensor, tuple/list or dict): the task output (logits)."""
    import torch
    if isinstance(result, torch.Tensor):
        return result
    if isinstance(result, dict):
        return first_output(next(iter(result.values())))
    return first_output(result[0])


def cross_entropy(model, inputs: list[Any], labels):
    import torch.nn.functional as F
    logits = first_output(model(*inputs))
    return F.cross_entropy(logits.reshape(len(labels), -1), labels)


def accuracy(model, inputs: dict[str, np.ndarray], labels: np.ndarray, input_names: list[str],
             batch: int = 256) -> float:
    """Top-1 accuracy (%) of a torch model on labelled arrays (eval mode, no gradients)."""
    import torch
    was_training = model.training
    model.eval()
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(labels), batch):
            args = [torch.from_numpy(np.ascontiguousarray(inputs[n][start:start + batch])) for n in input_names]
            logits = first_output(model(*args)).reshape(len(args[0]), -1)
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
