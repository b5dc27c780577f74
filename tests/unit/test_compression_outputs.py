"""Stage compress trains, distills and scores the output the labels score (not merely the first one),
keeps the other outputs what they are (their shape through pruning, their values through training),
never prunes an RNN, refuses training data it cannot batch, says why per-position labels cannot be
trained on; openvino_int8 retries NNCF without its fast bias correction where that step fails.

Tiny models, few steps: each fine-tuning run ends by its step budget, never by the clock."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from builder.compression.prune import check_prunable, output_layers, prune_iteratively
from builder.compression.train import Budget, TaskLoss, TrainingData, accuracy
from builder.core.errors import UserInputError
from builder.pipeline import build
from builder.spec.model import parse_spec
from builder.spec.compression import CompressionSpec
from builder.stages.compress import load_training, training_output, why_not

MODEL = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc_in = nn.Linear(8, 32)
        self.fc_e = nn.Linear(32, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        emb = torch.relu(self.fc_e(torch.relu(self.fc_in(x))))  # returned through an activation
        return emb, self.head(emb)  # the embedding first, the logits the labels score second


def build():
    return Net().eval()
'''


def _blobs(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    centers = np.random.default_rng(123).normal(0, 1.5, (4, 8)).astype(np.float32)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, count)
    return (centers[labels] + rng.normal(0, 0.7, (count, 8))).astype(np.float32), labels.astype(np.int64)


def _net():
    namespace: dict = {}
    exec(compile(MODEL, "model.py", "exec"), namespace)
    return namespace["Net"]()


def _trained_net():
    """The user's model, trained on its logits (as a user would have)."""
    model = _net()
    x, y = _blobs(256, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(torch.from_numpy(x))[1], torch.from_numpy(y)).backward()
        optimizer.step()
    return model.eval()


# ------------------------------------------------------------------------------------------------
# the output the labels score: trained, distilled, evaluated; the other output kept


@pytest.fixture(scope="module")
def embedding_first_build(tmp_path_factory):
    folder = tmp_path_factory.mktemp("embfirst")
    (folder / "model.py").write_text(MODEL)
    torch.save(_trained_net().state_dict(), folder / "weights.pt")
    for name, (count, seed) in {"train": (256, 1), "val": (120, 2)}.items():
        x, y = _blobs(count, seed)
        np.savez(folder / f"{name}.npz", x=x, labels=y)
    spec = {"name": "embfirst", "source": {"module": "model:build", "weights": "weights.pt"},
            "inputs": [{"name": "x", "dtype": "float32", "shape": [8]}],
            "outputs": [{"name": "emb"}, {"name": "logits"}], "max_batch_size": 32,
            "data": {"validation": "val.npz", "training": "train.npz"},
            "compression": {"prune_ratio": 0.5, "prune_steps": 2, "steps": 40, "seconds": 600, "batch_size": 32}}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    return build(folder / "spec.yaml", folder / "repo", variants=["onnx", "onnx_pruned", "onnx_distilled"],
                 benchmark_seconds=0, progress=None)


def test_compression_scores_the_labels_output_and_keeps_the_embedding(embedding_first_build):
    ctx = embedding_first_build.context
    assert ctx.reference.top1_output == "logits"
    for name in ("onnx_pruned", "onnx_distilled"):
        variant = ctx.variant(name)
        # the accuracy training reported is the logits' (what verify scores), not the embedding's argmax
        assert variant.compression["accuracy"] == pytest.approx(variant.accuracy["variant"]), name
        assert variant.accuracy["output"] == "logits"
        # fc_e reaches 'emb' through a relu: it keeps its 16 channels, so 'emb' keeps its 16 columns
        assert variant.own_validation_outputs["emb"].shape == (120, 16), name  # (the ONNX's, in verify)
        assert any(note.startswith("outputs not trained on ('logits' is), vs the model on data.validation: 'emb' "
                                   "rel L2 ") for note in variant.notes), variant.notes
    pruned = ctx.variant("onnx_pruned")
    assert pruned.compression["history"][0]["params"] < ctx.variant("onnx").stats["params"]
    # the distilled student matched the teacher's embedding too (relative squared error in its loss)
    assert ctx.variant("onnx_distilled").compression["other_outputs"]["emb"]["rel_l2"] <= 0.1


def test_the_trained_output_is_the_labels_output_not_the_first():
    spec = parse_spec({"name": "m", "source": {"module": "m:build"}, "max_batch_size": 8, "data": {"training": "d:f"},
                       "inputs": [{"name": "x", "shape": [8]}], "outputs": [{"name": "emb"}, {"name": "logits"}]})
    labels = np.array([0, 1, 2, 3])
    emb, logits = np.eye(4, 8, dtype=np.float32), np.eye(4, dtype=np.float32)

    def ctx(top1, **outputs):
        return SimpleNamespace(spec=spec, model=nn.Linear(1, 1), reference=SimpleNamespace(
            labels=labels, top1_output=top1, validation_outputs=outputs))

    # (embedding [8 "classes"], logits): the labels fit both; they score the logits, so training does
    assert training_output(ctx("logits", emb=emb, logits=logits)) == "logits"
    # the labels score integer class ids (the argmax beside the logits): training takes the float scores
    assert training_output(ctx("emb", emb=np.arange(4), logits=logits)) == "logits"
    assert why_not(ctx("emb", emb=np.arange(4), logits=logits)) == ""
    assert why_not(ctx("emb", emb=np.arange(4), logits=np.arange(4))) == (
        "trains with cross-entropy on float class scores, and no output holds them for these labels (one class id "
        "per sample; the labels score 'emb'; outputs per sample: 'emb' int64 [], 'logits' int64 []): return the "
        "class scores (logits) as an output too")


def test_the_loss_is_cross_entropy_on_the_task_output_plus_the_other_outputs_kept():
    teacher, student = _net(), _net()
    torch.manual_seed(1)
    for p in student.parameters():
        p.data.add_(0.1 * torch.randn_like(p))
    x, y = _blobs(16, 3)
    data = TrainingData.from_arrays({"x": x, "labels": y}, ["x"], output=1)
    inputs, labels = [torch.from_numpy(x)], torch.from_numpy(y)
    with torch.no_grad():
        got = TaskLoss(teacher, data)(student, inputs, labels)
        emb, logits = student(*inputs)
        wanted = teacher(*inputs)[0]
    expected = nn.functional.cross_entropy(logits, labels) + 10.0 * ((emb - wanted) ** 2).sum() / (wanted ** 2).sum()
    assert float(got) == pytest.approx(float(expected), rel=1e-5)
    arrays = {"x": x}
    assert accuracy(student, arrays, y, ["x"], output=1) == pytest.approx(
        100.0 * float((logits.argmax(1) == labels).float().mean()))


# ------------------------------------------------------------------------------------------------
# pruning: the layers reaching a returned tensor keep their channels; RNNs are never pruned


def test_a_layer_returned_through_an_activation_keeps_its_channels(monkeypatch):
    model = _net()
    example = [torch.from_numpy(_blobs(2, 4)[0])]
    assert output_layers(model, example) == [model.fc_e, model.head]
    x, y = _blobs(64, 1)
    settings = CompressionSpec(prune_ratio=0.5, prune_steps=1, steps=2, batch_size=32)
    result = prune_iteratively(model, TrainingData.from_arrays({"x": x, "labels": y}, ["x"], output=1), settings,
                               Budget(10, 600), evaluate=lambda m: 50.0, floor=0.0)
    assert (result.model.fc_in.out_features, result.model.fc_e.out_features) == (16, 16)
    # a path the walk did not see (here: forced) is caught before training, naming the tensor
    import builder.compression.prune as prune

    monkeypatch.setattr(prune, "output_layers", lambda work, example: [work.head])
    with pytest.raises(ValueError, match=r"structured pruning would change the returned tensor\(s\) number 1 from "
                                         r"\[16\] to \[8\] per sample"):
        check_prunable(model, example, 0.5)


class _Lstm(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.rnn = nn.Embedding(40, 16), nn.LSTM(16, 32, batch_first=True)
        self.fc, self.head = nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, ids):
        return self.head(torch.relu(self.fc(self.rnn(self.emb(ids))[0][:, -1])))


class _Gru(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj, self.rnn = nn.Linear(8, 16), nn.GRU(16, 16, batch_first=True, num_layers=2)
        self.fc, self.head = nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.relu(self.fc(self.rnn(torch.relu(self.proj(x)))[0][:, -1])))


def _unpruned_shapes(model) -> dict[str, tuple]:
    """The shapes of every parameter but those of fc (pruned) and head (reads fc)."""
    return {n: tuple(p.shape) for n, p in model.named_parameters() if not n.startswith(("fc.", "head."))}


@pytest.mark.parametrize("make, shape", [(_Lstm, (48, 5)), (_Gru, (48, 5, 8))], ids=["lstm", "gru"])
def test_recurrent_layers_and_what_feeds_them_are_never_pruned(make, shape):
    model, generator = make().eval(), torch.Generator().manual_seed(0)
    if make is _Lstm:
        inputs = torch.randint(0, 40, shape, generator=generator)
    else:
        inputs = torch.randn(shape, generator=generator)
    data = TrainingData(inputs=[inputs], labels=torch.arange(48) % 3)
    settings = CompressionSpec(prune_ratio=0.5, prune_steps=1, steps=2, batch_size=16)
    result = prune_iteratively(model, data, settings, Budget(10, 600), evaluate=lambda m: 50.0, floor=0.0)
    assert _unpruned_shapes(result.model) == _unpruned_shapes(model)
    assert result.model.fc.out_features == model.fc.out_features // 2


# ------------------------------------------------------------------------------------------------
# training data that cannot be batched; per-position labels


def _bn_ctx(tmp_path, samples: int, batch_size: int = 64):
    x, y = _blobs(samples, 1)
    np.savez(tmp_path / "train.npz", x=x, labels=y)
    spec = parse_spec({"name": "bn", "source": {"module": "m:build"}, "max_batch_size": 8,
                       "data": {"training": "train.npz"}, "compression": {"batch_size": batch_size},
                       "inputs": [{"name": "x", "shape": [8]}], "outputs": [{"name": "logits"}]},
                      tmp_path / "spec.yaml")
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4)).eval()
    return SimpleNamespace(spec=spec, model=model)


def test_training_data_that_would_make_batches_of_one_is_refused(tmp_path):
    with pytest.raises(UserInputError, match=r"^data.training: train.npz holds 1 sample\(s\); give at least 2 "
                                             r"\(hundreds to fine-tune well\): training takes batches of samples$"):
        load_training(_bn_ctx(tmp_path, 1))
    with pytest.raises(UserInputError, match=r"^compression.batch_size: 1 with BatchNorm in the model \(1\): BatchNorm "
                                             r"cannot train on one sample per batch; set compression.batch_size to 2"):
        load_training(_bn_ctx(tmp_path, 16, batch_size=1))
    assert len(load_training(_bn_ctx(tmp_path, 2))["labels"]) == 2


def test_per_token_labels_skip_with_the_real_reason():
    spec = parse_spec({"name": "tagger", "source": {"module": "m:build"}, "max_batch_size": 8,
                       "data": {"training": "d:f"}, "inputs": [{"name": "ids", "dtype": "int64", "shape": [6]}],
                       "outputs": [{"name": "logits"}]})
    reference = SimpleNamespace(labels=np.zeros((4, 6), np.int64), top1_output="logits",
                                validation_outputs={"logits": np.zeros((4, 6, 5), np.float32)})
    assert why_not(SimpleNamespace(spec=spec, model=nn.Linear(1, 1), reference=reference)) == (
        "trains with one class id per sample (cross-entropy on [samples, classes] scores), and "
        "data.validation['labels'] holds [6] per sample (one per position, e.g. per token): per-position training "
        "is not offered; leave onnx_pruned, onnx_distilled and onnx_qat_int8 out of variants")


# ------------------------------------------------------------------------------------------------
# openvino_int8: NNCF's fast bias correction failing


def _fails_in_fast_bias_correction():
    """A callable raising NNCF's error from a frame of NNCF's fast bias correction module (where the
    retry looks, not at the words)."""
    namespace: dict = {}
    source = "def fail():\n    raise TypeError('iteration over a 0-d tensor')\n"
    exec(compile(source, "/site-packages/nncf/quantization/algorithms/fast_bias_correction/algorithm.py", "exec"),
         namespace)
    return namespace["fail"]


def test_openvino_int8_retries_nncf_without_fast_bias_correction(monkeypatch):
    from builder.optimise import openvino_tools
    from builder.stages import openvino

    monkeypatch.setattr(openvino_tools, "read_onnx", lambda path: "model")
    fail, calls = _fails_in_fast_bias_correction(), []

    def quantize(model, dataset, subset_size, fast_bias_correction=True):
        calls.append(fast_bias_correction)
        if fast_bias_correction:
            fail()
        return "quantized"

    notes: list[str] = []
    assert openvino._quantize("model.onnx", "dataset", 2, notes, quantize=quantize) == ("quantized", False)
    assert calls == [True, False]
    assert notes == ["NNCF's fast bias correction failed (iteration over a 0-d tensor): quantized with "
                     "fast_bias_correction=False (NNCF's slower bias correction)"]

    def always(model, dataset, subset_size, fast_bias_correction=True):
        fail()

    with pytest.raises(RuntimeError, match=r"^NNCF's quantize failed in its fast bias correction \(iteration over a "
                                           r"0-d tensor\) and again with fast_bias_correction=False \(iteration over "
                                           r"a 0-d tensor\); serve openvino \(FP32\) or onnx_int8_static instead$"):
        openvino._quantize("model.onnx", "dataset", 2, [], quantize=always)

    def elsewhere(model, dataset, subset_size, fast_bias_correction=True):
        calls.append("elsewhere")
        raise TypeError("iteration over a 0-d tensor")  # the same words from another step: not retried

    calls.clear()
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        openvino._quantize("model.onnx", "dataset", 2, [], quantize=elsewhere)
    assert calls == ["elsewhere"]
