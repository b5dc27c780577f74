"""Stage `openvino`: OpenVINO IR variants of the ONNX export, for the CPU plugin.

- ``openvino``: the ONNX export read by OpenVINO's ONNX frontend and saved as IR (``model.xml`` +
  ``model.bin``, FP32 weights); it runs with FP32 inference precision (builder/optimise/openvino_tools.py).
- ``openvino_int8``: NNCF post-training quantisation (``nncf.quantize``, its default preset) of that
  model on the spec's calibration data (the same samples as onnx_int8_static). With labelled
  validation data, when the plain result drops more top-1 than ``verify.max_accuracy_drop``, NNCF's
  accuracy-aware ``quantize_with_accuracy_control`` runs once with that budget (it keeps the layers
  that cost the most accuracy in FP32); what was done is in the variant's notes.

Both are verified (stage verify: FP32 resp. INT8 tolerance, accuracy drop) and measured like every
other variant (builder/model/runtime.py runs them in-process: latency hint, threads = usable cores);
selection publishes one only when it measures better here. Both are in the CPU targets' default variants
(the stage takes about a second on small models; the benchmark ~2 s per variant); where OpenVINO's CPU
plugin does not run they are skipped, with the reason.

Served: target ``cpu`` with Triton's ``backend: "openvino"`` (model.xml + model.bin in the version
folder), at the CPU plugin's default precision (bf16 on CPUs with bfloat16: Triton's backend cannot force
f32; verified and measured so, judged at the fp16 tolerance there); target ``python`` with the python
backend's model.py running the IR (runtime openvino) in f32 (the IR is marked: openvino_tools.F32_MARK).
"""

from __future__ import annotations

import contextlib
import io
import shutil
import traceback
import warnings

import numpy as np

from builder.accuracy.tensors import top1_accuracy, top1_hits
from builder.accuracy.verification import accuracy_drop_failure
from builder.model.variants import CPU_TARGETS, register_variant
from builder.optimise import openvino_tools, transformer_fusion
from builder.repository.runtime_gate import ir_failures
from builder.repository.triton_releases import triton_release
from builder.stages.base import BuildContext, StageResult, Variant
from builder.stages.common import BaseFailed, calibration_samples, check_base, make_each, not_made

STAGE = "openvino"
CALIBRATION_BATCH = 16


class NotApplicable(Exception):
    """The variant makes no sense for this model (recorded as skipped, not as a failure)."""


def _base(ctx: BuildContext) -> Variant:
    base = ctx.variant("onnx")
    if base is None or not base.path.exists():
        raise RuntimeError("the base ONNX export is missing (see stage export_onnx)")
    return base


def _for_python_backend(ctx: BuildContext) -> bool:
    """Target python serves the IR with model.py, which runs it in f32 (openvino_tools.F32_MARK); elsewhere
    Triton's openvino backend runs it at the CPU plugin's default precision."""
    return ctx.target == "python"


def _conversion(ctx: BuildContext) -> str:
    precision = ("inference precision f32 (marked in the IR: the python backend's model.py runs it so)"
                 if _for_python_backend(ctx) else
                 f"inference precision: the CPU plugin's default ({openvino_tools.plugin_precision()} on this CPU), "
                 "as Triton's openvino backend runs it")
    return (f"openvino {openvino_tools.version()}: Core.read_model (ONNX frontend) + save_model(compress_to_fp16="
            f"False); {precision}, PERFORMANCE_HINT LATENCY")


def _computes_in(ctx: BuildContext, variant: Variant) -> None:
    """An FP32 IR for Triton's openvino backend on a CPU whose plugin defaults to bf16: said, and judged so."""
    if _for_python_backend(ctx) or variant.precision != "fp32":
        return
    precision = openvino_tools.plugin_precision()
    if precision != "f32":
        variant.computes_in = precision
        variant.notes.append(f"Triton's openvino backend cannot force f32: on this CPU the plugin computes this FP32 "
                             f"IR in {precision} (its default here), so it is verified and measured in {precision}; "
                             "on a CPU without bfloat16 it computes in f32")


@register_variant("openvino", format="openvino", precision="fp32", stage=STAGE, base="onnx", targets=CPU_TARGETS,
                  description="OpenVINO IR FP32 from the ONNX export (CPU plugin, latency hint)")
def make_openvino(ctx: BuildContext) -> str:
    base = _base(ctx)
    ir = openvino_tools.to_ir(base.path, ctx.workdir / "openvino", f32=_for_python_backend(ctx))
    variant = Variant("openvino", "openvino", "fp32", ir, exporter=f"{base.exporter}+openvino", opset=base.opset,
                      passes=[_conversion(ctx)])
    _computes_in(ctx, variant)
    variant.notes.append(f"OpenVINO IR version {openvino_tools.ir_version(ir)}, opsets "
                         + ", ".join(f"opset{n}" for n in openvino_tools.ir_opsets(ir)))
    _release_check(ctx, ir)
    ctx.add_variant(variant)
    return f"IR {ir.name} + {ir.with_suffix('.bin').name} ({variant.size_mb:.2f} MB)"


def _release_check(ctx: BuildContext, ir) -> None:
    """Target cpu serves the IR on Triton's openvino backend: refuse opsets the build's Triton release's
    OpenVINO cannot read (builder/repository/runtime_gate.py), before anything is verified or published."""
    if ctx.target != "cpu":
        return

    failures = ir_failures(ir, triton_release(ctx.options.triton_release))
    if failures:
        raise RuntimeError("; ".join(failures))


def _batches(samples) -> list[dict[str, np.ndarray]]:
    if isinstance(samples, list):
        return list(samples)
    count = len(next(iter(samples.values())))
    return [{k: v[i:i + CALIBRATION_BATCH] for k, v in samples.items()} for i in range(0, count, CALIBRATION_BATCH)]


@contextlib.contextmanager
def _quiet():
    """NNCF prints progress bars and warnings: the library never prints (builder/core/progress.py)."""
    import logging

    nncf = openvino_tools.import_nncf()
    from nncf.common.logging import nncf_logger

    level = nncf_logger.level
    nncf.set_log_level(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield nncf
    finally:
        nncf.set_log_level(level)


def _top1_drop(ctx: BuildContext, ir) -> float | None:
    """The top-1 drop of the IR at ``ir`` on the labelled validation set (None without labels)."""
    ref, spec = ctx.reference, ctx.spec
    if ref is None or ref.validation_inputs is None or ref.labels is None:
        return None
    first = ref.top1_output  # the output the labels score (stage load)
    run = openvino_tools.openvino_runner(ir, [first])
    got = ref.run_validation(run, spec.max_batch_size)
    return top1_accuracy(ref.validation_outputs[first], ref.labels) - top1_accuracy(got[first], ref.labels)


def _fast_bias_correction_failed(exc: BaseException) -> bool:
    """Whether NNCF failed inside its FastBiasCorrection step (judged by where, not by the words: NNCF's
    own message there is torch-like, "iteration over a 0-d tensor" for a model with a 0-d/1-d output)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return any("fast_bias_correction" in frame.filename.replace("\\", "/") for frame in frames)


def _quantize(base_path, dataset, batches: int, notes: list[str], quantize=None,
              transformer: bool = False) -> tuple[object, bool]:
    """nncf.quantize of the IR read from ``base_path``: (quantized model, fast bias correction used).
    When NNCF fails in its fast bias correction (a model whose outputs it cannot iterate: an unbatched
    model with a 1-d head output), it runs once more with fast_bias_correction=False, said in ``notes``.
    ``quantize``: nncf.quantize, injectable for tests."""
    with _quiet() as nncf:
        quantize = quantize or nncf.quantize
        try:
            return quantize(openvino_tools.read_onnx(base_path), dataset, subset_size=batches,
                            **_model_type(nncf, transformer)), True
        except Exception as exc:  # noqa: BLE001 - one known NNCF failure is retried, anything else raised as is
            if not _fast_bias_correction_failed(exc):
                raise
            first = exc
        try:
            quantized = quantize(openvino_tools.read_onnx(base_path), dataset, subset_size=batches,
                                 **_model_type(nncf, transformer),
                                 fast_bias_correction=False)
        except Exception as exc:  # noqa: BLE001
            raise RuntimeError(f"NNCF's quantize failed in its fast bias correction ({first}) and again with "
                               f"fast_bias_correction=False ({exc}); serve openvino (FP32) or onnx_int8_static "
                               "instead") from None
    notes.append(f"NNCF's fast bias correction failed ({first}): quantized with fast_bias_correction=False "
                 "(NNCF's slower bias correction)")
    return quantized, False


def _model_type(nncf, transformer: bool) -> dict:
    """NNCF's transformer scheme (its attention and LayerNorm patterns kept in float) for a transformer encoder:
    the default preset on all-MiniLM-L6-v2 gave per-sample cosine -0.004."""
    return {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}


def _accuracy_aware(ctx: BuildContext, nncf, model, dataset, fast_bias_correction: bool = True):
    """nncf.quantize_with_accuracy_control with the spec's top-1 budget (absolute, in points)."""
    ref, spec = ctx.reference, ctx.spec
    first = ref.top1_output
    names = [t.name for t in spec.inputs]
    batch = spec.max_batch_size or len(ref.labels)
    items = [({n: ref.validation_inputs[n][i:i + batch] for n in names}, ref.labels[i:i + batch])
             for i in range(0, len(ref.labels), batch)]

    def validate(compiled, data) -> float:
        hits = total = 0
        port = next(p for p in compiled.outputs if first in p.get_names())
        for feeds, labels in data:
            hits += top1_hits(compiled(feeds)[port], labels)
            total += np.size(labels)
        return hits / max(total, 1)

    validation = nncf.Dataset(items, lambda item: item)
    return nncf.quantize_with_accuracy_control(model, dataset, validation, validate,
                                               max_drop=spec.verify.max_accuracy_drop / 100.0,
                                               drop_type=nncf.DropType.ABSOLUTE,
                                               fast_bias_correction=fast_bias_correction)


@register_variant("openvino_int8", format="openvino", precision="int8", stage=STAGE, base="onnx", targets=CPU_TARGETS,
                  description="OpenVINO IR INT8: NNCF post-training quantisation on the spec's calibration data "
                              "(accuracy-aware when labels exist and the plain result is over budget)")
def make_openvino_int8(ctx: BuildContext) -> str:
    base = _base(ctx)
    samples, where = calibration_samples(ctx)
    batches = _batches(samples)
    out_dir = ctx.workdir / "openvino_int8"
    notes = [f"calibrated on {where}"]
    nncf = openvino_tools.import_nncf()
    dataset = nncf.Dataset(batches)
    transformer = ctx.spec.source.eager and transformer_fusion.encoder_shape(ctx.model) is not None
    quantized, fast = _quantize(base.path, dataset, len(batches), notes, transformer=transformer)
    ir = openvino_tools.save_ir(quantized, out_dir, f32=_for_python_backend(ctx))
    _release_check(ctx, ir)
    preset = "model_type TRANSFORMER" if transformer else "default preset"
    passes = [_conversion(ctx), f"nncf {nncf.__version__} quantize ({preset}, {len(batches)} calibration "
                             f"batches{'' if fast else ', fast_bias_correction=False'})"]
    drop = _top1_drop(ctx, ir)
    over = accuracy_drop_failure({"drop": drop}, ctx.spec.verify.max_accuracy_drop)
    if over:
        notes.append(f"plain nncf.quantize: top-1 {over}: ran nncf.quantize_with_accuracy_control")
        with _quiet() as nncf:
            controlled = _accuracy_aware(ctx, nncf, openvino_tools.read_onnx(base.path), dataset, fast)
        ir = openvino_tools.save_ir(controlled, out_dir, f32=_for_python_backend(ctx))
        _release_check(ctx, ir)
        passes.append(f"nncf quantize_with_accuracy_control(max_drop={ctx.spec.verify.max_accuracy_drop} points, "
                      "absolute)")
        drop = _top1_drop(ctx, ir)
    fake_quantize = openvino_tools.count_ops(ir, "FakeQuantize")
    if not fake_quantize:
        raise NotApplicable("nothing was quantized (would equal openvino): NNCF inserted no FakeQuantize (no op "
                            "it quantizes, such as Convolution or MatMul, on float32 tensors)")
    variant = Variant("openvino_int8", "openvino", "int8", ir, exporter=f"{base.exporter}+openvino+nncf",
                      opset=base.opset, passes=passes, notes=notes,
                      base="openvino" if ctx.variant("openvino") is not None else base.name)
    ctx.add_variant(variant)
    return (f"{fake_quantize} FakeQuantize ops; calibration: {where}"
            + (f"; top-1 drop {drop:+.2f} points" if drop is not None else ""))


MAKERS = {"openvino": make_openvino, "openvino_int8": make_openvino_int8}


def run(ctx: BuildContext) -> StageResult:
    wanted = [name for name in MAKERS if ctx.wants(name)]
    if not wanted:
        return StageResult.skipped(STAGE, "no OpenVINO variant requested (openvino, openvino_int8)")
    problem = openvino_tools.cpu_plugin_problem()
    if problem is not None:
        for name in wanted:
            not_made(ctx, name, problem, skipped=True)
        return StageResult.skipped(STAGE, "; ".join(f"{name} skipped: {problem}" for name in wanted))
    base = ctx.variant("onnx")
    float64 = openvino_tools.float64_parts(base.path) if base is not None and base.path.exists() else []
    if float64:
        why = (f"OpenVINO's CPU plugin has no f64 and this is a float64 model ({', '.join(float64[:4])}): it would "
               "compute in f32 or fail to compile; serve the onnx or torchscript variant, or cast the model to "
               "float32 for OpenVINO")
        for name in wanted:
            not_made(ctx, name, why, skipped=True)
        return StageResult.skipped(STAGE, "; ".join(f"{name} skipped: {why}" for name in wanted))
    skipped = {}

    def make(name: str) -> str:
        try:
            if name == "openvino_int8":  # NNCF quantizes the ONNX export; the FP32 IR is that conversion, verified
                check_base(ctx, [ctx.variant("onnx"), ctx.variant("openvino")])
            return MAKERS[name](ctx)
        except BaseFailed as exc:
            ctx.progress(f"  {name} skipped: {exc}")
            skipped[name] = str(exc)
            return ""
        except NotApplicable as exc:
            skipped[name] = str(exc)
            return ""

    made, failed, _ = make_each(ctx, wanted, make)
    for name, why in skipped.items():
        made.pop(name, None)
        not_made(ctx, name, why, skipped=True)
        shutil.rmtree(ctx.workdir / name, ignore_errors=True)
    text = "; ".join([f"{k}: {v}" for k, v in made.items()] + [f"{k} skipped: {v}" for k, v in skipped.items()]
                     + [f"{k} FAILED: {v}" for k, v in failed.items()])
    if made:
        return StageResult.ok(STAGE, text, made=made, skipped=skipped, failed=failed)
    if failed:
        return StageResult.fail(STAGE, text, made=made, skipped=skipped, failed=failed)
    return StageResult.skipped(STAGE, text, made=made, skipped=skipped, failed=failed)
