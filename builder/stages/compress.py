"""Stage `compress`: the only stage that trains. Training-time compression of the user's PyTorch
model, fine-tuned on ``data.training`` within the ``compression:`` budget (builder/spec_compression.py):

- ``onnx_pruned``: structured channel pruning (torch-pruning's dependency graph, so residual and
  concatenated branches stay consistent), iterative prune + fine-tune toward
  ``compression.prune_ratio``, keeping the largest ratio whose accuracy is within
  ``verify.max_accuracy_drop`` (builder/compression/prune.py).
- ``onnx_distilled``: the user's model teaches a student (the pruned model by default, or
  ``compression.student``) with soft targets, temperature and alpha, optional feature matching
  (builder/compression/distill.py).
- ``onnx_qat_int8``: quantisation-aware fine-tuning with fake-quant, exported as QDQ ONNX
  (builder/compression/qat.py); compare it with the post-training ``onnx_int8_static``.

They change the function by design: stage verify holds them to task accuracy on the labelled
validation data (``verified_by: task_accuracy``), not to closeness with the reference, and records
their own outputs, which their published reference.npz holds for ``check``. They are tried only when
asked for (``--variants onnx,onnx_pruned,...``): they train, so the default build stays fast.
Unstructured (mask) pruning is not offered: zeros in a dense weight make no dense kernel faster.
"""

from __future__ import annotations

import copy
import importlib
import shutil
import sys

import numpy as np

from builder import onnx_tools
from builder.data_checks import spec_input
from builder.errors import UserInputError
from builder.stages.base import BuildContext, StageResult, Variant
from builder.stages.common import export_module_onnx, make_each, not_made
from builder.tensors import top1_accuracy
from builder.variants import register_variant

STAGE = "compress"
VERIFIED_BY = "task_accuracy"


class NotApplicable(Exception):
    """The variants cannot be made for this spec (recorded as SKIPPED with the reason)."""


def why_not(ctx: BuildContext) -> str:
    """'' when the compression variants can be made, else the reason (naming the spec key to set)."""
    spec = ctx.spec
    if spec.data.training is None:
        return ("needs labelled training data: set data.training (an .npz with one array per input and a "
                "'labels' array, or 'module:function' returning them)")
    if spec.source.kind != "module" or not hasattr(ctx.model, "parameters"):
        return f"needs a trainable PyTorch model (source.module); the source is {spec.source.kind}"
    if not spec.batching:
        return "needs a batch dimension (max_batch_size > 0) to train in batches"
    if ctx.reference is None or ctx.reference.labels is None:
        return ("needs labelled validation data to verify by task accuracy: data.validation with a 'labels' "
                "array")
    first = spec.outputs[0].name
    scores = (getattr(ctx.reference, "validation_outputs", None) or {}).get(first)
    if scores is not None and (np.ndim(ctx.reference.labels) != 1 or _classes(scores) < 2):
        # training is cross-entropy on the first output against one class id per sample
        return (f"trains on the first output, which must be float class scores with one class id per sample in "
                f"data.validation['labels']; '{first}' is {scores.dtype} {list(scores.shape[1:])} per sample and "
                f"the labels {list(np.shape(ctx.reference.labels)[1:])} (return the logits first)")
    return ""


def _classes(scores: np.ndarray) -> int:
    """The classes of a first output (float scores, one row per sample); 0 for anything else."""
    if not np.issubdtype(scores.dtype, np.floating):
        return 0
    return int(np.prod(scores.shape[1:], dtype=np.int64))


def load_training(ctx: BuildContext) -> dict[str, np.ndarray]:
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
    for tensor in spec.inputs:
        # the rule of data.validation (stage load)
        data[tensor.name] = spec_input("data.training", where, tensor, np.asarray(data[tensor.name]), batching=True)
    _check_training_labels(ctx, np.asarray(data["labels"]), where)
    _check_model_runs(ctx, data, where)
    return data


def _check_training_labels(ctx: BuildContext, labels: np.ndarray, where: str) -> None:
    """Class ids for cross-entropy: integers, one per sample, within the first output's classes."""
    from builder.data_checks import classes_outside

    if not np.issubdtype(labels.dtype, np.integer):
        raise UserInputError(f"data.training: {where}['labels'] is {labels.dtype}; give integer "
                             "class ids (the task metric is top-1 accuracy)")
    if labels.ndim != 1:
        raise UserInputError(f"data.training: {where}['labels'] has shape {list(labels.shape)}; give one class id "
                             "per sample (shape [samples]): training is cross-entropy on one class per sample")
    first = ctx.spec.outputs[0].name
    scores = (getattr(getattr(ctx, "reference", None), "validation_outputs", None) or {}).get(first)
    classes = _classes(scores) if scores is not None else 0
    outside = classes_outside(labels, classes or None)
    if outside:
        allowed = f"0..{classes - 1} (output '{first}' scores {classes} classes)" if classes else "0 or more"
        raise UserInputError(f"data.training: {where}['labels'] holds {outside} outside {allowed}; give each "
                             "sample's class index")


def _check_model_runs(ctx: BuildContext, data: dict[str, np.ndarray], where: str) -> None:
    """Run the model on one training batch, with the samples holding each integer input's smallest and
    largest value (ids past the vocabulary), before any training: a bad array is named here rather
    than failing mid-training (or in a parameter count) with torch's words."""
    import torch

    from builder.compression.train import first_output
    from builder.data_checks import data_fault

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
            first_output(model(*[torch.from_numpy(arrays[t.name]) for t in spec.inputs]))
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


class _Session:
    """What the three makers share within one build: data, the evaluator, the pruned model."""

    def __init__(self, ctx: BuildContext) -> None:
        from builder.compression.prune import count_params_macs
        from builder.compression.train import TrainingData, accuracy

        spec, ref = ctx.spec, ctx.reference
        self.ctx = ctx
        self.settings = spec.compression
        self.names = [t.name for t in spec.inputs]
        self.data = TrainingData.from_arrays(load_training(ctx), self.names)
        # as stage verify scores (the labels' output), while training uses the first output (why_not)
        self.reference_accuracy = top1_accuracy(ref.validation_outputs[ref.top1_output], ref.labels)
        self.floor = self.reference_accuracy - spec.verify.max_accuracy_drop
        self.evaluate = lambda model: accuracy(model, ref.validation_inputs, ref.labels, self.names,
                                               spec.max_batch_size)
        self.example = [x[:2] for x in self.data.inputs]
        self.count = lambda model: count_params_macs(model, self.example)
        self.pruned = None  # PruneResult, made once

    def budget(self):
        from builder.compression.train import Budget
        return Budget(self.settings.steps, self.settings.seconds)

    def prune(self):
        if self.pruned is None:
            from builder.compression.prune import prune_iteratively
            self.ctx.progress(f"  pruning toward ratio {self.settings.prune_ratio:g} in {self.settings.prune_steps} "
                              f"steps (accuracy floor {self.floor:.2f}%) ...")
            budget = self.budget()
            self.pruned = prune_iteratively(self.ctx.model, self.data, self.settings, budget,
                                            evaluate=self.evaluate, floor=self.floor, progress=self.ctx.progress)
            self.pruned.budget = budget.to_dict()
        return self.pruned

    def stats(self, model) -> dict:
        """Parameters, and multiply-accumulates / FLOPs (2 x MACs) per sample (torch-pruning counts per sample)."""
        params, macs = self.count(model)
        return {"params": params, "macs": macs, "flops": 2 * macs}


def _export(s: _Session, model, name: str, precision: str, record: dict, notes: list[str]) -> Variant:
    out_dir = s.ctx.workdir / name
    out_dir.mkdir(parents=True, exist_ok=True)
    exporter, opset = export_module_onnx(model, s.ctx.spec, out_dir / "model.onnx")
    variant = Variant(name, "onnx", precision, out_dir / "model.onnx", exporter=exporter, opset=opset,
                      verified_by=VERIFIED_BY, compression=record, notes=notes)
    return s.ctx.add_variant(variant)


@register_variant("onnx_pruned", format="onnx", precision="fp32", stage=STAGE, targets=(),
                  description="ONNX FP32, structured channel pruning + fine-tuning (data.training; verified by "
                              "task accuracy)")
def make_pruned(s: _Session) -> str:
    result = s.prune()
    model = result.model if result.model is not None else result.last
    record = {"method": "structured channel pruning (torch-pruning DependencyGraph, MetaPruner, L2 group "
                        "magnitude), iterative with fine-tuning", "ratio": result.ratio,
              "target_ratio": s.settings.prune_ratio, "stopped_by": result.stopped_by, "history": result.history,
              "budget": result.budget, "reference_accuracy": s.reference_accuracy, "accuracy": result.accuracy}
    notes = [f"pruned {result.ratio:.2f} of the channels per layer ({result.stopped_by})"]
    if result.model is None:
        notes.append(f"no ratio kept accuracy >= {s.floor:.2f}%: the smallest step ({result.ratio:.2f}) is exported "
                     "for verification to judge")
    variant = _export(s, model, "onnx_pruned", "fp32", record, notes)
    variant.stats = s.stats(model)
    return f"ratio {result.ratio:.2f}, {variant.stats['params']} parameters, accuracy {result.accuracy:.2f}%"


@register_variant("onnx_distilled", format="onnx", precision="fp32", stage=STAGE, targets=(),
                  description="ONNX FP32, a student distilled from the model (soft targets; data.training; "
                              "verified by task accuracy)")
def make_distilled(s: _Session) -> str:
    from builder.compression.distill import distill, import_student

    settings = s.settings
    if settings.student:
        student, origin = import_student(settings.student, s.ctx.spec.spec_dir), f"compression.student {settings.student}"
    else:
        pruned = s.prune()
        student = copy.deepcopy(pruned.model if pruned.model is not None else pruned.last)
        origin = f"the pruned model (ratio {pruned.ratio:.2f})"
    s.ctx.progress(f"  distilling into {origin} (T={settings.temperature:g}, alpha={settings.alpha:g}"
                   f"{', feature matching' if settings.feature_matching else ''}) ...")
    budget = s.budget()
    log = distill(s.ctx.model, student, s.data, settings, budget, evaluate=s.evaluate, progress=s.ctx.progress)
    record = {"method": "knowledge distillation (soft-target KL x T^2, alpha, cross-entropy on labels"
                        + (", feature matching" if settings.feature_matching else "") + ")",
              "student": origin, "temperature": settings.temperature, "alpha": settings.alpha,
              "feature_matching": settings.feature_matching, "training": log.to_dict(), "budget": budget.to_dict(),
              "reference_accuracy": s.reference_accuracy, "accuracy": log.accuracy}
    variant = _export(s, student, "onnx_distilled", "fp32", record, [f"student: {origin}; {log.steps} steps "
                                                                     f"({log.stopped_by})"])
    variant.stats = s.stats(student)
    return f"student {origin}, {variant.stats['params']} parameters, accuracy {log.accuracy:.2f}%"


@register_variant("onnx_qat_int8", format="onnx", precision="int8", stage=STAGE, targets=(),
                  description="ONNX INT8 (QDQ) from quantisation-aware fine-tuning (data.training; verified by "
                              "task accuracy)")
def make_qat(s: _Session) -> str:
    from builder.compression import qat
    from builder.compression.train import cross_entropy, fine_tune

    settings = s.settings
    s.ctx.progress("  quantisation-aware fine-tuning ...")
    model, notes = qat.prepare_qat(copy.deepcopy(s.ctx.model), s.data, settings.batch_size)
    budget = s.budget()
    log = fine_tune(model, s.data, cross_entropy, budget, steps=settings.steps, lr=settings.learning_rate / 10,
                    seed=settings.seed, batch_size=settings.batch_size, progress=s.ctx.progress, label="onnx_qat_int8")
    qat.freeze(model)
    log.accuracy = s.evaluate(model)
    s.ctx.progress(f"    onnx_qat_int8: {log.steps} steps ({log.stopped_by}), accuracy {log.accuracy:.2f}% (fake-quant)")
    record = {"method": "quantisation-aware training (torch fake-quant: U8 per-tensor activations, S8 per-channel "
                        "weights), then onnxruntime quantize_static to QDQ", "training": log.to_dict(), "budget": budget.to_dict(),
              "learning_rate": settings.learning_rate / 10, "reference_accuracy": s.reference_accuracy,
              "accuracy": log.accuracy}
    out_dir = s.ctx.workdir / "onnx_qat_int8"
    try:
        qat.to_float(model)
        float_dir = s.ctx.workdir / "onnx_qat_float"
        float_dir.mkdir(parents=True, exist_ok=True)
        exporter, opset = export_module_onnx(model, s.ctx.spec, float_dir / "model.onnx")
        n = min(s.ctx.spec.quantization.calibration_samples, len(s.data))
        feeds = [{name: x[i:i + 16].numpy() for name, x in zip(s.names, s.data.inputs)} for i in range(0, n, 16)]
        out_dir.mkdir(parents=True, exist_ok=True)
        how = qat.quantize_with_onnxruntime(float_dir / "model.onnx", out_dir / "model.onnx", feeds)
        shutil.rmtree(float_dir, ignore_errors=True)
        variant = s.ctx.add_variant(Variant("onnx_qat_int8", "onnx", "int8", out_dir / "model.onnx",
                                            exporter=f"{exporter}+qat", opset=opset, passes=[how],
                                            verified_by=VERIFIED_BY, compression=record, notes=notes))
    except Exception as exc:  # noqa: BLE001 - fall back to exporting the fake-quant ops as they are
        notes.append(f"onnxruntime's conversion failed ({onnx_tools.short_error(exc)}): the fake-quant ops are "
                     "exported as they are (QDQ around every layer; slower)")
        record["method"] = record["method"].replace("then onnxruntime quantize_static to QDQ", "fake-quant ops exported as QDQ")
        qat.freeze(model)
        shutil.rmtree(out_dir, ignore_errors=True)
        variant = _export(s, model, "onnx_qat_int8", "int8", record, notes)
        folded = qat.fold_weight_quantizers(variant.path)
        variant.passes.append(f"fake-quant exported as QuantizeLinear/DequantizeLinear; {folded} weight(s) stored INT8")
    variant.notes.append("compare with onnx_int8_static (post-training, same U8/S8 per-channel scheme) in the report")
    variant.stats = s.stats(s.ctx.model)
    return f"{variant.passes[-1]}; accuracy {log.accuracy:.2f}% (fake-quant)"


MAKERS = {"onnx_pruned": make_pruned, "onnx_distilled": make_distilled, "onnx_qat_int8": make_qat}


def run(ctx: BuildContext) -> StageResult:
    wanted = [name for name in MAKERS if ctx.wants(name)]
    if not wanted:
        return StageResult.skipped(STAGE, "no compression variant requested (onnx_pruned, onnx_distilled, "
                                          "onnx_qat_int8; they train: ask for them with --variants)")
    reason = why_not(ctx)
    if reason:
        for name in wanted:
            not_made(ctx, name, reason, skipped=True)
        return StageResult.skipped(STAGE, f"{', '.join(wanted)}: {reason}", skipped={n: reason for n in wanted})
    from builder.compression.train import torch_threads, training_threads

    session = _Session(ctx)
    reference_stats = session.stats(ctx.model)
    threads = training_threads(reference_stats["macs"])
    for variant in ctx.variants:
        variant.stats = variant.stats or dict(reference_stats, of="the user's model")
    def make(name: str) -> str:
        with torch_threads(threads):
            return MAKERS[name](session)

    made, failed, text = make_each(ctx, wanted, make)
    outputs = {"made": made, "failed": failed, "reference_accuracy": session.reference_accuracy,
               "reference_stats": reference_stats, "training_threads": threads or "torch default"}
    return StageResult.ok(STAGE, text, **outputs) if made else StageResult.fail(STAGE, text, **outputs)
