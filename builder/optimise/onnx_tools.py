"""ONNX helpers the optimising stages share (optimize, quantize): load/save with external data,
onnxruntime's offline graph optimisation, onnxoptimizer + onnxslim passes and FP16 conversion.

Usage::

    model = load(path)
    model = clean_value_info(model)                      # drop value_info that shadows initializers
    passes = standard_passes(model_in, model_out)        # onnxoptimizer + onnxslim, returns what ran
    ort_optimize(src, dst, "extended")                   # onnxruntime offline optimisation
    save(to_float16(load(src)), dst)                     # FP16 weights, FP32 inputs/outputs

Everything heavy (onnx, onnxruntime, onnxoptimizer, onnxslim) is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np

EXTERNAL_DATA_THRESHOLD = 1 << 30  # bytes of weights above which they go to <file>.data beside the model
ORT_LEVELS = ("basic", "extended", "all")
# onnxoptimizer passes that only fold or remove (never change numerics beyond float rounding)
OPTIMIZER_PASSES = ("eliminate_identity", "eliminate_nop_dropout", "eliminate_nop_cast", "eliminate_nop_transpose",
                    "eliminate_nop_pad", "fuse_bn_into_conv", "fuse_add_bias_into_conv",
                    "fuse_matmul_add_bias_into_gemm", "fuse_consecutive_transposes", "eliminate_deadend",
                    "eliminate_unused_initializer")


def load(path: Path):
    import onnx

    return onnx.load(str(path))


def weight_bytes(model) -> int:
    return sum(len(t.raw_data) for t in model.graph.initializer)


def save(model, path: Path) -> Path:
    """Save beside any old copy; weights over 1 GiB go to ``<name>.data`` (protobuf's 2 GiB limit)."""
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    for old in (path, path.with_name(path.name + ".data")):
        if old.exists():
            old.unlink()
    onnx.save_model(model, str(path), save_as_external_data=weight_bytes(model) > EXTERNAL_DATA_THRESHOLD,
                    location=path.name + ".data", all_tensors_to_one_file=True)
    return path


def external_tensors(model) -> list:
    """The tensors (initializers and attribute tensors, in subgraphs too) whose data lies outside the file."""
    # onnx has no public walk over every tensor; this private one is what its own save/load use
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return [t for t in _get_all_tensors(model) if uses_external_data(t)]


# onnx's own layout for large tensors: each starts on the allocation granularity, so it can be mapped
_ALIGN_FROM, _ALIGNMENT = 1 << 20, 1 << 16


def copy_with_external_data(src: Path, dst: Path) -> None:
    """Copy an ONNX model to ``dst`` with all its external data in one ``<dst name>.data`` (the layout
    every later stage and the published version use), whatever files and folders the source spread it
    over (stage load checked they exist, inside the model's folder). Bytes are copied tensor by tensor,
    never parsed."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    tensors = external_tensors(model)
    if not tensors:
        shutil.copyfile(src, dst)
        return
    data = dst.with_name(dst.name + ".data")
    with open(data, "wb") as out:
        for tensor in tensors:
            info = {e.key: e.value for e in tensor.external_data}
            offset, length = int(info.get("offset") or 0), info.get("length")
            with open(src.parent / info["location"], "rb") as handle:
                handle.seek(offset)
                chunk = handle.read(int(length)) if length is not None else handle.read()
            if len(chunk) >= _ALIGN_FROM and out.tell() % _ALIGNMENT:
                out.write(b"\0" * (_ALIGNMENT - out.tell() % _ALIGNMENT))
            entries = {"location": data.name, "offset": str(out.tell()), "length": str(len(chunk))}
            out.write(chunk)
            del tensor.external_data[:]
            for key, value in entries.items():
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
    onnx.save_model(model, str(dst))


def op_types(model) -> set[str]:
    return {node.op_type for node in model.graph.node}


def macs_by_op(model, op_types) -> dict[str, int]:
    """Multiply-adds per sample of each of ``op_types``, summed per op type: a node's weight elements (its
    initializers) times the positions it applies them at (a Conv's output pixels, a MatMul's tokens), from the
    graph's inferred shapes; a position count the shapes leave open counts 1 (the weights alone)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a graph shape inference cannot take: weights alone
        inferred = model
    shapes = {}
    for info in list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = info.type.tensor_type.shape.dim
        shapes[info.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    sizes = {t.name: int(np.prod(t.dims)) if t.dims else 1 for t in model.graph.initializer}
    counts = {op: 0 for op in op_types}
    for node in model.graph.node:
        if node.op_type not in counts:
            continue
        weights = sum(sizes.get(name, 0) for name in node.input)
        out = shapes.get(node.output[0]) or []
        # per sample: a Conv's [N, C, *spatial] applies its kernel at every output pixel; a MatMul's [N, *rows, cols]
        # its weight at every row (token)
        between = out[2:] if node.op_type.startswith("Conv") else out[1:-1]
        positions = int(np.prod([d for d in between if d])) if between else 1
        counts[node.op_type] += weights * max(positions, 1)
    return counts


def clean_value_info(model):
    """Drop value_info entries that name initializers: exporters record weight shapes there, and
    onnxruntime's quantizer, which rewrites (transposes) weights, then fails shape inference with
    'Inferred shape and existing shape differ'."""
    initializers = {t.name for t in model.graph.initializer}
    keep = [v for v in model.graph.value_info if v.name not in initializers]
    del model.graph.value_info[:]
    model.graph.value_info.extend(keep)
    return model


def standard_passes(model) -> tuple[Any, list[str]]:
    """onnxoptimizer's folding passes (BN into Conv, ...) then onnxslim (constant folding, dead code,
    the Cast/Add/Sqrt/Div/Mul left behind by ``fuse_bn_into_conv``). Standard ONNX ops only.
    Returns (model, names of the passes that ran; a failing tool is recorded and skipped)."""
    import onnx

    ran: list[str] = []
    interface = [copy.deepcopy(i) for i in model.graph.input
                 if i.name not in {init.name for init in model.graph.initializer}]
    try:
        import onnxoptimizer

        available = set(onnxoptimizer.get_available_passes())
        passes = [p for p in OPTIMIZER_PASSES if p in available]
        candidate = onnxoptimizer.optimize(model, passes)
        onnx.checker.check_model(candidate)
        model = candidate
        ran.append("onnxoptimizer:" + ",".join(passes))
    except Exception as exc:  # noqa: BLE001 - an optimiser bug must not stop the build
        ran.append(f"onnxoptimizer skipped ({short_error(exc)})")
    try:
        import onnxslim

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            candidate = onnxslim.slim(model)
        if candidate is None:
            raise RuntimeError("onnxslim returned nothing")
        model = candidate
        ran.append("onnxslim")
    except Exception as exc:  # noqa: BLE001
        ran.append(f"onnxslim skipped ({short_error(exc)})")
    _keep_inputs(model, interface)
    return model, ran


def _keep_inputs(model, interface) -> None:
    """Put back the graph inputs a pass removed as dead (an input forward() never reads): config.pbtxt
    declares every spec input, and Triton's onnxruntime backend refuses a model missing one."""
    present = {i.name: i for i in model.graph.input}
    if all(i.name in present for i in interface):
        return
    rest = [i for i in model.graph.input if i.name not in {j.name for j in interface}]
    ordered = [present.get(i.name, i) for i in interface] + rest
    del model.graph.input[:]
    model.graph.input.extend(ordered)


def ort_optimize(src: Path, dst: Path, level: str, threads: int | None = None) -> None:
    """onnxruntime's offline graph optimisation at ``level`` (basic | extended | all), saved to ``dst``.
    Levels above basic may use onnxruntime-only ops (com.microsoft domain, e.g. FusedConv); "all" also
    bakes in this CPU's data layout (NCHWc), so it should only be used on the machine that serves."""
    import onnxruntime as ort

    if level not in ORT_LEVELS:
        raise ValueError(f"unknown onnxruntime optimisation level {level!r}; use one of {ORT_LEVELS}")
    options = ort.SessionOptions()
    options.graph_optimization_level = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    options.optimized_model_filepath = str(dst)
    options.log_severity_level = 3  # errors only: the "hardware specific" warning is documented above
    if threads:
        options.intra_op_num_threads = threads
    data = src.with_name(src.name + ".data")
    if data.exists() and data.stat().st_size > EXTERNAL_DATA_THRESHOLD:
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                         dst.name + ".data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                         "1024")
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    if not dst.is_file():
        raise RuntimeError(f"onnxruntime did not write the optimised model to {dst}")


def run_quietly(path: Path, feeds: dict[str, Any]) -> list:
    """Run an ONNX model once on CPU with onnxruntime; its logging is off, so a failing run is only the
    exception it raises (onnxruntime would also print each error in colour on stderr)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: level 3 still prints the failing node's error
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    run_options = ort.RunOptions()
    run_options.log_severity_level = 4
    return session.run(None, feeds, run_options)


def to_float16(model, keep_io_types: bool = True):
    """FP16 weights and compute; with ``keep_io_types`` the graph inputs/outputs stay FP32 (Casts at
    the boundaries). Uses onnxruntime's converter (onnxruntime.transformers.float16), which keeps
    ops without FP16 kernels (e.g. Resize, Range) in FP32."""
    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError as exc:  # pragma: no cover - part of the onnxruntime wheel
        raise RuntimeError(f"onnxruntime.transformers.float16 is not importable ({exc})") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return convert_float_to_float16(model, keep_io_types=keep_io_types, disable_shape_infer=False)


def short_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text or type(exc).__name__)[:200]


@contextlib.contextmanager
def quiet_quantizer():
    """onnxruntime's quantizers warn through the root logger (``logging.warning``): with no handler that
    installs basicConfig for good and prints multi-line ``WARNING:root:`` protobuf dumps (~100 lines for
    one LayerNorm model) into the build's output. A handler for the call keeps basicConfig out, and
    errors still get through."""
    root = logging.getLogger()
    quiet, level = logging.StreamHandler(), root.level  # stderr, as basicConfig's would be
    root.addHandler(quiet)
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.removeHandler(quiet)
        root.setLevel(level)
