"""Helpers the stages share (stages never import each other; what two of them need lives here).

Usage::

    exporter, opset = export_module_onnx(module, spec, workdir / "onnx_pruned" / "model.onnx")
    check_base(ctx, [ctx.variant("onnx")])   # raises BaseFailed (-> skipped) when the base failed verification
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from builder.accuracy.tensors import default_dynamic_sizes, generated_inputs, trace_example
from builder.accuracy.verification import verify_one
from builder.core.errors import UserInputError
from builder.core.scratch import WORK_PREFIX
from builder.optimise import onnx_tools

if TYPE_CHECKING:
    from builder.stages.base import BuildContext, Variant

LEGACY_DEFAULT_OPSET = 17
EXTERNAL_DATA_THRESHOLD = 1 << 30  # bytes of weights above which they go to model.onnx.data


class BaseFailed(Exception):
    """The variant's base failed verification: it is not made (recorded as skipped, with the base's reason)."""


def check_base(ctx: "BuildContext", bases: list["Variant | None"]) -> None:
    """Raise BaseFailed when one of ``bases`` (what a variant is about to be derived from) failed
    verification; verify each base now if stage verify has not yet (it runs after every variant is made, and skips those verified here).

    Why here, before the derivation: a variant quantized, converted or compiled from a wrong graph
    inherits its error - onnx_int8_dynamic was quantized 20 times (128 s of a 173 s build) from an
    onnx_opt already wrong, and published with that error inside its INT8 budget. Verifying the base on
    demand keeps the pipeline's order (verify stays one stage, after every variant is made) and costs
    nothing more: each variant is verified once. Bases not made (None) are not judged here."""
    for base in bases:
        if base is None:
            continue
        if base.verified is None:
            verify_one(ctx, base)
        if base.verified is False:
            lines = [line.removeprefix("- ") for line in base.rejected.splitlines()[1:]
                     if not line.startswith("- cases: ")] or [base.rejected]  # which cases: in the base's own row
            first = lines[0] + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else "")
            raise BaseFailed(f"its base {base.name} failed verification ({first}); a variant made from it would "
                             "inherit that error, so it is not made")


def skipped_for_base(ctx: "BuildContext", name: str, exc: BaseFailed) -> str:
    """Record ``name`` as skipped for its failed base (notes, the summary table) and say so in the progress."""
    not_made(ctx, name, str(exc), skipped=True)
    ctx.progress(f"  {name} skipped: {exc}")
    return str(exc)


def not_made(ctx: "BuildContext", name: str, why: str, skipped: bool = False) -> None:
    """Record a requested variant a stage could not make (``skipped``: not applicable to this model,
    by design) in the build's notes and ``ctx.not_made``."""
    ctx.notes.append(f"{name}: {'skipped' if skipped else 'not made'}: {why}")
    ctx.not_made[name] = ("skipped" if skipped else "failed", why)


def make_each(ctx: "BuildContext", wanted: list[str], make: Callable[[str], str]) -> tuple[dict, dict, str]:
    """Make each wanted variant with ``make(name)`` (returns its one-line summary). One failing is recorded
    - its short error in ``ctx.notes``, its work folder removed - and does not stop the others; one whose
    base failed (BaseFailed) is recorded as skipped; a UserInputError (the spec is wrong) goes up. Returns (made, failed, one line for the stage result)."""

    made, failed, skipped = {}, {}, {}
    for name in wanted:
        ctx.progress(f"  making {name} ...")
        started = time.perf_counter()
        try:
            made[name] = make(name)
        except UserInputError:
            raise
        except BaseFailed as exc:
            skipped[name] = skipped_for_base(ctx, name, exc)
        except Exception as exc:  # noqa: BLE001 - one variant failing must not stop the others
            stop_if_work_folder_refused(exc, ctx.workdir)
            failed[name] = onnx_tools.short_error(exc)
            not_made(ctx, name, failed[name])
            shutil.rmtree(ctx.workdir / name, ignore_errors=True)
        finally:
            ctx.variant_seconds[name] = round(time.perf_counter() - started, 2)
    text = "; ".join([f"{k}: {v}" for k, v in made.items()] + [f"{k} skipped: {v}" for k, v in skipped.items()]
                     + [f"{k} FAILED: {v}" for k, v in failed.items()])
    return made, failed, text


# the file system refusing writes into the work folder: no exporter or variant can succeed after it,
# so the build stops with the folder and the fix instead of recording one more failed variant
WORK_FOLDER_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def file_system_cause(exc: BaseException) -> OSError | None:
    """The OSError with a file-system errno (full, read-only, forbidden) behind ``exc``, however deep
    the exporters wrapped it; None when there is none."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in WORK_FOLDER_ERRNOS:
            return current
        current = current.__cause__ or current.__context__
    return None


def work_folder_error(err: OSError, workdir: Path):
    """A UserInputError (exit 2) naming the build's work folder, the file and $TMPDIR as the fix."""

    workdir = next((p for p in (workdir, *workdir.parents) if p.name.startswith(WORK_PREFIX)), workdir)
    where = f" (writing {err.filename})" if err.filename else ""
    tmpdir = os.environ.get("TMPDIR")
    said = f"$TMPDIR={tmpdir}" if tmpdir else "$TMPDIR is unset: the system default"
    fix = ("free space there, or point $TMPDIR at a file system with room (TMPDIR=/path/with/space triton-builder build ...)"
           if err.errno in (errno.ENOSPC, errno.EDQUOT) else
           "point $TMPDIR at a folder this user may write (TMPDIR=/path triton-builder build ...)")
    return UserInputError(f"the build's work folder {workdir} ({said}): {err.strerror or os.strerror(err.errno)}"
                          f"{where}; {fix}; nothing was published")


def stop_if_work_folder_refused(exc: BaseException, workdir: Path) -> None:
    """Raise work_folder_error when ``exc`` comes from the file system refusing a write."""
    cause = file_system_cause(exc)
    if cause is not None:
        raise work_folder_error(cause, workdir) from None


# ------------------------------------------------------------------------------------------------
# ONNX export of a torch module (stage export_onnx for the user's model, stage compress for the
# models it trains)


def dynamic_axes(spec) -> list[dict[int, str]]:
    offset = 1 if spec.batching else 0
    axes = []
    for tensor in spec.inputs:
        dims = {0: "batch"} if spec.batching else {}
        for j, size in enumerate(tensor.shape):
            if size == -1:
                dims[j + offset] = f"{tensor.name}_d{j}"
        axes.append(dims)
    return axes


def example_args(spec):
    import torch
    example = trace_example(spec)
    return tuple(torch.from_numpy(example[t.name]) for t in spec.inputs)


def export_dynamo(model, spec, path: Path) -> None:
    import logging

    import torch

    # the exporter logs one warning per torchvision op it cannot register; torchvision is not needed
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    # a failed symbolic trace logs a warning and torch.export prints the partial FX graph to stderr (~240
    # lines for a small Transformer); the failure itself reaches the variant's notes, and legacy is tried next
    logging.getLogger("torch.fx.experimental.symbolic_shapes").setLevel(logging.ERROR)
    from torch.export import Dim

    dynamic_shapes = tuple({axis: Dim.DYNAMIC for axis in dims} or None for dims in dynamic_axes(spec))
    kwargs = {"opset_version": spec.onnx.opset} if spec.onnx.opset else {}
    with contextlib.redirect_stderr(io.StringIO()):
        torch.onnx.export(model, example_args(spec), str(path), dynamo=True,
                          input_names=[t.name for t in spec.inputs], dynamic_shapes=dynamic_shapes,
                          external_data=True, report=False, verbose=False, **kwargs)


def export_legacy(model, spec, path: Path) -> None:
    import torch

    names = [t.name for t in spec.inputs]
    torch.onnx.export(model, example_args(spec), str(path), dynamo=False, input_names=names,
                      output_names=[o.name for o in spec.outputs],
                      dynamic_axes={n: axes for n, axes in zip(names, dynamic_axes(spec)) if axes},
                      opset_version=spec.onnx.opset or LEGACY_DEFAULT_OPSET)


def finish_export(exporter: str, spec, raw: Path, dest: Path) -> int:
    """Finalize an export (finalize_onnx) to ``dest`` and, for the dynamo exporter with dynamic dims,
    check that onnxruntime runs it away from the export example's sizes; the opset. Raises, naming the
    cause, when the export is unusable, so that the caller records it and tries the next exporter."""
    opset = finalize_onnx(raw, [o.name for o in spec.outputs], rename=True, dest=dest, spec=spec)
    if exporter == "dynamo" and (spec.batching or spec.has_dynamic_dims):
        # the dynamo exporter may fix a dynamic size it traced into the graph (a bidirectional GRU/LSTM
        # reshapes to the example's sequence length): export succeeds, then every run at another size fails
        check_runs_at_profile_sizes(spec, dest)
    return opset


def check_runs_at_profile_sizes(spec, path: Path) -> None:
    """Run the ONNX model at the smallest and largest dynamic size (batch 1, and a batch > 1 when batching);
    raises RuntimeError saying where it does not run."""

    example = trace_example(spec)
    dynamic = spec.has_dynamic_dims
    exported = ", ".join(([f"batch {len(next(iter(example.values())))}"] if spec.batching else []) +
                         (["the opt_shape sizes"] if dynamic else []))
    rng = np.random.default_rng(spec.verify.seed + 11)
    sizes = default_dynamic_sizes(spec)
    ends = (min(sizes), max(sizes)) if spec.verify.dynamic_sizes else ("min", "max") if dynamic else (0, 0)
    batches = [1, min(spec.max_batch_size, 3)] if spec.batching else [None, None]
    for batch, size in zip(batches, ends):
        feeds = generated_inputs(spec, batch, size, rng)
        try:
            onnx_tools.run_quietly(path, feeds)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's own error types; the text is the cause
            at = f"dynamic dims at their {size}_shape sizes" if isinstance(size, str) else f"dynamic size {size}"
            where = ", ".join(([f"batch {batch}"] if batch else []) + ([at] if dynamic else []))
            cause = " ".join(str(exc).split())
            # onnxruntime's status code and the C++ check that failed push the cause past any shortening
            cause = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : |\S*onnxruntime_src/\S+ .*? was false\. ", "", cause)
            forced = "; try onnx.exporter: legacy" if spec.onnx.exporter == "dynamo" else ""
            raise RuntimeError(f"onnxruntime cannot run the dynamo export at {where} (exported at {exported}; "
                               f"the exporter may have fixed that size into the graph): {cause}"[:360] + forced) from None


def export_module_onnx(model, spec, dest: Path) -> tuple[str, int]:
    """Export ``model`` as export_onnx exports the user's model (the spec's exporter order: dynamo,
    legacy on failure; outputs renamed; checked) to ``dest``; (exporter, opset). Raises RuntimeError
    with every exporter's error when none works."""
    raw_dir = dest.parent / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    raw = raw_dir / "model.onnx"
    attempts = {}
    try:
        for name in {"auto": ["dynamo", "legacy"], "dynamo": ["dynamo"], "legacy": ["legacy"]}[spec.onnx.exporter]:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    (export_dynamo if name == "dynamo" else export_legacy)(model, spec, raw)
                return name, finish_export(name, spec, raw, dest)
            except Exception as exc:  # noqa: BLE001 - recorded, then the next exporter is tried
                stop_if_work_folder_refused(exc, dest.parent)
                attempts[name] = " ".join(str(exc).split())[:400] or type(exc).__name__
    finally:
        shutil.rmtree(raw_dir, ignore_errors=True)
    raise RuntimeError("every ONNX exporter failed: " + "; ".join(f"{k}: {v}" for k, v in attempts.items()))


def rename_value(graph, old: str, new: str) -> None:
    """Rename a value everywhere in the graph (producers, consumers, outputs, value_info). Graph inputs
    keep their names: they are the spec's input names, what clients send."""
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name == old:
                node.output[i] = new
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
    for collection in (graph.output, graph.value_info):
        for value in collection:
            if value.name == old:
                value.name = new


def rename_outputs(graph, output_names: list[str]) -> None:
    """Give the graph's outputs the spec's names. An output that is a graph input or a weight (a model
    returning its input unchanged) or one already given another name (a value returned twice) gets an
    Identity node: renaming it would rename the input too, or name two outputs alike (not SSA)."""
    import onnx

    if len(graph.output) != len(output_names):
        raise ValueError(f"exported graph has {len(graph.output)} outputs, spec lists {len(output_names)}")
    # the dynamo exporter echoes a returned input as Identity(x) -> x, a value defined twice
    nodes = [n for n in graph.node if not (n.op_type == "Identity" and list(n.input) == list(n.output))]
    if len(nodes) != len(graph.node):
        del graph.node[:]
        graph.node.extend(nodes)
    inputs = {i.name for i in graph.input}
    used = {n for node in graph.node for n in (*node.input, *node.output)} | {t.name for t in graph.initializer}
    for wanted, have in zip(output_names, [o.name for o in graph.output]):
        if wanted != have and wanted in used and wanted not in inputs:
            # an internal value or a weight already carries the name we want (a buffer named 'const' beside an
            # output 'const': two values of one name, and shape inference failed the export): move it aside
            rename_value(graph, wanted, f"{wanted}__internal")
            for weight in graph.initializer:
                if weight.name == wanted:
                    weight.name = f"{wanted}__internal"
    sources = inputs | {t.name for t in graph.initializer}
    named: set[str] = set()
    for output, wanted in zip(graph.output, output_names):
        have = output.name
        if have in sources or (have in named and have != wanted):
            graph.node.append(onnx.helper.make_node("Identity", [have], [wanted], name=f"{wanted}__identity"))
            output.name = wanted
        elif wanted != have:
            rename_value(graph, have, wanted)
        named.add(wanted)


def finalize_onnx(path: Path, output_names: list[str], rename: bool, dest: Path | None = None, spec=None) -> int:
    """Rename outputs to the spec's names (moving clashing internal names aside), give back the spec inputs
    the exporter dropped (``spec``: an export of the spec's model), run the checker and shape inference,
    save (external data for large weights), return the default-domain opset."""
    import copy

    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    if rename:
        rename_outputs(graph, output_names)
    present = {i.name for i in graph.input}
    missing = [t for t in spec.inputs if t.name not in present] if spec is not None else []
    if missing:
        # an input forward() never reads is dropped by the exporters, but the config lists every spec input:
        # Triton's onnxruntime backend refuses a config input the graph lacks ("unexpected inference input").
        # Given back as a graph input no node reads (onnxruntime takes a feed for it and ignores it), at
        # the spec's dtype and dims (-1: symbolic), in the spec's order
        batch = next((i.type.tensor_type.shape.dim[0].dim_param for i in graph.input
                      if spec.batching and i.type.tensor_type.shape.dim), "") or "batch"
        for t in missing:
            dims = [batch] if spec.batching else []
            dims += [d if d != -1 else f"{t.name}_dim{i}" for i, d in enumerate(t.shape)]
            graph.input.append(onnx.helper.make_tensor_value_info(
                t.name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), dims))
        order = {t.name: i for i, t in enumerate(spec.inputs)}
        ordered = sorted((copy.deepcopy(i) for i in graph.input), key=lambda i: order.get(i.name, len(order)))
        del graph.input[:]
        graph.input.extend(ordered)
    model = onnx.shape_inference.infer_shapes(model)
    target = dest or path
    weights = sum(len(t.raw_data) for t in graph.initializer)
    if target.exists() and target != path:
        target.unlink()
    # the weights are in memory now; onnx appends to an existing data file, and a model saved inline
    # would leave it behind (published beside the model, unused)
    target.with_name(target.name + ".data").unlink(missing_ok=True)
    onnx.save_model(model, str(target), save_as_external_data=weights > EXTERNAL_DATA_THRESHOLD,
                    location=target.name + ".data", all_tensors_to_one_file=True)
    onnx.checker.check_model(str(target), full_check=True)
    return next((op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), 0)


# ------------------------------------------------------------------------------------------------
# calibration data (stage quantize; stage openvino)


def calibration_samples(ctx: BuildContext) -> tuple[dict[str, np.ndarray] | list[dict[str, np.ndarray]], str]:
    """The calibration inputs and a sentence saying where they came from.

    Batched specs: {input: array[N, ...]}. Unbatched specs: a list of per-sample feeds."""
    spec = ctx.spec
    wanted = spec.quantization.calibration_samples
    names = [t.name for t in spec.inputs]
    data, where = None, ""
    if spec.data.calibration is not None:
        with np.load(spec.data.calibration, allow_pickle=False) as archive:
            data = {t.name: archive[t.name].astype(t.dtype) for t in spec.inputs}
        where = f"data.calibration ({spec.data.calibration.name})"
    elif ctx.reference is not None and ctx.reference.validation_inputs is not None:
        data = {n: ctx.reference.validation_inputs[n] for n in names}
        where = "the validation inputs (data.validation; no data.calibration given)"
    if data is not None and not spec.batching:
        return [data], where + ", 1 sample (the model has no batch dimension)"
    if data is not None:
        count = min(wanted, len(next(iter(data.values()))))
        return {n: np.ascontiguousarray(v[:count]) for n, v in data.items()}, f"{where}, {count} samples"
    rng = np.random.default_rng(spec.verify.seed + 7)
    dyn = "opt" if spec.has_dynamic_dims else 0
    where = (f"{wanted} generated samples (no data.calibration or data.validation: random inputs by each input's "
             "rule, see the build report's Generated inputs; real data calibrates better)")
    if spec.batching:
        return generated_inputs(spec, wanted, dyn, rng), where
    return [generated_inputs(spec, None, dyn, rng) for _ in range(wanted)], where
