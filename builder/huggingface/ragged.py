"""Ragged batching for a text pipeline's model step: requests of any length batch together.

Triton's dynamic batcher merges only requests whose inputs have equal shapes, and texts differ in length.
An input that allows ragged batches (``allow_ragged_batch: true``) lifts that: the onnxruntime backend then hands
the graph such an input as ONE flat vector of the whole batch's tokens, and a ``batch_input`` of kind
BATCH_ITEM_SHAPE ([rows, 1] INT32: each row's width) says where each row ends. ``ragged_graph`` puts the inverse
in front of the verified graph - the flat tokens back into a padded [rows, longest] batch (ids padded with the
pad id, every other input with 0, so the attention mask hides the padding) - and leaves the model itself as it
was. Each batch is padded to its own longest text: the least padding any batch of those texts can have, and no
tokenizer delay or length buckets are needed for requests to meet in one batch.

    W     = Reshape(Cast(ragged_item_shape))              INT64 [rows]        each row's width
    start = CumSum(W, exclusive)                          INT64 [rows]        where each row starts in the flat input
    pos   = Range(0, ReduceMax(W))                        INT64 [longest]
    valid = pos[None, :] < W[:, None]                     BOOL  [rows, longest]
    X     = Where(valid, Gather(X_flat, Where(valid, start[:, None] + pos[None, :], 0)), pad)

Only where every output is per text (no sequence dimension: classification, pooled embeddings): Triton splits
a batch's outputs by rows, and a per-token output would reach each request padded to the batch's longest text.

Usage::

    why = ragged_refusal(config, files, tags_tokens=False)      # None: the model step can take ragged batches
    ragged_graph(Path("model.onnx"), Path("ragged/model.onnx"), {"input_ids": 0, "attention_mask": 0})
    config = ragged_config(config)                               # allow_ragged_batch + the batch_input
    why = ragged_mismatch(Path("model.onnx"), Path("ragged/model.onnx"), padded_inputs, "attention_mask")
    config, files, why = with_ragged_batch(config, files, False, pad_id, validation_inputs, work)  # all of the above
    rate, how = served_text_rate(bench, takes_ragged("onnx", "onnxruntime_onnx", False, names, True), lengths, buckets)
    text = pinned_config(text, 1, header, ragged=version_ragged(folder / "1"))  # rollback: config matched to graph
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper
from tritonclient.grpc import model_config_pb2

from builder.huggingface.texts import bucket_decision, bucket_inflation
from builder.model.runtime import RAGGED_ITEM_SHAPE as ITEM_SHAPE, ragged_feeds
from builder.repository.config import BatchInput, ModelConfig

INTEGER_TYPES = ("TYPE_INT64", "TYPE_INT32")
MIN_OPSET = 13  # the prelude's Unsqueeze takes its axes as an input from opset 13 on


def ragged_refusal(config: ModelConfig, files: list[Path], tags_tokens: bool) -> str | None:
    """Why this model step cannot take ragged batches (it is published padded as before), or None."""
    if config.backend != "onnxruntime_onnx":
        return f"the model step is served by {config.backend}, and ragged batches are built for onnxruntime's backend"
    if tags_tokens:
        return "token tags are per token: Triton would hand each request the batch's padded length"
    if config.max_batch_size == 0 or config.dynamic_batching is None:
        return "the model step does not batch (no dynamic_batching)"
    if any(t.name == ITEM_SHAPE for t in (*config.inputs, *config.outputs)):
        return f"the model already has a tensor named {ITEM_SHAPE}"
    flat = [t.name for t in config.inputs
            if t.dims != [-1] or t.reshape is not None or t.data_type not in INTEGER_TYPES]
    if flat:
        return f"inputs {flat} are not token sequences (integer, dims [-1])"
    if not any(t.name == "attention_mask" for t in config.inputs):
        return "the model takes no attention_mask, so the padding of a batch's longer texts would change its answers"
    per_token = [t.name for t in config.outputs if -1 in t.dims]
    if per_token:
        return f"outputs {per_token} have a sequence dimension"
    if len(files) != 1 or files[0].suffix != ".onnx":
        return "the graph is not one .onnx file"
    model = onnx.load(str(files[0]), load_external_data=False)
    if any(init.data_location == TensorProto.EXTERNAL for init in model.graph.initializer):
        return "the graph keeps its weights in external data files"
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < MIN_OPSET:
        return f"the graph's opset {opset} is below {MIN_OPSET} (Unsqueeze with axes as an input)"
    ranks = {i.name: len(i.type.tensor_type.shape.dim) for i in model.graph.input}
    odd = [t.name for t in config.inputs if ranks.get(t.name) != 2]
    if odd:
        return f"graph inputs {odd} are not [batch, sequence]"
    return None


def _constant(name: str, values: list[int] | int, data_type: int = TensorProto.INT64):
    dims = [len(values)] if isinstance(values, list) else []
    data = values if isinstance(values, list) else [values]
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, data_type, dims, data))


def ragged_graph(src: Path, dst: Path, pads: dict[str, int]) -> None:
    """Write ``src`` with its inputs in ``pads`` taken ragged (flat tokens + ITEM_SHAPE) to ``dst``; each is padded
    back to [rows, longest] with its pad value before the original graph reads it."""
    model = onnx.load(str(src))
    graph = model.graph
    types = {i.name: i.type.tensor_type.elem_type for i in graph.input}
    unknown = sorted(set(pads) - set(types))
    if unknown:
        raise ValueError(f"{src}: no graph inputs {unknown}")
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in pads:
                node.input[index] = f"{name}__padded"
    nodes = [_constant("ragged__zero", 0), _constant("ragged__one", 1), _constant("ragged__flat", [-1]),
             _constant("ragged__axis0", [0]), _constant("ragged__axis1", [1]),
             helper.make_node("Cast", [ITEM_SHAPE], ["ragged__shape"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["ragged__shape", "ragged__flat"], ["ragged__width"]),
             helper.make_node("CumSum", ["ragged__width", "ragged__zero"], ["ragged__start"], exclusive=1),
             helper.make_node("ReduceMax", ["ragged__width"], ["ragged__longest"], keepdims=0),
             helper.make_node("Range", ["ragged__zero", "ragged__longest", "ragged__one"], ["ragged__positions"]),
             helper.make_node("Unsqueeze", ["ragged__positions", "ragged__axis0"], ["ragged__columns"]),
             helper.make_node("Unsqueeze", ["ragged__start", "ragged__axis1"], ["ragged__row_start"]),
             helper.make_node("Unsqueeze", ["ragged__width", "ragged__axis1"], ["ragged__row_width"]),
             helper.make_node("Add", ["ragged__row_start", "ragged__columns"], ["ragged__index"]),
             helper.make_node("Less", ["ragged__columns", "ragged__row_width"], ["ragged__valid"]),
             helper.make_node("Where", ["ragged__valid", "ragged__index", "ragged__zero"], ["ragged__gather"])]
    for name, pad in pads.items():
        nodes += [helper.make_node("Gather", [name, "ragged__gather"], [f"{name}__rows"], axis=0),
                  _constant(f"{name}__pad", int(pad), types[name]),
                  helper.make_node("Where", ["ragged__valid", f"{name}__rows", f"{name}__pad"], [f"{name}__padded"])]
    for node in reversed(nodes):
        graph.node.insert(0, node)
    for graph_input in graph.input:
        if graph_input.name in pads:
            shape = graph_input.type.tensor_type.shape
            shape.ClearField("dim")
            shape.dim.add().dim_param = "ragged_tokens"
    graph.input.append(helper.make_tensor_value_info(ITEM_SHAPE, TensorProto.INT32, ["ragged_rows", 1]))
    if not any(o.domain in ("", "ai.onnx") and o.version >= MIN_OPSET for o in model.opset_import):
        raise ValueError(f"{src}: opset below {MIN_OPSET}: the prelude's Unsqueeze needs its axes as an input")
    onnx.checker.check_model(model)
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))


def ragged_config(config: ModelConfig) -> ModelConfig:
    """``config`` with its (sequence) inputs ragged and the batch_input the ragged graph reads."""
    inputs = [dataclasses.replace(t, ragged=True) for t in config.inputs]
    return dataclasses.replace(config, inputs=inputs, batch_inputs=[
        BatchInput("BATCH_ITEM_SHAPE", ITEM_SHAPE, "TYPE_INT32", inputs[0].name)])


def ragged_mismatch(original: Path, ragged: Path, padded: dict[str, np.ndarray], mask: str | None) -> str | None:
    """Whether the ragged graph answers as ``original`` on ``padded`` ([rows, width] inputs): each row is sent as
    its own request at its own length (the mask's ones, else the whole row), all of them in one ragged batch and
    each alone (so a graph whose answer depends on how much padding it gets cannot pass).
    None when every output agrees (floats to 1e-4 relative, 1e-5 absolute; strings exactly), else how not."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    plain = ort.InferenceSession(str(original), options, providers=["CPUExecutionProvider"])
    wrapped = ort.InferenceSession(str(ragged), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in plain.get_inputs()]
    outputs = [o.name for o in plain.get_outputs()]
    expected = plain.run(outputs, {n: padded[n] for n in names})
    rows = len(padded[names[0]])
    lengths = padded[mask].sum(axis=1) if mask in padded else np.full(rows, padded[names[0]].shape[1])
    requests = [{n: padded[n][r:r + 1, :max(1, int(lengths[r]))] for n in names} for r in range(rows)]
    together = wrapped.run(outputs, ragged_feeds(requests, names))
    alone = [wrapped.run(outputs, ragged_feeds([r], names)) for r in requests]
    for index, name in enumerate(outputs):
        want = expected[index]
        for how, have in (("in one batch", together[index]),
                          ("each alone", np.concatenate([a[index] for a in alone]))):
            if want.dtype.kind in "OUS":
                same = np.array_equal(want, have)
            else:
                same = want.shape == have.shape and np.allclose(have, want, rtol=1e-4, atol=1e-5)
            if not same:
                worst = "" if want.dtype.kind in "OUS" or want.shape != have.shape else \
                    f" (max abs difference {float(np.abs(have - want).max()):.3g})"
                return (f"output {name} differs from the padded graph's on {rows} texts at their own lengths, "
                        f"{how}{worst}")
    return None


def with_ragged_batch(config: ModelConfig, files: list[Path], tags_tokens: bool, pad_id: int,
                      sample: dict[str, np.ndarray], work: Path) -> tuple[ModelConfig, list[Path], str]:
    """The model step published ragged (config, the wrapped graph, why), or as it was with why not. The wrapped
    graph is checked against the original on ``sample`` (the validation texts' inputs) before it is used."""
    why = ragged_refusal(config, files, tags_tokens)
    if why is not None:
        return config, files, f"no ragged batching: {why}"
    names = [t.name for t in config.inputs]
    if any(n not in sample for n in names):
        return config, files, f"no ragged batching: no sample of {names} to check the ragged graph on"
    target = work / "ragged" / files[0].name
    try:
        ragged_graph(files[0], target, {n: pad_id if n == "input_ids" else 0 for n in names})
    except (ValueError, onnx.checker.ValidationError) as exc:  # published padded as before, and why
        return config, files, f"no ragged batching: the graph could not be wrapped ({' '.join(str(exc).split())[:200]})"
    wrong = ragged_mismatch(files[0], target, {n: np.asarray(sample[n])[:16] for n in names}, "attention_mask")
    if wrong:
        return config, files, f"no ragged batching: {wrong}"
    return ragged_config(config), [target], ("ragged batching: requests of any length batch in the model step, "
                                             "each batch padded in the graph to its longest text")


def takes_ragged(fmt: str, backend: str, tags_tokens: bool, input_names: list[str], enabled: bool,
                 opset: int | None = None) -> bool:
    """Whether a variant of this format, served by ``backend``, would be published taking ragged batches (the
    checks ``ragged_refusal`` can make before the graph exists): select ranks text pipelines' variants by it."""
    return enabled and fmt == "onnx" and backend == "onnxruntime_onnx" and not tags_tokens \
        and "attention_mask" in input_names and (opset is None or opset >= MIN_OPSET)


def served_text_rate(bench: dict, ragged: bool, lengths: list[int], buckets: list[int]) -> tuple[float, str]:
    """The in-process throughput a text pipeline's model step can reach as served, and how: with ragged batches
    Triton batches texts of any length (the best batch counts); without, it batches only texts padded to one
    length - length buckets where they pay for their padding (best batch / the padding they add), else each text
    at its own length, unbatched (batch 1)."""
    rates = {int(b): float(v) for b, v in (bench.get("throughput_by_batch") or {}).items() if v}
    best = float(bench["best_throughput"])
    if ragged or 1 not in rates:
        return best, f"at batch {bench.get('best_batch')}" + (" (ragged batches: texts of any length batch)"
                                                             if ragged else "")
    kept, _ = bucket_decision(lengths, buckets, rates)
    if kept:
        inflation = bucket_inflation(lengths, kept)
        return best / inflation, (f"as served: batch {bench.get('best_batch')} over the {inflation:.2f}x padding of "
                                  "length buckets (no ragged batches for this format)")
    return rates[1], ("as served: batch 1 (no ragged batches for this format, and length buckets do not pay here: "
                      "texts of different lengths do not batch)")


def graph_takes_ragged(model_file: Path) -> bool:
    """Whether this ONNX graph takes ragged batches (it has the ITEM_SHAPE input ``ragged_graph`` adds)."""
    model = onnx.load(str(model_file), load_external_data=False)
    return any(i.name == ITEM_SHAPE for i in model.graph.input)


def config_takes_ragged(config) -> bool:
    """Whether a parsed config (Triton's ModelConfig protobuf) hands its model ragged batches (ITEM_SHAPE)."""
    return any(ITEM_SHAPE in b.target_name for b in config.batch_input)


def version_ragged(version_folder: Path) -> bool | None:
    """Whether the published version in ``version_folder`` is a graph that takes ragged batches (None: not an
    ONNX version, or no readable metadata.yaml / model file to tell; validate reports an unreadable one)."""
    try:
        artifact = (yaml.safe_load((version_folder / "metadata.yaml").read_text()) or {})["artifact"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None
    model_file = version_folder / str(artifact.get("file", ""))
    return readable_graph_ragged(model_file) if artifact.get("format") == "onnx" else None


def readable_graph_ragged(model_file: Path) -> bool | None:
    """``graph_takes_ragged``, or None where the file is missing or does not parse as an ONNX graph (that is for
    validate's hashes and replay to report, not for this question)."""
    if not model_file.is_file():
        return None
    try:
        return graph_takes_ragged(model_file)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and whatever else a damaged file raises
        return None


def match_ragged_layout(config, ragged: bool) -> bool:
    """Make a parsed config hand its model ragged batches or not, as the version's graph takes them (a rollback
    across the change serves the older graph with the config it can load). True when it changed."""
    if config_takes_ragged(config) == ragged:
        return False
    for tensor in config.input:
        tensor.allow_ragged_batch = ragged
    if ragged:
        batch_input = config.batch_input.add()
        batch_input.kind = batch_input.BATCH_ITEM_SHAPE
        batch_input.target_name.append(ITEM_SHAPE)
        batch_input.data_type = model_config_pb2.TYPE_INT32
        batch_input.source_input.append(config.input[0].name)
    else:
        kept = [b for b in config.batch_input if ITEM_SHAPE not in b.target_name]
        del config.batch_input[:]
        config.batch_input.extend(kept)
    return True


def ragged_layout_failure(graph: bool, config: bool) -> str | None:
    """validate's line where config.pbtxt and a version's graph disagree on ragged batches (None: they agree)."""
    if graph == config:
        return None
    return (f"config.pbtxt {'hands the model ragged batches' if config else 'has no ragged batches'} (batch_input "
            f"{ITEM_SHAPE}), and this version's graph {'takes them' if graph else 'does not'}: Triton's onnxruntime "
            "backend cannot load it so; serve it with `triton-builder rollback` (which matches the config to the "
            "version), or build it again")
