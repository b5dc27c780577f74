"""onnxruntime's quantisation calls in one place: pre-processing, quantize_static with a recipe (builder/
quant_search.py Candidate) on calibration batches, quantize_dynamic (fused transformer ops included), and the
file moves around them. Stage quantize decides what to quantize and judges the results; this only calls.

Usage::

    prepared = preprocess(source, work / "preprocessed.onnx", passes, notes)
    quantize_static(prepared, work / "model.onnx", candidate, samples, batch=16, large=False,
                    calibration_cache=work / "calibration")  # recipes that calibrate alike calibrate once
    quantize_dynamic(prepared, work / "model.onnx", candidate, large=False, fused=("Attention",))
    quantized_ops(onnx.load("model.onnx"))  # quantized values in a graph (a QDQ pair is one)
    kept = KeptRecipes(work)  # a search's passing models, reused rather than quantized again
    kept.keep(candidate, work / "trial.onnx"); kept.take(candidate, work / "model.onnx"); kept.clear()
"""

from __future__ import annotations

import contextlib
import inspect
import io
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from builder.optimise import onnx_tools

if TYPE_CHECKING:
    from builder.optimise.quant_search import Candidate


def feeds(samples, batch: int) -> list[dict[str, np.ndarray]]:
    """Equal-sized batches (the entropy and percentile calibrators stack them): the largest batch
    size up to ``batch`` that divides the sample count."""
    if isinstance(samples, list):
        return list(samples)
    count = len(next(iter(samples.values())))
    batch = next(b for b in range(min(batch, count), 0, -1) if count % b == 0)
    return [{k: v[i:i + batch] for k, v in samples.items()} for i in range(0, count, batch)]


def reader(feeds: list[dict[str, np.ndarray]]):
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._feeds = iter(feeds)

        def get_next(self):
            return next(self._feeds, None)

        def rewind(self) -> None:
            self._feeds = iter(feeds)

    return Reader()


def move_model(source: Path, target: Path) -> None:
    for suffix in ("", ".data"):
        path = source.with_name(source.name + suffix)
        if path.exists():
            path.replace(target.with_name(target.name + suffix))


def quantize_dynamic(prepared: Path, target: Path, cand, large: bool, only: list[str] | None = None,
                      fused: tuple[str, ...] = ()) -> None:
    """``fused``: onnxruntime's fused ops in the graph to quantize too (Attention); their outputs have no type
    shape inference knows (com.microsoft domain), so float is said to be the default."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with warnings.catch_warnings(), onnx_tools.quiet_quantizer():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(prepared), str(target), op_types_to_quantize=[*cand.op_types, *fused],
                         per_channel=cand.per_channel, reduce_range=cand.reduce_range,
                         weight_type=QuantType.QInt8 if cand.weight_type == "S8" else QuantType.QUInt8,
                         nodes_to_exclude=_after_gemm_rewrite(cand.exclude),
                         nodes_to_quantize=_after_gemm_rewrite(only or []),
                         use_external_data_format=large,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT} if fused else {})


def _after_gemm_rewrite(names) -> list[str]:
    """Node names as quantize_dynamic matches them: it rewrites every Gemm G as a MatMul "G_MatMul" and an Add
    before it quantizes, so a Gemm named to keep in FP32 (or to quantize alone) would match nothing."""
    return [*names, *(f"{name}_MatMul" for name in names)]


def quantize_static(prepared: Path, target: Path, cand: "Candidate", samples, batch: int,
                     large: bool, only: list[str] | None = None, calibration_cache: Path | None = None) -> None:
    """quantize_static with one candidate's recipe (``only``: quantise just these nodes). ``calibration_cache``:
    a folder where the activation ranges of each calibration (method, samples, op types) are kept, so that
    recipes differing only in how they quantize (types, reduce_range, per-channel, format, FP32 nodes) reuse
    them instead of running the calibration again (onnxruntime's calibration_cache_path, where it has one)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    types = {"S8": QuantType.QInt8, "U8": QuantType.QUInt8}
    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
              "percentile": CalibrationMethod.Percentile}[cand.calibration]
    if cand.samples:
        samples = (samples[:cand.samples] if isinstance(samples, list)
                   else {k: v[:cand.samples] for k, v in samples.items()})
    options = {"nodes_to_exclude": list(cand.exclude)}
    if cand.op_types:
        options["op_types_to_quantize"] = list(cand.op_types)
    if only is not None:
        options["nodes_to_quantize"] = only
    if calibration_cache is not None and "calibration_cache_path" in inspect.signature(quantize_static).parameters:
        calibration_cache.mkdir(parents=True, exist_ok=True)
        options["calibration_cache_path"] = str(calibration_cache / calibration_key(cand))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), onnx_tools.quiet_quantizer():
        warnings.simplefilter("ignore")
        quantize_static(str(prepared), str(target), reader(feeds(samples, batch)),
                        quant_format=QuantFormat.QDQ if cand.quant_format == "QDQ" else QuantFormat.QOperator,
                        per_channel=cand.per_channel, reduce_range=cand.reduce_range,
                        activation_type=types[cand.activation_type], weight_type=types[cand.weight_type],
                        calibrate_method=method, use_external_data_format=large, **options)


def calibration_key(cand: "Candidate") -> str:
    """The file name of a calibration's ranges: what the calibration itself depends on (the method, the sample
    count and the op types whose tensors it observes), not how the recipe quantizes with them."""
    ops = "+".join(cand.op_types) if cand.op_types else "all"
    return f"{cand.calibration}-{cand.samples or 'all'}-{ops}.json"


def remove(*paths: Path) -> None:
    for path in paths:
        for leftover in (path, path.with_name(path.name + ".data")):
            leftover.unlink(missing_ok=True)


def preprocess(source: Path, target: Path, passes: list[str], notes: list[str]) -> Path:
    """onnxruntime's recommended pre-processing; a model it cannot handle is quantized as it is."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    errors = []
    for skip_symbolic in (False, True):
        try:
            # symbolic shape inference dumps sym_shape_infer_temp.onnx (+ data) into the working directory
            # when it gives up: keep that inside the build's work folder
            with warnings.catch_warnings(), contextlib.chdir(target.parent):
                warnings.simplefilter("ignore")
                quant_pre_process(str(source), str(target), skip_symbolic_shape=skip_symbolic)
            passes.append("quant_pre_process" + (" (symbolic shape inference skipped)" if skip_symbolic else ""))
            return target
        except Exception as exc:  # noqa: BLE001 - recorded; the next attempt is simpler
            errors.append(onnx_tools.short_error(exc))
    notes.append(f"quant_pre_process failed, quantized without it: {errors[-1]}")
    return source


def quantized_op_types(model) -> dict[str, int]:
    """{op type: count} of the INT8 nodes in a quantized graph (QDQ pairs, QLinear*, *Integer,
    DynamicQuantize*, QAttention): what a quantizer really did, whatever op types it was asked for."""
    found: dict[str, int] = {}
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear", "QAttention") or n.op_type.startswith(
                ("QLinear", "DynamicQuantize")) or n.op_type.endswith("Integer"):
            found[n.op_type] = found.get(n.op_type, 0) + 1
    return found


def quantized_ops(model) -> int:
    found = quantized_op_types(model)
    return sum(found.values()) - found.get("DequantizeLinear", 0)  # a QDQ pair is one quantized value


class KeptRecipes:
    """The quantized models of passing recipes, by recipe, in ``folder``. A model with external data (over
    onnx_tools.EXTERNAL_DATA_THRESHOLD) is not kept: one copy per recipe would fill the disk; it is quantized
    again where needed."""

    def __init__(self, folder: Path):
        self.folder, self.models = folder, {}

    def keep(self, cand, model: Path) -> None:
        if model.with_name(model.name + ".data").exists() or cand in self.models:
            return
        target = self.folder / f"recipe{len(self.models)}.onnx"
        move_model(model, target)
        self.models[cand] = target

    def path(self, cand) -> Path | None:
        return self.models.get(cand)

    def take(self, cand, target: Path) -> bool:
        """Move the kept model of ``cand`` to ``target``; False when there is none."""
        if cand not in self.models:
            return False
        move_model(self.models.pop(cand), target)
        return True

    def clear(self) -> None:
        remove(*self.models.values())
        self.models.clear()


def _cut(fp32, quantized, node_name: str):
    """(index of ``node_name`` in ``fp32``, the nodes of ``quantized`` that compute its outputs, the initializers
    they add), or None where the cut is not clean (a name clash, a node the quantizer did not touch).
    ``quantized``: the same graph with every node quantized by quantize_dynamic, which keeps each node's output
    names and computes them from the same inputs."""
    names = [n.name for n in fp32.graph.node]
    if node_name not in names:
        return None
    index = names.index(node_name)
    node = fp32.graph.node[index]
    produced_here = {t for i, n in enumerate(fp32.graph.node) if i != index for t in n.output}
    available = produced_here | {t.name for t in fp32.graph.input} | {t.name for t in fp32.graph.initializer}
    producers = {t: n for n in quantized.graph.node for t in n.output}
    weights = {t.name: t for t in quantized.graph.initializer}
    cut, needed, seen = [], list(node.output), set()
    while needed:
        tensor = needed.pop()
        if tensor in seen or tensor in available or tensor == "":
            continue
        seen.add(tensor)
        if tensor in weights:
            continue
        producer = producers.get(tensor)
        if producer is None or any(t in produced_here for t in producer.output):
            return None
        if all(p is not producer for p in cut):
            cut.append(producer)
            needed.extend(producer.input)
    if not cut or any(p.op_type == node.op_type and list(p.input) == list(node.input) for p in cut):
        return None  # the quantizer left this node as it was
    order = {id(n): i for i, n in enumerate(quantized.graph.node)}
    return index, sorted(cut, key=lambda n: order[id(n)]), [weights[t] for t in sorted(seen) if t in weights]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _field_head(number: int, length: int) -> bytes:
    """The tag and length of a length-delimited protobuf field. A serialized message is its fields one after
    another, and a field that comes twice merges (repeated ones append), so a model can be written in parts."""
    return _varint((number << 3) | 2) + _varint(length)


GRAPH_FIELD, INITIALIZER_FIELD = 7, 5  # ModelProto.graph, GraphProto.initializer


class OneNodeAtATime:
    """``quantize(cand, target, only=None)`` for a search whose per-node sensitivities quantize one node at a time
    (quant_search.rank_nodes): each such model is the FP32 graph with that node's quantized form cut from one
    quantization of every node (``_cut``), written from serialized parts - what
    ``quantize_dynamic(nodes_to_quantize=[node])`` makes, without its two shape inferences and saves of the whole
    model per node (all-MiniLM-L6-v2: 0.07 vs 0.75 s a node). The first cut is checked against ``quantize``'s
    own single-node model (the same op types and weights); a difference, or a cut that is not clean, goes back
    to ``quantize``. Every other call is ``quantize``'s."""

    def __init__(self, quantize, prepared: Path, folder: Path):
        self.quantize, self.prepared, self.folder = quantize, prepared, folder
        self.fp32, self.every_node, self.trusted = None, {}, None
        self.weight_bytes: dict[str, bytes] = {}  # each FP32 initializer as a serialized GraphProto field

    def __call__(self, cand, target: Path, only: list[str] | None = None) -> None:
        first = self.trusted is None
        cut = target.with_name(target.name + ".cut") if first else target
        if not (only is not None and len(only) == 1 and self.trusted is not False and self._write(cand, only[0], cut)):
            return self.quantize(cand, target, only)
        if first:
            self.quantize(cand, target, only)
            self.trusted = _same_graph(cut, target)
            if self.trusted:
                cut.replace(target)
            remove(cut)

    def _write(self, cand, node: str, target: Path) -> bool:
        import onnx

        if self.fp32 is None:
            self.fp32 = onnx.load(str(self.prepared))
            for tensor in self.fp32.graph.initializer:
                data = tensor.SerializeToString()
                self.weight_bytes[tensor.name] = _field_head(INITIALIZER_FIELD, len(data)) + data
        if cand not in self.every_node:
            path = self.folder / "every_node.onnx"
            self.quantize(cand, path)
            self.every_node[cand] = onnx.load(str(path))
            remove(path)
        quantized = self.every_node[cand]
        parts = None if self.fp32.graph.sparse_initializer else _cut(self.fp32, quantized, node)
        if parts is None:
            return False
        index, cut, added = parts
        nodes = [*self.fp32.graph.node[:index], *cut, *self.fp32.graph.node[index + 1:]]
        used = {t for n in nodes for t in n.input}
        head = onnx.ModelProto(ir_version=quantized.ir_version, opset_import=quantized.opset_import,
                               producer_name=self.fp32.producer_name, functions=self.fp32.functions)
        graph = onnx.GraphProto(name=self.fp32.graph.name, input=self.fp32.graph.input,
                                output=self.fp32.graph.output, node=nodes)
        ours = {t.name for t in added}
        parts = [graph.SerializeToString(),
                 *(data for name, data in self.weight_bytes.items() if name in used and name not in ours)]
        for tensor in added:
            data = tensor.SerializeToString()
            parts += [_field_head(INITIALIZER_FIELD, len(data)), data]
        with open(target, "wb") as out:  # written in parts: no copy of the whole model in memory
            out.write(head.SerializeToString() + _field_head(GRAPH_FIELD, sum(len(p) for p in parts)))
            for part in parts:
                out.write(part)
        return True


def _same_graph(path: Path, other_path: Path) -> bool:
    import onnx

    model, other = (onnx.load(str(p), load_external_data=False) for p in (path, other_path))
    kinds = lambda m: sorted(n.op_type for n in m.graph.node)  # noqa: E731
    weights = lambda m: sorted(t.name for t in m.graph.initializer)  # noqa: E731
    return kinds(model) == kinds(other) and weights(model) == weights(other)
