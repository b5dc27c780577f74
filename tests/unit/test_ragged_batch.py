"""Ragged batching of a text pipeline's model step (builder/huggingface/ragged.py, issue 51): the wrapped graph
answers as the padded one for requests of any length batched together, the config says so in Triton's schema,
a model step that cannot take ragged batches is published as before, with the reason, and select ranks a text
pipeline's variants by what their serving layout can batch."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from builder.core.errors import UserInputError
from builder.huggingface.ragged import (ITEM_SHAPE, config_takes_ragged, graph_takes_ragged, match_ragged_layout,
                                       ragged_config, ragged_graph, ragged_layout_failure, ragged_mismatch,
                                       ragged_refusal, served_text_rate, with_ragged_batch)
from builder.model.runtime import open_runner, ragged_feeds
from builder.pipeline import BuildOptions
from builder.repository.config import DynamicBatching, ModelConfig, TensorConfig, parse_config, render_config
from builder.repository.pipeline import HuggingFacePipeline
from builder.repository.rollback import pinned_config
from builder.spec.model import parse_spec
from builder.stages import select
from builder.stages.base import BuildContext, Variant
from tests.unit.test_spec import spec_with

VOCAB, WIDTH, PAD = 30, 4, 7


def _encoder(path: Path, masked: bool = True) -> Path:
    """input_ids, attention_mask [batch, sequence] -> logits [batch, 2]: a mean over the tokens the mask keeps
    (``masked``), or a sum over every position, padding included (an encoder that is wrong on padded inputs)."""
    rng = np.random.default_rng(0)
    table = helper.make_tensor("table", TensorProto.FLOAT, [VOCAB, WIDTH], rng.normal(size=VOCAB * WIDTH).tolist())
    head = helper.make_tensor("head", TensorProto.FLOAT, [WIDTH, 2], rng.normal(size=WIDTH * 2).tolist())
    axis = helper.make_tensor("axis", TensorProto.INT64, [1], [1])
    last = helper.make_tensor("last", TensorProto.INT64, [1], [-1])
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["embedded"], axis=0),
             helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["maskf", "last"], ["mask3"])]
    if masked:
        nodes += [helper.make_node("Mul", ["embedded", "mask3"], ["kept"]),
                  helper.make_node("ReduceSum", ["kept", "axis"], ["total"], keepdims=0),
                  helper.make_node("ReduceSum", ["maskf", "axis"], ["count"], keepdims=1),
                  helper.make_node("Div", ["total", "count"], ["pooled"])]
    else:
        nodes += [helper.make_node("ReduceSum", ["embedded", "axis"], ["pooled0"], keepdims=0),
                  helper.make_node("ReduceMax", ["mask3"], ["one"], keepdims=0),
                  helper.make_node("Mul", ["pooled0", "one"], ["pooled"])]
    nodes.append(helper.make_node("MatMul", ["pooled", "head"], ["logits"]))
    graph = helper.make_graph(
        nodes, "encoder",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
         for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])], [table, head, axis, last])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return path


def _request(lengths: list[int], seed: int) -> dict[str, np.ndarray]:
    """One request of len(lengths) texts padded to its longest (as the tokenizer step sends them)."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = np.full((len(lengths), width), PAD, dtype=np.int64)
    mask = np.zeros((len(lengths), width), dtype=np.int64)
    for row, n in enumerate(lengths):
        ids[row, :n], mask[row, :n] = rng.integers(0, VOCAB, n), 1
    return {"input_ids": ids, "attention_mask": mask}


def _model_step(backend: str = "onnxruntime_onnx", outputs: list[TensorConfig] | None = None,
                inputs: list[TensorConfig] | None = None) -> ModelConfig:
    return ModelConfig(name="enc__model", backend=backend, max_batch_size=16,
                       inputs=inputs or [TensorConfig("input_ids", "TYPE_INT64", [-1]),
                                         TensorConfig("attention_mask", "TYPE_INT64", [-1])],
                       outputs=outputs or [TensorConfig("logits", "TYPE_FP32", [2])],
                       dynamic_batching=DynamicBatching())


def test_a_ragged_batch_of_texts_of_different_lengths_answers_as_each_text_alone(tmp_path):
    plain = _encoder(tmp_path / "model.onnx")
    ragged = tmp_path / "ragged" / "model.onnx"
    ragged_graph(plain, ragged, {"input_ids": PAD, "attention_mask": 0})
    requests = [_request([3], 1), _request([9, 2], 2), _request([1], 3), _request([5, 5, 4], 4)]
    names = ["input_ids", "attention_mask"]
    session = ort.InferenceSession(str(ragged), providers=["CPUExecutionProvider"])
    assert {i.name: i.shape for i in session.get_inputs()} == {"input_ids": ["ragged_tokens"],
                                                             "attention_mask": ["ragged_tokens"],
                                                             ITEM_SHAPE: ["ragged_rows", 1]}
    feeds = ragged_feeds(requests, names)
    assert feeds["input_ids"].shape == (3 + 18 + 1 + 15,)  # the batch's tokens, each request at its own width
    assert feeds[ITEM_SHAPE].reshape(-1).tolist() == [3, 9, 9, 1, 5, 5, 5]
    got = session.run(["logits"], feeds)[0]
    alone = ort.InferenceSession(str(plain), providers=["CPUExecutionProvider"])
    want = np.concatenate([alone.run(["logits"], r)[0] for r in requests])
    assert got.shape == (7, 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_runner_of_the_ragged_graph_takes_padded_inputs_as_every_consumer_sends_them(tmp_path):
    plain = _encoder(tmp_path / "model.onnx")
    ragged = tmp_path / "ragged.onnx"
    ragged_graph(plain, ragged, {"input_ids": PAD, "attention_mask": 0})
    request = _request([6, 2, 4], 5)
    got = open_runner("onnx", ragged, ["logits"], ["input_ids", "attention_mask"])(request)["logits"]
    np.testing.assert_allclose(got, open_runner("onnx", plain, ["logits"])(request)["logits"], rtol=1e-5, atol=1e-6)


def test_the_check_before_publishing_catches_a_graph_that_reads_the_padding(tmp_path):
    padded = _request([8, 3, 5, 1], 6)
    good = _encoder(tmp_path / "good.onnx")
    ragged_graph(good, tmp_path / "good_ragged.onnx", {"input_ids": PAD, "attention_mask": 0})
    assert ragged_mismatch(good, tmp_path / "good_ragged.onnx", padded, "attention_mask") is None
    leaky = _encoder(tmp_path / "leaky.onnx", masked=False)  # averages the padding in: its answer depends on it
    ragged_graph(leaky, tmp_path / "leaky_ragged.onnx", {"input_ids": PAD, "attention_mask": 0})
    why = ragged_mismatch(leaky, tmp_path / "leaky_ragged.onnx", padded, "attention_mask")
    assert why is not None and why.startswith("output logits differs from the padded graph's on 4 texts at their own "
                                              "lengths, each alone (max abs difference")
    config, files, said = with_ragged_batch(_model_step(), [leaky], False, PAD, padded, tmp_path / "work")
    assert files == [leaky] and not config.batch_inputs and said.startswith("no ragged batching: output logits differs")


def test_the_published_config_takes_ragged_batches_in_tritons_schema(tmp_path):
    plain = _encoder(tmp_path / "model.onnx")
    config, files, said = with_ragged_batch(_model_step(), [plain], False, PAD, _request([4, 2, 7], 7), tmp_path / "w")
    assert said.startswith("ragged batching: requests of any length batch in the model step")
    assert files == [tmp_path / "w" / "ragged" / "model.onnx"] and files[0].is_file()
    parsed = parse_config(render_config(config))
    assert [(i.name, i.allow_ragged_batch) for i in parsed.input] == [("input_ids", True), ("attention_mask", True)]
    (batch_input,) = parsed.batch_input
    assert (batch_input.kind, list(batch_input.target_name), list(batch_input.source_input)) == (
        batch_input.BATCH_ITEM_SHAPE, [ITEM_SHAPE], ["input_ids"])
    assert parse_config(render_config(_model_step())).batch_input == []  # nothing rendered unless asked


@pytest.mark.parametrize("config, tags, why", [
    (_model_step("openvino"), False, "served by openvino, and ragged batches are built for onnxruntime's backend"),
    (_model_step(), True, "token tags are per token"),
    (_model_step(outputs=[TensorConfig("last_hidden_state", "TYPE_FP32", [-1, 4])]), False,
     r"outputs \['last_hidden_state'\] have a sequence dimension"),
    (_model_step(inputs=[TensorConfig("pixel_values", "TYPE_FP32", [3, 8, 8])]), False,
     r"inputs \['pixel_values'\] are not token sequences"),
    (_model_step(inputs=[TensorConfig("input_ids", "TYPE_INT64", [-1])]), False,
     "the model takes no attention_mask, so the padding of a batch's longer texts would change its answers"),
])
def test_a_model_step_that_cannot_take_ragged_batches_says_why(tmp_path, config, tags, why):
    said = ragged_refusal(config, [_encoder(tmp_path / "model.onnx")], tags)
    assert said is not None and re.search(why, said), said
    kept, files, note = with_ragged_batch(config, [tmp_path / "model.onnx"], tags, PAD, {}, tmp_path / "w")
    assert kept is config and files == [tmp_path / "model.onnx"] and note == f"no ragged batching: {said}"


def test_the_spec_turns_ragged_batching_off_and_refuses_a_non_boolean():
    assert parse_spec(spec_with()).deploy.ragged_batching is True
    assert parse_spec(spec_with(deploy={"ragged_batching": False})).deploy.ragged_batching is False
    with pytest.raises(UserInputError, match=r"deploy.ragged_batching"):
        parse_spec(spec_with(deploy={"ragged_batching": "sometimes"}))


def _measured(name: str, fmt: str, by_batch: dict[int, float]):
    v = Variant(name, fmt, "fp32", Path(f"/nonexistent/{name}"), verified=True)
    v.verification = {"metrics": {"logits": {"rel_l2": 1e-7, "max_abs": 0.0}}}
    best = max(by_batch, key=by_batch.get)
    v.benchmark = {"latency_ms_b1": {"p50": 1000 / by_batch[1]}, "throughput_by_batch": dict(by_batch),
                   "best_throughput": by_batch[best], "best_batch": best}
    return v


def _text_context(lengths: list[int], buckets: list[int]):
    spec = parse_spec(spec_with(inputs=[{"name": "input_ids", "dtype": "int64", "shape": [-1]},
                                        {"name": "attention_mask", "dtype": "int64", "shape": [-1]}]))
    ctx = BuildContext(spec=spec, options=BuildOptions(repository=Path("/nonexistent")), workdir=Path("/nonexistent"))
    ctx.pipeline = HuggingFacePipeline(task="text-classification", tokenizer_file=Path("/nonexistent/tokenizer.json"),
                                       max_length=128, truncation=False, labels=["NEG", "POS"],
                                       length_buckets=buckets, token_lengths=lengths)
    return ctx


def test_select_ranks_a_text_pipelines_variants_by_what_their_serving_layout_can_batch():
    """TorchScript measures 1.21x ONNX at batch 8 in-process, but as a pipeline's model step it cannot take ragged
    batches, and its batching gain (1.43x batch 1) does not pay for the buckets' padding (1.42x these texts' tokens,
    x 1.05): served, it runs batch 1. The ONNX graph takes ragged batches, so its batch 8 counts and it is
    published. Measurements are injected."""
    ctx = _text_context(lengths=[5, 9, 12, 17, 30], buckets=[8, 16, 32, 64, 128])
    ctx.variants = [_measured("onnx", "onnx", {1: 300.0, 8: 330.0}),
                    _measured("torchscript", "torchscript", {1: 280.0, 8: 400.0})]
    select.run(ctx)
    assert ctx.selected.name == "onnx"
    assert ctx.selected.selection_reason.startswith(
        "selected: highest throughput (330 inf/s at batch 8 (ragged batches: texts of any length batch))")
    assert ctx.variant("torchscript").benchmark["served_throughput"] == 280.0
    assert ctx.variant("torchscript").selection_reason == (
        "rejected: 1.2x slower than onnx (measured 280 vs 330 inf/s as served)")
    assert "length buckets do not pay here" in ctx.variant("torchscript").benchmark["served_how"]


def test_buckets_that_pay_count_at_their_padding_and_ragged_batching_off_ranks_onnx_alike():
    bench = {"throughput_by_batch": {1: 100.0, 16: 400.0}, "best_throughput": 400.0, "best_batch": 16}
    rate, how = served_text_rate(bench, False, [8, 16], [8, 16, 32])  # no padding beyond each text's bucket
    assert rate == 400.0 and how.startswith("as served: batch 16 over the 1.00x padding of length buckets")
    rate, _ = served_text_rate(bench, False, [5, 9], [8, 16])  # 24 tokens padded for 14: 1.71x
    assert rate == pytest.approx(400.0 * 14 / 24)
    assert served_text_rate(bench, True, [5, 9], [8, 16]) == (400.0, "at batch 16 (ragged batches: texts of any "
                                                                     "length batch)")
    ctx = _text_context(lengths=[5, 9, 12, 17, 30], buckets=[8, 16, 32, 64, 128])
    ctx.spec.deploy.ragged_batching = False
    ctx.variants = [_measured("onnx", "onnx", {1: 300.0, 8: 330.0}),
                    _measured("torchscript", "torchscript", {1: 320.0, 8: 430.0})]
    select.run(ctx)
    assert ctx.selected.name == "torchscript"  # both batch 1 as served: 320 vs 300 (outside the noise)
    assert ctx.variant("onnx").benchmark["served_throughput"] == 300.0


def test_a_graph_below_opset_13_is_published_padded_and_says_why(tmp_path):
    old = onnx.load(str(_encoder(tmp_path / "model.onnx")))
    old.opset_import[0].version = 12
    onnx.save(old, str(tmp_path / "old.onnx"))
    assert ragged_refusal(_model_step(), [tmp_path / "old.onnx"], False) == (
        "the graph's opset 12 is below 13 (Unsqueeze with axes as an input)")
    with pytest.raises(ValueError, match="opset below 13"):
        ragged_graph(tmp_path / "old.onnx", tmp_path / "out.onnx", {"input_ids": PAD, "attention_mask": 0})


def test_a_config_is_matched_to_a_versions_graph_both_ways_and_validate_names_a_mismatch(tmp_path):
    plain = _encoder(tmp_path / "model.onnx")
    ragged_graph(plain, tmp_path / "ragged.onnx", {"input_ids": PAD, "attention_mask": 0})
    assert graph_takes_ragged(tmp_path / "ragged.onnx") and not graph_takes_ragged(plain)
    ragged_text = render_config(ragged_config(_model_step()))
    config = parse_config(ragged_text)
    assert config_takes_ragged(config)
    assert match_ragged_layout(config, False) and not match_ragged_layout(config, False)
    assert not config_takes_ragged(config) and not any(i.allow_ragged_batch for i in config.input)
    assert match_ragged_layout(config, True)  # and back: as the ragged build rendered it
    assert config == parse_config(ragged_text)
    pinned = parse_config(pinned_config(ragged_text, 1, "rolled back", ragged=False))
    assert not config_takes_ragged(pinned) and list(pinned.version_policy.specific.versions) == [1]
    assert ragged_layout_failure(True, True) is None and ragged_layout_failure(False, False) is None
    assert ragged_layout_failure(False, True).startswith(
        "config.pbtxt hands the model ragged batches (batch_input ragged_item_shape), and this version's graph does "
        "not: Triton's onnxruntime backend cannot load it so")
