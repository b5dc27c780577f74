"""The classification post-processing folded into the served ONNX graph: logits -> label, score, scores.

A text or image classifier served as an ensemble needs logits turned into labels. As a python step that is one
more call through the python backend's stub per request (about 0.3-1 ms on 2 cores, whatever it computes); as
four ONNX nodes after the logits it costs microseconds and runs in the model's own backend (onnxruntime). The
head computes what templates/pipeline/text_steps.py ``classify`` computes (transformers' pipeline's activation):

    scores = Softmax(logits) | Sigmoid(logits)          FP32 [batch, labels]
    best   = ArgMax(scores, axis -1, keepdims)          INT64 [batch, 1]
    score  = GatherElements(scores, best, axis -1)      FP32 [batch, 1]
    label  = ai.onnx.ml.LabelEncoder(best -> id2label)  STRING [batch, 1]

The logits stay an output: the bare ``<name>__model`` still answers them, and `check`/`validate` compare them
with the build's reference as for any model.

Usage::

    if fold_label_head(variant_file, work / "model.onnx", "logits", ["NEG", "POS"], "softmax"):
        ...  # publish work / "model.onnx"; the ensemble maps label, score and scores from the model step
"""

from __future__ import annotations

from pathlib import Path

HEAD_OUTPUTS = ("label", "score", "scores")
ML_DOMAIN = "ai.onnx.ml"
ML_OPSET = 2  # LabelEncoder's keys_int64s / values_strings


def head_refusal(model_path: Path, logits: str) -> str | None:
    """Why the head cannot be folded into this file (the python post-processing step serves it then), or None."""
    import onnx

    if not model_path.is_file():
        return f"{model_path} is not a file"
    model = onnx.load(str(model_path), load_external_data=False)
    if any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer):
        return "the graph keeps its weights in external data files"
    outputs = [o.name for o in model.graph.output]
    if logits not in outputs:
        return f"the graph has no output '{logits}' (outputs: {', '.join(outputs)})"
    taken = {o for node in model.graph.node for o in node.output} | set(outputs)
    clash = [name for name in HEAD_OUTPUTS if name in taken]
    if clash:
        return f"the graph already names a tensor {', '.join(clash)}"
    return None


def fold_label_head(model_path: Path, out_path: Path, logits: str, labels: list[str], activation: str) -> bool:
    """Write ``model_path`` with the head after output ``logits`` to ``out_path``; False (nothing written) where
    ``head_refusal`` says it cannot be."""
    import onnx
    from onnx import TensorProto, helper

    if not labels or head_refusal(model_path, logits) is not None:
        return False
    model = onnx.load(str(model_path))
    graph = model.graph
    prefix = "triton_builder_head_"
    nodes = [
        helper.make_node("Cast", [logits], [prefix + "logits"], to=TensorProto.FLOAT, name=prefix + "cast"),
        (helper.make_node("Sigmoid", [prefix + "logits"], ["scores"], name=prefix + "sigmoid")
         if activation == "sigmoid" else
         helper.make_node("Softmax", [prefix + "logits"], ["scores"], axis=-1, name=prefix + "softmax")),
        helper.make_node("ArgMax", ["scores"], [prefix + "best"], axis=-1, keepdims=1, name=prefix + "argmax"),
        helper.make_node("GatherElements", ["scores", prefix + "best"], ["score"], axis=-1, name=prefix + "gather"),
        helper.make_node("LabelEncoder", [prefix + "best"], ["label"], domain=ML_DOMAIN, name=prefix + "labels",
                         keys_int64s=list(range(len(labels))), values_strings=list(labels), default_string=""),
    ]
    graph.node.extend(nodes)
    batch = "batch"
    graph.output.extend([
        helper.make_tensor_value_info("label", TensorProto.STRING, [batch, 1]),
        helper.make_tensor_value_info("score", TensorProto.FLOAT, [batch, 1]),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batch, len(labels)]),
    ])
    imports = {entry.domain: entry for entry in model.opset_import}
    if ML_DOMAIN in imports:
        imports[ML_DOMAIN].version = max(imports[ML_DOMAIN].version, ML_OPSET)
    else:
        model.opset_import.append(helper.make_opsetid(ML_DOMAIN, ML_OPSET))
    onnx.checker.check_model(model)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out_path))
    return True
