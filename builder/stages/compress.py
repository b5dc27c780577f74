"""Stage `compress`: the only stage that trains. Training-time compression of the user's PyTorch
model, fine-tuned on ``data.training`` within the ``compression:`` budget (builder/spec/compression.py):

- ``onnx_pruned``: structured channel pruning (torch-pruning's dependency graph, so residual and
  concatenated branches stay consistent), iterative prune + fine-tune toward
  ``compression.prune_ratio``, keeping the largest ratio whose accuracy is within
  ``verify.max_accuracy_drop`` (builder/compression/prune.py).
- ``onnx_distilled``: the user's model teaches a student (the pruned model by default, or
  ``compression.student``) with soft targets, temperature and alpha, optional feature matching
  (builder/compression/distill.py).
- ``onnx_qat_int8``: quantisation-aware fine-tuning with fake-quant, exported as QDQ ONNX
  (builder/compression/qat.py); compare it with the post-training ``onnx_int8_static``.

All three train on the output the labels score (``training_output``: the logits of (embedding,
logits), not the first output) and hold the model's other float outputs to the user's model's
(train.TaskLoss); how far those moved on data.validation is recorded (``compression.other_outputs``).

They change the function by design: stage verify holds them to task accuracy on the labelled
validation data (``verified_by: task_accuracy``), not to closeness with the reference, and records
their own outputs, which their published reference.npz holds for ``check``. They are tried only when
asked for (``--variants onnx,onnx_pruned,...``): they train, so the default build stays fast.
Unstructured (mask) pruning is not offered: zeros in a dense weight make no dense kernel faster.
"""

from __future__ import annotations

import copy
import shutil

import numpy as np

from builder.accuracy.tensors import compare_outputs, top1_accuracy
from builder.compression.data import load_training, training_output  # noqa: F401 - load_training: the stage's API
from builder.compression.distill import distill, import_student
from builder.compression.prune import count_params_macs, prune_iteratively
from builder.compression.train import (Budget, TaskLoss, TrainingData, accuracy, fine_tune, model_outputs,
                                       torch_threads, training_threads)
from builder.core.errors import UserInputError
from builder.model.variants import register_variant
from builder.optimise import onnx_tools
from builder.stages.base import BuildContext, StageResult, Variant
from builder.stages.common import BaseFailed, check_base, export_module_onnx, make_each, not_made, skipped_for_base

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
    if not spec.source.eager or not hasattr(ctx.model, "parameters"):
        return f"needs a trainable PyTorch model (source.module); the source is {spec.source.kind}"
    if not spec.batching:
        return "needs a batch dimension (max_batch_size > 0) to train in batches"
    if ctx.reference is None or ctx.reference.labels is None:
        return ("needs labelled validation data to verify by task accuracy: data.validation with a 'labels' "
                "array")
    labels = np.asarray(ctx.reference.labels)
    if labels.ndim != 1:
        # verify scores per-position labels ([N, T] against [N, T, classes]); training takes one per sample
        return (f"trains with one class id per sample (cross-entropy on [samples, classes] scores), and "
                f"data.validation['labels'] holds {list(labels.shape[1:])} per sample (one per position, e.g. per "
                "token): per-position training is not offered; leave onnx_pruned, onnx_distilled and "
                "onnx_qat_int8 out of variants")
    if training_output(ctx) is None:
        scored = getattr(ctx.reference, "top1_output", None)
        outputs = getattr(ctx.reference, "validation_outputs", None) or {}
        shapes = ", ".join(f"'{n}' {a.dtype} {list(a.shape[1:])}" for n, a in outputs.items())
        return (f"trains with cross-entropy on float class scores, and no output holds them for these labels "
                f"(one class id per sample{f'; the labels score {scored!r}' if scored else ''}; outputs per "
                f"sample: {shapes}): return the class scores (logits) as an output too")
    return ""


class _Session:
    """What the three makers share within one build: data, the evaluator, the pruned model."""

    def __init__(self, ctx: BuildContext) -> None:
        spec, ref = ctx.spec, ctx.reference
        self.ctx = ctx
        self.settings = spec.compression
        self.names = [t.name for t in spec.inputs]
        self.outputs = [t.name for t in spec.outputs]
        # trained, distilled and evaluated: the class scores the labels score (by position among the outputs)
        self.task = training_output(ctx)
        self.data = TrainingData.from_arrays(load_training(ctx), self.names, self.outputs.index(self.task))
        # as stage verify scores (the labels' output: the same one, or the class ids these scores give)
        self.reference_accuracy = top1_accuracy(ref.validation_outputs[ref.top1_output], ref.labels)
        self.floor = self.reference_accuracy - spec.verify.max_accuracy_drop
        self.evaluate = lambda model: accuracy(model, ref.validation_inputs, ref.labels, self.names,
                                               spec.max_batch_size, output=self.data.output)
        self.example = [x[:2] for x in self.data.inputs]
        self.count = lambda model: count_params_macs(model, self.example)
        self.pruned = None  # PruneResult, made once

    def budget(self):
        return Budget(self.settings.steps, self.settings.seconds)

    def prune(self):
        if self.pruned is None:
            self.ctx.progress(f"  pruning toward ratio {self.settings.prune_ratio:g} in {self.settings.prune_steps} "
                              f"steps (accuracy floor {self.floor:.2f}%) ...")
            budget = self.budget()
            self.pruned = prune_iteratively(self.ctx.model, self.data, self.settings, budget,
                                            evaluate=self.evaluate, floor=self.floor, progress=self.ctx.progress,
                                            judge=self._prune_judge)
            self.pruned.budget = budget.to_dict()
        return self.pruned

    def check_shapes(self, model, origin: str) -> None:
        """Refuse a model whose outputs differ in number or per-sample shape from the user's model's:
        the variant is served under the spec's output names (a student of the user's own, or a layer
        that reaches an output by a path pruning did not see)."""
        import torch


        with torch.no_grad():
            theirs = [list(t.shape[1:]) for t in model_outputs(self.ctx.model.eval()(*self.example))]
            was_training = model.training
            ours = [list(t.shape[1:]) for t in model_outputs(model.eval()(*self.example))]
            model.train(was_training)
        if len(ours) != len(theirs):
            raise self._refusal(origin, f"returns {len(ours)} tensor(s), the model {len(theirs)} "
                                        f"({', '.join(self.outputs)})")
        changed = [f"'{n}' {a} per sample where the model returns {b}"
                   for n, a, b in zip(self.outputs, ours, theirs) if a != b]
        if changed:
            raise self._refusal(origin, "returns " + "; ".join(changed))

    def _refusal(self, origin: str, what: str) -> Exception:
        if origin.startswith("compression.student"):
            return UserInputError(f"{origin} {what}: a student must return what the model returns (the same "
                                  "outputs, in the same order and shapes)")
        return RuntimeError(f"{origin} {what}: it would serve other shapes under the same names")

    def other_outputs(self, model) -> dict[str, dict]:
        """How far the outputs that are not trained moved from the user's model on data.validation:
        {name: {"rel_l2": x}} for a float output, {"mismatched": share} for an integer one, what went
        wrong otherwise (missing, another shape, NaN/Inf); {} when the task output is the only one."""
        import torch


        ref = self.ctx.reference
        others = {n: a for n, a in ref.validation_outputs.items() if n != self.task}
        if not others:
            return {}
        was_training = model.training
        model.eval()

        def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            with torch.inference_mode():
                got = model_outputs(model(*[torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in self.names]))
            return {n: t.numpy() for n, t in zip(self.outputs, got)}

        try:
            got = ref.run_validation(run, self.ctx.spec.max_batch_size)
        finally:
            model.train(was_training)
        summary = {}
        for name, m in compare_outputs(others, got).items():
            if "integer" in m:
                summary[name] = {"mismatched": round(m["mismatched"] / max(m["compared"], 1.0), 6)}
            elif "rel_l2" in m:
                summary[name] = {"rel_l2": round(m["rel_l2"], 6)}
            else:
                summary[name] = {k: v for k, v in m.items() if k in ("missing", "shape_mismatch", "expected", "got",
                                                                     "nonfinite_in_variant", "nonfinite_mismatch")}
        return summary

    def others_fault(self, summary: dict[str, dict]) -> str:
        """'' when every output that is not trained stays as close to the user's model as the spec's
        INT8 tolerance allows (verify.tolerances.int8: rel_l2, max_mismatch): the labels cannot vouch
        for them, so closeness must - the loosest closeness the spec accepts of any variant; else why."""
        tolerance = self.ctx.spec.verify.tolerance("int8")
        faults = []
        for name, v in summary.items():
            if "rel_l2" in v:
                if not v["rel_l2"] <= tolerance["rel_l2"]:
                    faults.append(f"'{name}' rel L2 {v['rel_l2']:.3g} > {tolerance['rel_l2']:g}")
            elif "mismatched" in v:
                limit = tolerance.get("max_mismatch", 0.0)
                if v["mismatched"] > limit:
                    faults.append(f"'{name}' {v['mismatched']:.1%} of values differ > {limit:.1%}")
            else:
                faults.append(f"'{name}' {', '.join(f'{k} {x}' for k, x in v.items())}")
        return "; ".join(faults)

    def _prune_judge(self, model) -> str:
        fault = self.others_fault(self.other_outputs(model))
        return f"output(s) not trained on beyond verify.tolerances.int8 on data.validation: {fault}" if fault else ""

    def judge_others(self, model, record: dict, notes: list[str]) -> None:
        """Record (and say in the notes) how far the outputs that are not trained moved."""
        summary = self.other_outputs(model)
        if not summary:
            return
        record["other_outputs"] = summary
        said = ", ".join(f"'{n}' " + (f"rel L2 {v['rel_l2']:.3g}" if "rel_l2" in v else
                                      f"{v['mismatched']:.1%} of values differ" if "mismatched" in v else str(v))
                         for n, v in summary.items())
        fault = self.others_fault(summary)
        notes.append(f"outputs not trained on ('{self.task}' is), vs the model on data.validation: {said}"
                     + (f"; beyond verify.tolerances.int8: {fault}" if fault else ""))

    def stats(self, model) -> dict:
        """Parameters, and multiply-accumulates / FLOPs (2 x MACs) per sample (torch-pruning counts per sample)."""
        params, macs = self.count(model)
        return {"params": params, "macs": macs, "flops": 2 * macs}


def _export(s: _Session, model, name: str, precision: str, record: dict, notes: list[str],
            judged: bool = False) -> Variant:
    s.check_shapes(model, name)
    if not judged:
        s.judge_others(model, record, notes)
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
        also = " and the outputs not trained on within verify.tolerances.int8" if len(s.outputs) > 1 else ""
        notes.append(f"no ratio kept accuracy >= {s.floor:.2f}%{also}: the smallest step ({result.ratio:.2f}) is "
                     "exported for verification to judge")
    variant = _export(s, model, "onnx_pruned", "fp32", record, notes)
    variant.stats = s.stats(model)
    return f"ratio {result.ratio:.2f}, {variant.stats['params']} parameters, accuracy {result.accuracy:.2f}%"


@register_variant("onnx_distilled", format="onnx", precision="fp32", stage=STAGE, targets=(),
                  description="ONNX FP32, a student distilled from the model (soft targets; data.training; "
                              "verified by task accuracy)")
def make_distilled(s: _Session) -> str:
    settings = s.settings
    if settings.student:
        student, origin = import_student(settings.student, s.ctx.spec.spec_dir), f"compression.student {settings.student}"
    else:
        pruned = s.prune()
        student = copy.deepcopy(pruned.model if pruned.model is not None else pruned.last)
        origin = f"the pruned model (ratio {pruned.ratio:.2f})"
    s.check_shapes(student, origin)  # before training: the loss matches every output by position
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
    from builder.compression import qat  # deferred: it defines torch modules, so importing it imports torch

    settings = s.settings
    s.ctx.progress("  quantisation-aware fine-tuning ...")
    model, notes = qat.prepare_qat(copy.deepcopy(s.ctx.model), s.data, settings.batch_size)
    budget = s.budget()
    loss = TaskLoss(s.ctx.model, s.data)
    log = fine_tune(model, s.data, loss, budget, steps=settings.steps, lr=settings.learning_rate / 10,
                    seed=settings.seed, batch_size=settings.batch_size, progress=s.ctx.progress, label="onnx_qat_int8")
    qat.freeze(model)
    log.accuracy = s.evaluate(model)
    s.ctx.progress(f"    onnx_qat_int8: {log.steps} steps ({log.stopped_by}), accuracy {log.accuracy:.2f}% (fake-quant)")
    record = {"method": "quantisation-aware training (torch fake-quant: U8 per-tensor activations, S8 per-channel "
                        "weights), then onnxruntime quantize_static to QDQ", "training": log.to_dict(), "budget": budget.to_dict(),
              "learning_rate": settings.learning_rate / 10, "reference_accuracy": s.reference_accuracy,
              "accuracy": log.accuracy}
    s.judge_others(model, record, notes)  # as fake-quant (the INT8 model's values, near enough)
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
        variant = _export(s, model, "onnx_qat_int8", "int8", record, notes, judged=True)
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

    try:  # exported by the same exporter as onnx: an export that failed verification would fail them too
        check_base(ctx, [ctx.variant("onnx")])
    except BaseFailed as exc:
        skipped = {name: skipped_for_base(ctx, name, exc) for name in wanted}
        return StageResult.skipped(STAGE, f"{', '.join(wanted)}: {exc}", skipped=skipped)
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
