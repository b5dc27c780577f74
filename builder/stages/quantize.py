"""Stage `quantize`: INT8 variants. Each is verified afterwards (INT8 tolerance, accuracy drop) and
measured; whether one is faster is decided by the measurement, never assumed here.

- ``onnx_int8_static``: onnxruntime pre-processing (``quant_pre_process``: symbolic shape inference
  + graph optimisation), then ``quantize_static`` in QDQ format, per-channel weights, calibrated on
  the spec's data (data.calibration, else the validation inputs, else generated inputs) with the
  method of ``quantization.calibration_method`` (minmax | entropy | percentile).
- ``onnx_int8_dynamic``: ``quantize_dynamic`` of MatMul/Gemm weights (QInt8); activations are
  quantized at run time. Conv stays FP32 (onnxruntime's ConvInteger is slow on CPU).
- ``torchscript_int8_dynamic``: ``torch.ao.quantization.quantize_dynamic`` on nn.Linear, exported
  the way the base TorchScript was (trace or script), for the LibTorch backend.
"""

from __future__ import annotations

import copy
import shutil
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from builder.accuracy.task_metrics import on_cases
from builder.accuracy.tensors import (beyond_the_cases, compare_outputs, merge_case_metrics, tolerance_failures,
                                      top1_accuracy, trace_example, worst_metric)
from builder.accuracy.verification import accuracy_drop_failure
from builder.core.host import host_isa_flags
from builder.model.measure import measure_round_robin
from builder.model.runtime import open_runner
from builder.model.variants import CPU_TARGETS, register_variant
from builder.optimise import onnx_tools, quant_search
from builder.optimise.onnx_quantize import (KeptRecipes, OneNodeAtATime, move_model, preprocess, quantize_dynamic,
                                           quantize_static, quantized_op_types, quantized_ops, remove)
from builder.optimise.openvino_tools import cpu_plugin_problem
from builder.stages.base import BuildContext, StageResult, Variant
from builder.stages.common import BaseFailed, calibration_samples, check_base, not_made, skipped_for_base

STAGE = "quantize"
CALIBRATION_BATCH = 16
DYNAMIC_OPS = ("MatMul", "Gemm")
CONV_OPS = ("Conv", "ConvTranspose")
FUSED_OPS = ("Attention",)  # onnxruntime's fused attention (stage optimize): quantize_dynamic makes it QAttention


# dynamic INT8 quantizes MatMul/Gemm (nn.Linear) only: where they hold less than this share of a convolutional
# graph's weights, the variant is the FP32 graph with an INT8 head - it cannot win, yet its search, verification and
# measurement cost about a minute of a 2-core build (ResNet-18: ~50-60 s; docs/benchmarks.md)
MIN_DYNAMIC_SHARE = 0.10


class NotApplicable(Exception):
    """The variant makes no sense for this model (recorded as skipped, not as a failure)."""


def small_dynamic_share(ctx: BuildContext, variant: str, layers: str, weights: tuple[int, int] = (0, 0)) -> NotApplicable | None:
    """Why a dynamic INT8 variant is skipped on a convolutional model (None: it is made): ``layers`` (what its
    quantizer takes) hold under MIN_DYNAMIC_SHARE of the multiply-adds of the ONNX export (builder/optimise/onnx_tools.py
    macs_by_op), or without one, of the ``weights`` (dynamic, convolution) elements. A variant the spec or --variants
    names is always made."""
    named = ctx.options.variants or ctx.spec.variants or []
    base = ctx.variant("onnx")
    if base is not None and base.path.exists():
        macs = onnx_tools.macs_by_op(onnx_tools.load(base.path), DYNAMIC_OPS + FUSED_OPS + CONV_OPS)
        (dynamic, conv), measure = (sum(macs[op] for op in DYNAMIC_OPS + FUSED_OPS),
                                    sum(macs[op] for op in CONV_OPS)), "multiply-adds"
    else:
        (dynamic, conv), measure = weights, "weights"
    total = dynamic + conv
    if variant in named or conv == 0 or total == 0 or dynamic / total >= MIN_DYNAMIC_SHARE:
        return None
    return NotApplicable(f"{layers} hold {dynamic / total:.1%} of the {measure}, the convolutions {conv / total:.1%}: "
                         "dynamic INT8 quantizes only the former, so this would be the FP32 graph with an INT8 head "
                         "(no faster than onnx); onnx_int8_static and openvino_int8 quantize the convolutions. Name "
                         f"{variant} in variants (or --variants) to make it anyway")


def static_on_an_encoder(ctx: BuildContext) -> NotApplicable | None:
    """Why static INT8 is skipped on a transformer encoder (None: it is made). Static activation scales lost the
    task on every encoder measured (all-MiniLM-L6-v2: per-sample cosine 0.06-0.925; a MiniLM classifier: the
    logits' sign flipped), and its one-recipe search costs ~17 s of a 2-core build; where openvino_int8 is made on
    this host (NNCF's transformer scheme keeps the encoder's task: cosine 0.996) and onnx_int8_dynamic is the
    other INT8 route, it is skipped. Named in the spec or --variants, or with quantization.search other than auto,
    it is made."""

    named = ctx.options.variants or ctx.spec.variants or []
    if ("onnx_int8_static" in named or ctx.spec.quantization.search != "auto" or not ctx.wants("openvino_int8")
            or _dynamic_base(ctx).name != "onnx_opt" or cpu_plugin_problem() is not None):
        return None
    return NotApplicable("a transformer encoder (its graph fused as onnx_opt): static activation scales lost the "
                         "task on every encoder measured (all-MiniLM-L6-v2: per-sample cosine 0.06-0.925), and "
                         "openvino_int8 (NNCF's transformer scheme) and onnx_int8_dynamic are its INT8 routes on this "
                         "host. Name onnx_int8_static in variants (or --variants) to search it anyway")


def _dynamic_base(ctx: BuildContext) -> Variant:
    """The graph dynamic INT8 quantizes: a transformer's fused onnx_opt (its Attention becomes QAttention, as
    Optimum quantizes the optimized model: all-MiniLM-L6-v2 per-channel keeps per-sample cosine 0.9905 there
    vs 0.9898 unfused), else the plain export."""
    fused = ctx.variant("onnx_opt")
    if fused is not None and fused.path.exists() and any("transformer optimizer" in p for p in fused.passes):
        return fused
    return _onnx_base(ctx)


def _onnx_base(ctx: BuildContext) -> Variant:
    base = ctx.variant("onnx")
    if base is None or not base.path.exists():
        raise RuntimeError("the base ONNX export is missing (see stage export_onnx)")
    return base


# ------------------------------------------------------------------------------------------------
# makers


@register_variant("onnx_int8_static", format="onnx", precision="int8", stage=STAGE, base="onnx", targets=CPU_TARGETS,
                  description="ONNX static INT8, the recipe found by the quantisation search on this host")
def make_int8_static(ctx: BuildContext) -> str:
    base = _onnx_base(ctx)
    skip = static_on_an_encoder(ctx)
    if skip is not None:
        raise skip
    out_dir = ctx.workdir / "onnx_int8_static"
    out_dir.mkdir(parents=True, exist_ok=True)
    model = onnx_tools.clean_value_info(onnx_tools.load(base.path))
    large = onnx_tools.weight_bytes(model) > onnx_tools.EXTERNAL_DATA_THRESHOLD
    source = onnx_tools.save(model, out_dir / "source.onnx")
    del model
    pre = out_dir / "preprocessed.onnx"
    passes, notes = [], []
    prepared = preprocess(source, pre, passes, notes)

    samples, where = calibration_samples(ctx)
    batch = min(CALIBRATION_BATCH, ctx.spec.max_batch_size) if ctx.spec.batching else 1
    q = ctx.spec.quantization
    first = replace(quant_search.DEFAULT, calibration=q.calibration_method)
    final = out_dir / "model.onnx"
    quantize = lambda cand, target, only=None: quantize_static(  # noqa: E731
        prepared, target, cand, samples, batch, large, only, calibration_cache=out_dir / "calibration")
    rows: list[quant_search.Row] = []
    if q.search == "off" or ctx.reference is None:
        chosen = first
        quantize(first, final)
    elif q.search == "auto" and _dynamic_base(ctx).name == "onnx_opt":  # a fused encoder: a short static search
        notes.append(TRANSFORMER_STATIC)
        rows, chosen = _search(ctx, base, prepared, quantize, first, out_dir, [first], fallback=False)
        move_model(out_dir / "candidate.onnx", final)
    else:
        rows, chosen = _search(ctx, base, prepared, quantize, first, out_dir)
        move_model(out_dir / "candidate.onnx", final)
    remove(source, pre, out_dir / "candidate.onnx")
    shutil.rmtree(out_dir / "calibration", ignore_errors=True)
    passes.append(_recipe_text(chosen))
    count = quantized_ops(_graph(final))
    if not count:
        raise _nothing_quantized(final, "quantize_static")
    variant = Variant("onnx_int8_static", "onnx", "int8", final, exporter=f"{base.exporter}+int8", opset=base.opset,
                      base=base.name, passes=passes, notes=[f"calibrated on {where}; method {chosen.calibration}", *notes])
    if rows:
        variant.notes += [quant_search.summary(rows), "quantisation search (this host):\n"
                          + quant_search.format_table(rows)]
        variant.search = [r.to_dict() for r in rows]
    ctx.add_variant(variant)
    return f"{count} quantized ops; recipe {chosen.label()}; calibration: {where}"


def _recipe_text(cand) -> str:
    names = {"S8": "QInt8", "U8": "QUInt8"}
    text = (f"quantize_static({cand.quant_format}, per_channel={cand.per_channel}, activations "
            f"{names[cand.activation_type]}, weights {names[cand.weight_type]}, calibration {cand.calibration}")
    extra = [x for x in (cand.reduce_range and "reduce_range=True", cand.samples and f"{cand.samples} samples",
                         cand.op_types and "op_types " + "+".join(cand.op_types),
                         cand.exclude and "FP32 nodes " + ", ".join(cand.exclude)) if x]
    return text + "".join(f", {x}" for x in extra) + ")"


def _nothing_quantized(graph_file: Path, quantizer: str) -> NotApplicable:
    """The variant would be the FP32 graph under an INT8 name; says why where the graph's dtype explains it."""
    import onnx

    graph = _graph(graph_file).graph
    kinds = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
             onnx.TensorProto.BFLOAT16: "bfloat16", onnx.TensorProto.DOUBLE: "float64"}
    dtypes = sorted({kinds[t.data_type] for t in graph.initializer if t.data_type in kinds})
    why = (f"; the graph's weights are {', '.join(dtypes)} and onnxruntime's {quantizer} quantizes float32 "
           "tensors" if dtypes and "float32" not in dtypes else "")
    return NotApplicable(f"nothing was quantized (would equal onnx): {quantizer} left every op in "
                         f"floating point{why}")


# ------------------------------------------------------------------------------------------------
# the search's real evaluation: quantise, check against the reference, measure against FP32 here

SEARCH_WINDOW_SECONDS = 0.05
SEARCH_MEASURE_SECONDS = 0.6  # per candidate, FP32 and INT8 in turn (builder.model.measure round robin)
SENSITIVE_OPS = ("Conv", "MatMul", "Gemm", "ConvTranspose")


TRANSFORMER_STATIC = ("a transformer encoder: the static search tried the default and this host's priors only, no "
                      "per-node fallback (its INT8 route is onnx_int8_dynamic of the fused graph; static activation "
                      "scales lost the task on all-MiniLM-L6-v2: per-sample cosine 0.925, and the full search spent "
                      "~2 minutes of the build on it)")


def _search(ctx: BuildContext, base: Variant, prepared: Path, quantize, first, out_dir: Path, candidates=None,
            fallback: bool = True):
    """Run builder.optimise.quant_search with the real evaluate; the chosen recipe's model is left in
    out_dir/candidate.onnx. Returns (rows, chosen candidate)."""
    q = ctx.spec.quantization
    clock = time.monotonic
    deadline = clock() + q.search_seconds
    names = ([o.name for o in ctx.spec.outputs], [t.name for t in ctx.spec.inputs])
    fp32 = open_runner("onnx", base.path, *names)
    trial = out_dir / "trial.onnx"
    # the models of the passing recipes: the re-measurement and the final choice use them as they are rather
    # than quantizing again (a recipe gives the same model each time: its calibration and quantizer are fixed)
    kept = KeptRecipes(out_dir)

    nothing = []  # the first recipe (every op type it may take) quantized nothing: no recipe will

    def evaluate(cand, only=None) -> quant_search.Result:
        quantize(cand if only is None else replace(cand, exclude=()), trial, only)
        if not quantized_ops(_graph(trial)):
            nothing.extend([cand] if cand == first and only is None else [])
            return quant_search.Result(False, failures=["no node was quantised (no op of these types)"])
        result = _evaluate_model(ctx, open_runner("onnx", trial, *names), fp32, full=only is None)
        if only is None and result.passed:
            kept.keep(cand, trial)
        return result

    kind = "dynamic" if first.quant_format == "dynamic" else "static"  # a build may search both: say which
    priors = quant_search.host_priors(host_isa_flags(), kind == "dynamic")
    candidates = quant_search.with_priors(first, priors, candidates or quant_search.default_candidates(q.calibration_samples))
    tried_first = 1 + sum(1 for c in priors if c != first)
    remeasure = _remeasurer(ctx, quantize, fp32, out_dir, names, kept)
    # auto: the default and this host's priors always; on only while nothing settles it (quant_search.auto_settled)
    stop = (lambda rows: bool(nothing) or (  # noqa: E731
        q.search == "auto" and quant_search.auto_settled(rows, tried_first, remeasure)))
    ctx.progress(f"  quantisation search, {kind} INT8 ({q.search}, budget {q.search_seconds:g} s) ...")
    # the recipes get SEARCH_SHARE of the budget: the per-node FP32 fallback is always left time to run
    rows = quant_search.search(candidates, evaluate, q.search_seconds * SEARCH_SHARE, clock, stop_when=stop)
    if nothing:
        remove(trial)
        kept.clear()
        raise _nothing_quantized(prepared, f"quantize_{kind}")
    if fallback and quant_search.best(rows) is None and clock() < deadline:
        start = quant_search.closest(rows)
        nodes = _sensitive_nodes(prepared, start)
        ctx.progress(f"  no recipe passed: measuring {len(nodes)} nodes' sensitivity for the FP32 fallback ...")
        ranked = quant_search.rank_nodes(nodes, lambda n: _error(evaluate(start, only=[n])), deadline, clock)
        rows += quant_search.fallback(start, ranked, evaluate, deadline, clock)
    if quant_search.loses_to_fp32(rows):
        ctx.progress(f"  {kind} INT8 is stably slower than FP32 here: its passing recipes are not re-measured")
    else:
        quant_search.settle(rows, remeasure)  # the fastest passing recipes again, side by side with FP32
    winner = quant_search.best(rows)
    chosen = winner.candidate if winner else quant_search.closest(rows)
    if not kept.take(chosen, out_dir / "candidate.onnx"):
        quantize(chosen, out_dir / "candidate.onnx")
    remove(trial)
    kept.clear()
    return rows, chosen


RUNOFF_SECONDS = 3.0  # the finalists and FP32 side by side, in turns
SEARCH_SHARE = 0.6  # of quantization.search_seconds for the recipe list; the rest is the fallback's


def _remeasurer(ctx: BuildContext, quantize, fp32, out_dir: Path, names, kept: KeptRecipes):
    """remeasure(candidates) -> their speeds vs FP32, measured side by side with FP32 in turns
    (quant_search.settle for the finalists, quant_search.stably_slower for the default recipe)."""
    feed = _speed_feed(ctx)

    def remeasure(cands) -> list[float]:
        ctx.progress(f"  re-measuring {len(cands)} recipe(s) side by side with FP32 ...")
        calls, made = {"fp32": lambda: fp32(feed)}, []
        for i, cand in enumerate(cands):
            path = kept.path(cand)
            if path is None:
                path = out_dir / f"finalist{i}.onnx"
                quantize(cand, path)
                made.append(path)
            calls[str(i)] = (lambda run: lambda: run(feed))(open_runner("onnx", path, *names))
        m = measure_round_robin(calls, window_seconds=SEARCH_WINDOW_SECONDS, max_seconds=RUNOFF_SECONDS)
        remove(*made)
        return [_fastest(m[str(i)]) / _fastest(m["fp32"]) for i in range(len(cands))]

    return remeasure


def _fastest(measurement) -> float:
    """The fastest window's throughput: other processes only ever slow a window down, and in a round
    robin one model may settle while another still meets a burst (builder/model/measure.py)."""
    return max((w.throughput for w in measurement.windows), default=0.0)


def _speed_feed(ctx: BuildContext) -> dict:
    return max((c["inputs"] for c in ctx.reference.cases), key=lambda f: np.asarray(next(iter(f.values()))).size)


def _graph(path: Path):
    import onnx

    return onnx.load(str(path), load_external_data=False)


def _error(result: quant_search.Result) -> float:
    return result.error if result.error is not None else float("inf")


def _sensitive_nodes(prepared: Path, cand) -> list[str]:
    model = _graph(prepared)
    ops = set(cand.op_types or SENSITIVE_OPS)
    return [n.name for n in model.graph.node if n.op_type in ops and n.name and n.name not in cand.exclude]


def _evaluate_model(ctx: BuildContext, run, fp32, full: bool = True) -> quant_search.Result:
    """The INT8 checks of stage verify (tolerance on every case; ``full``: also data.validation, top-1 drop, and
    the speed against FP32 here unless --benchmark-seconds 0); a node's sensitivity needs only the cases."""
    spec, ref = ctx.spec, ctx.reference
    metrics = merge_case_metrics([compare_outputs(out, run(case["inputs"])) for case, out in zip(ref.cases, ref.outputs)])
    failures = tolerance_failures(metrics, on_cases(spec.verify.tolerance("int8")))  # a task's: on data.validation
    drop = None
    if full and ref.validation_inputs is not None:
        got = ref.run_validation(run, spec.max_batch_size)
        failures += beyond_the_cases(compare_outputs(ref.validation_outputs, got), spec.verify.tolerance("int8"),
                                     failures, ref.validation_samples(spec.batching))
    if full and ref.validation_inputs is not None and ref.labels is not None:
        first = ref.top1_output  # the output the labels score (stage load)
        drop = (top1_accuracy(ref.validation_outputs[first], ref.labels) - top1_accuracy(got[first], ref.labels))
        over = accuracy_drop_failure({"drop": drop}, spec.verify.max_accuracy_drop)
        if over:
            failures.append(f"{first}: top-1 accuracy {over}")
    speedup = None
    if full and ctx.options.benchmark_seconds != 0:
        feed = _speed_feed(ctx)
        m = measure_round_robin({"fp32": lambda: fp32(feed), "int8": lambda: run(feed)},
                                window_seconds=SEARCH_WINDOW_SECONDS, max_seconds=SEARCH_MEASURE_SECONDS)
        speedup = _fastest(m["int8"]) / _fastest(m["fp32"]) if _fastest(m["fp32"]) else None
    return quant_search.Result(not failures, worst_metric(metrics), drop, speedup, failures)


@register_variant("onnx_int8_dynamic", format="onnx", precision="int8", stage=STAGE, base="onnx", targets=CPU_TARGETS,
                  description="ONNX dynamic INT8 (MatMul/Gemm weights QInt8, activations quantized at run time)")
def make_int8_dynamic(ctx: BuildContext) -> str:
    base = _dynamic_base(ctx)
    model = onnx_tools.clean_value_info(onnx_tools.load(base.path))
    targets = sorted(onnx_tools.op_types(model) & set(DYNAMIC_OPS + FUSED_OPS))
    if not targets:
        raise NotApplicable("the graph has no MatMul/Gemm for dynamic INT8 to quantize (it would equal onnx)")
    skip = small_dynamic_share(ctx, "onnx_int8_dynamic", "MatMul/Gemm")
    if skip is not None:
        raise skip
    out_dir = ctx.workdir / "onnx_int8_dynamic"
    out_dir.mkdir(parents=True, exist_ok=True)
    large = onnx_tools.weight_bytes(model) > onnx_tools.EXTERNAL_DATA_THRESHOLD
    source = onnx_tools.save(model, out_dir / "source.onnx")
    del model
    passes, notes = [], []
    prepared = preprocess(source, out_dir / "preprocessed.onnx", passes, notes)
    final = out_dir / "model.onnx"
    first = quant_search.DYNAMIC
    fused = tuple(op for op in targets if op in FUSED_OPS)
    quantize = lambda cand, target, only=None: quantize_dynamic(prepared, target, cand, large, only, fused)  # noqa: E731
    if not large:  # the per-node sensitivities: each model cut from one quantization of every node
        quantize = OneNodeAtATime(quantize, prepared, out_dir)
    rows: list[quant_search.Row] = []
    if ctx.spec.quantization.search == "off" or ctx.reference is None:
        chosen = first
        quantize(first, final)
    else:
        rows, chosen = _search(ctx, base, prepared, quantize, first, out_dir, quant_search.dynamic_candidates())
        move_model(out_dir / "candidate.onnx", final)
    done = quantized_op_types(_graph(final))
    if not done:
        raise _nothing_quantized(final, "quantize_dynamic")
    remove(source, out_dir / "preprocessed.onnx", out_dir / "candidate.onnx")
    quantized = ", ".join(f"{op} x{n}" for op, n in sorted(done.items()))
    passes.append(f"quantize_dynamic(op_types {', '.join(chosen.op_types)}, weights "
                  f"{'QInt8' if chosen.weight_type == 'S8' else 'QUInt8'}"
                  + (", per_channel=True" if chosen.per_channel else "")
                  + (", reduce_range=True" if chosen.reduce_range else "")
                  + (f", FP32 nodes {', '.join(chosen.exclude)}" if chosen.exclude else "") + ")")
    if base.name == "onnx_opt":
        notes.insert(0, "quantized from onnx_opt, the transformer-fused graph (Attention as QAttention), as Optimum "
                        "quantizes the optimized model")
    variant = Variant("onnx_int8_dynamic", "onnx", "int8", final, exporter=f"{base.exporter}+int8", opset=base.opset,
                      passes=passes, base=base.name,
                      notes=[f"INT8 nodes: {quantized} (from {', '.join(targets)}); everything else (Conv "
                             "included) stays FP32", *notes])
    if rows:
        variant.notes += [quant_search.summary(rows), "quantisation search (this host):\n"
                          + quant_search.format_table(rows)]
        variant.search = [r.to_dict() for r in rows]
    ctx.add_variant(variant)
    return f"quantized {', '.join(targets)}: {quantized}"


@register_variant("torchscript_int8_dynamic", format="torchscript", precision="int8", stage=STAGE,
                  base="torchscript", targets=CPU_TARGETS,
                  description="TorchScript dynamic INT8 (torch.ao quantize_dynamic on nn.Linear) for LibTorch")
def make_torchscript_int8_dynamic(ctx: BuildContext) -> str:
    import torch

    if not ctx.spec.source.eager or not isinstance(ctx.model, torch.nn.Module) or isinstance(
            ctx.model, torch.jit.ScriptModule):
        raise NotApplicable(f"the source is {ctx.spec.source.kind}, not a PyTorch module: torch dynamic "
                            "quantization needs the eager nn.Module")
    layers = {n: m.weight.dtype for n, m in ctx.model.named_modules() if isinstance(m, torch.nn.Linear)}
    if not layers:
        raise NotApplicable("the model has no nn.Linear layers: nothing for dynamic INT8 to quantize")
    # quantize_dynamic's Linear takes float32 in and out: a float16/float64 layer would fail at run time
    names = {n for n, dtype in layers.items() if dtype == torch.float32}
    if not names:
        kinds = ", ".join(sorted({str(d).removeprefix("torch.") for d in layers.values()}))
        raise NotApplicable(f"the model's nn.Linear layers are {kinds}, not float32: torch dynamic INT8 quantizes "
                            "float32 nn.Linear only (it would fail on the first call)")
    convs = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d,
             torch.nn.ConvTranspose3d)
    skip = small_dynamic_share(ctx, "torchscript_int8_dynamic", "nn.Linear layers", (
        sum(m.weight.numel() for n, m in ctx.model.named_modules() if n in names),
        sum(m.weight.numel() for m in ctx.model.modules() if isinstance(m, convs))))
    if skip is not None:
        raise skip
    linears, which = len(names), {torch.nn.Linear} if len(names) == len(layers) else names
    base = ctx.variant("torchscript")
    order = ["trace", "script"] if base is None or base.exporter != "torch.jit.script" else ["script"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in torch 2.x; it still works
        quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(ctx.model), which,
                                                           dtype=torch.qint8).eval()
        example = trace_example(ctx.spec)
        args = tuple(torch.from_numpy(example[t.name]) for t in ctx.spec.inputs)
        errors, exported, how = {}, None, None
        for how in order:
            try:
                exported = (torch.jit.trace(quantized, args, check_trace=False, strict=False) if how == "trace"
                            else torch.jit.script(quantized))
                break
            except Exception as exc:  # noqa: BLE001
                errors[how] = onnx_tools.short_error(exc)
    if exported is None:
        raise RuntimeError("could not export the quantized module: "
                           + "; ".join(f"{k}: {v}" for k, v in errors.items()))
    out_dir = ctx.workdir / "torchscript_int8_dynamic"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.pt"
    torch.jit.save(exported, str(path))
    notes = [f"{linears} nn.Linear layer(s) quantized (quantized engine {torch.backends.quantized.engine}); "
             "torch.ao.quantization is deprecated upstream",
             *(f"{k} failed: {v}" for k, v in errors.items())]
    if base is None:
        notes.append("exported by trace without the trace-safety check of export_torchscript (no base export)")
    variant = Variant("torchscript_int8_dynamic", "torchscript", "int8", path, exporter=f"torch.jit.{how}",
                      passes=["torch.ao.quantization.quantize_dynamic({nn.Linear}, qint8)"], notes=notes,
                      base=base and base.name)
    ctx.add_variant(variant)
    return f"{linears} Linear layer(s), torch.jit.{how}"


def _bases(ctx: BuildContext, name: str) -> list[Variant | None]:
    """What ``name`` is quantized from (check_base judges it first; a missing ONNX export is the maker's to say)."""
    onnx = ctx.variant("onnx")
    if name == "torchscript_int8_dynamic" or onnx is None or not onnx.path.exists():
        return [ctx.variant("torchscript")] if name == "torchscript_int8_dynamic" else []
    return [_dynamic_base(ctx) if name == "onnx_int8_dynamic" else onnx]


MAKERS = {"onnx_int8_static": make_int8_static, "onnx_int8_dynamic": make_int8_dynamic,
          "torchscript_int8_dynamic": make_torchscript_int8_dynamic}


def run(ctx: BuildContext) -> StageResult:
    wanted = [name for name in MAKERS if ctx.wants(name)]
    if not wanted:
        return StageResult.skipped(STAGE, "no INT8 variant requested")
    made, skipped, failed = {}, {}, {}
    for name in wanted:
        ctx.progress(f"  making {name} ...")
        started = time.perf_counter()
        try:
            check_base(ctx, _bases(ctx, name))
            made[name] = MAKERS[name](ctx)
        except BaseFailed as exc:
            skipped[name] = skipped_for_base(ctx, name, exc)
        except NotApplicable as exc:
            skipped[name] = str(exc)
            not_made(ctx, name, skipped[name], skipped=True)
        except Exception as exc:  # noqa: BLE001 - one variant failing must not stop the others
            failed[name] = onnx_tools.short_error(exc)
            not_made(ctx, name, failed[name])
        if name not in made:
            shutil.rmtree(ctx.workdir / name, ignore_errors=True)
        ctx.variant_seconds[name] = round(time.perf_counter() - started, 2)
    text = "; ".join([f"{k}: {v}" for k, v in made.items()] + [f"{k} skipped: {v}" for k, v in skipped.items()]
                     + [f"{k} FAILED: {v}" for k, v in failed.items()])
    outputs = {"made": made, "skipped": skipped, "failed": failed}
    return (StageResult.ok if made else StageResult.fail if failed else StageResult.skipped)(STAGE, text, **outputs)
