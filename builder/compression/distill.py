"""Knowledge distillation: the user's model (teacher, frozen) teaches a student with soft targets,
``alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE(student, labels)``,
and optionally feature matching: the features entering the student's output layer are projected
(a learned linear map when the widths differ) onto the teacher's and their mean squared error is
added. The soft targets and the labels are those of the task output (``data.output``, the class
scores the labels score); the teacher's other float outputs (an embedding beside the logits) are
matched too (relative squared error, train.TaskLoss), so the student still returns them.

Usage::

    student = import_student("student:build", spec_dir)        # or copy.deepcopy(pruned_model)
    log = distill(teacher, student, data, settings, budget, evaluate=acc_fn, progress=print)
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, Callable

from builder.compression.prune import task_layer
from builder.compression.train import Budget, TaskLoss, TrainingData, TrainLog, fine_tune, model_outputs
from builder.core.errors import UserInputError


def import_student(ref: str, spec_dir: Path):
    """``module:function`` from the spec's folder, called with no arguments: the student nn.Module."""
    import torch

    module_name, attr = ref.split(":")
    sys.path.insert(0, str(spec_dir))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UserInputError(f"compression.student: cannot import '{module_name}' ({exc}); put "
                             f"{module_name.replace('.', '/')}.py in the spec folder {spec_dir}") from None
    finally:
        sys.path.remove(str(spec_dir))
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UserInputError(f"compression.student: '{module_name}' has no callable '{attr}'")
    student = factory()
    if not isinstance(student, torch.nn.Module):
        raise UserInputError(f"compression.student: {ref}() returned {type(student).__name__}, not a torch.nn.Module")
    return student


class _FeatureTap:
    """Captures the input of one layer on every forward call."""

    def __init__(self, layer) -> None:
        self.value = None
        self.handle = layer.register_forward_hook(self._keep)

    def _keep(self, _module, inputs, _output) -> None:
        self.value = inputs[0]

    def close(self) -> None:
        self.handle.remove()


def distill(teacher, student, data: TrainingData, settings, budget: Budget, *, evaluate: Callable[[Any], float],
            progress: Callable[[str], object] | None = None, label: str = "onnx_distilled") -> TrainLog:
    """Train ``student`` (in place) from ``teacher`` within ``budget``. ``settings``:
    builder.spec.compression.CompressionSpec (temperature, alpha, feature_matching, steps, ...)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(settings.seed)
    teacher.eval()
    t, alpha = settings.temperature, settings.alpha
    task = TaskLoss(teacher, data)
    taps, projection = None, None
    if settings.feature_matching:
        example = [x[:2] for x in data.inputs]
        # (found on autograd's graph: before the teacher's weights stop asking for gradients)
        taps = (_FeatureTap(task_layer(teacher, example, data.output)),
                _FeatureTap(task_layer(student, example, data.output)))
        with torch.no_grad():
            teacher(*example)
            student.eval()
            student(*example)
        width_t, width_s = taps[0].value.flatten(1).shape[1], taps[1].value.flatten(1).shape[1]
        projection = torch.nn.Linear(width_s, width_t, bias=False) if width_s != width_t else torch.nn.Identity()
    for p in teacher.parameters():
        p.requires_grad_(False)

    def loss_fn(model, inputs, labels):
        wanted = task.teacher_outputs(inputs)
        target_features = taps[0].value.flatten(1) if taps else None
        returned = model_outputs(model(*inputs))
        soft, logits = (r[task.index].reshape(len(labels), -1) for r in (wanted, returned))
        kd = F.kl_div(F.log_softmax(logits / t, dim=1), F.softmax(soft / t, dim=1), reduction="batchmean") * t * t
        loss = alpha * kd + (1.0 - alpha) * F.cross_entropy(logits, labels) + task.keep_term(returned, wanted)
        if taps:
            loss = loss + F.mse_loss(projection(taps[1].value.flatten(1)), target_features)
        return loss

    try:
        return fine_tune(student, data, loss_fn, budget, steps=settings.steps, lr=settings.learning_rate,
                         seed=settings.seed, batch_size=settings.batch_size, evaluate=evaluate, progress=progress,
                         label=label, extra_parameters=list(projection.parameters()) if projection is not None else ())
    finally:
        if taps:
            for tap in taps:
                tap.close()
        for p in teacher.parameters():
            p.requires_grad_(True)
