"""Stage compress refuses what it cannot train on before training (data.training's arrays, labels and
the model run on them; no output holding float class scores) and says why a variant cannot be made
(nothing prunable, QAT of nn.MultiheadAttention) instead of reporting a ratio or torch's words."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from builder.compression.prune import check_prunable
from builder.compression.qat import prepare_qat
from builder.compression.train import TrainingData
from builder.core.errors import UserInputError
from builder.spec.model import parse_spec
from builder.stages.compress import load_training, why_not


class Recurrent(nn.Module):
    """Embedding -> GRU -> LayerNorm -> head: no layer torch-pruning can remove channels of."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.rnn = nn.Embedding(30, 8), nn.GRU(8, 16, batch_first=True)
        self.norm, self.head = nn.LayerNorm(16), nn.Linear(16, 3)

    def forward(self, ids):
        return self.head(self.norm(self.rnn(self.emb(ids))[0][:, -1]))


def _ctx(tmp_path, arrays, model=None):
    np.savez(tmp_path / "train.npz", **arrays)
    spec = parse_spec({"name": "rnn", "source": {"module": "m:build"}, "max_batch_size": 8,
                       "data": {"training": "train.npz"}, "compression": {"batch_size": 16},
                       "inputs": [{"name": "ids", "dtype": "int64", "shape": [6], "value_range": [0, 30]}],
                       "outputs": [{"name": "logits"}]}, tmp_path / "spec.yaml")
    reference = SimpleNamespace(labels=np.zeros(4, np.int64), top1_output="logits",
                                validation_outputs={"logits": np.zeros((4, 3), np.float32)})
    return SimpleNamespace(spec=spec, model=(model or Recurrent()).eval(), reference=reference)


def _ids(count=64, high=30):
    return np.random.default_rng(0).integers(0, high, (count, 6))


@pytest.mark.parametrize("arrays, message", [
    ({"ids": _ids().astype(np.float32), "labels": np.zeros(64, np.int64)},
     r"data.training: train.npz\['ids'\] is float32, the spec says int64; save it as int64"),
    ({"ids": _ids(), "labels": np.zeros((64, 3), np.int64)},
     r"data.training: train.npz\['labels'\] has shape \[64, 3\]; give one class id per sample"),
    ({"ids": _ids(), "labels": np.where(np.arange(64) == 40, 7, 1)},
     r"data.training: train.npz\['labels'\] holds 1 class id \(7 at sample 40\) outside 0..2 \(output 'logits' "
     r"scores 3 classes\)"),
    ({"ids": _ids(), "labels": np.full(64, -1)}, r"train.npz\['labels'\] holds 64 class ids \(-1 at sample 0, .*\)"),
])
def test_training_arrays_are_checked_before_training(tmp_path, arrays, message):
    with pytest.raises(UserInputError, match=message):
        load_training(_ctx(tmp_path, arrays))


def test_the_model_runs_on_training_data_before_training(tmp_path):
    ids = _ids()
    ids[50, 3] = 99  # past Embedding(30), far from the first batch
    with pytest.raises(UserInputError, match=r"data.training\['ids'\]: the model fails on train.npz \(index out of "
                                             r"range in self\) .*'ids' holds .*99, outside \[0, 30\)"):
        load_training(_ctx(tmp_path, {"ids": ids, "labels": np.zeros(64, np.int64)}))
    data = load_training(_ctx(tmp_path, {"ids": _ids().astype(np.int32), "labels": np.zeros(64, np.int64)}))
    assert data["ids"].dtype == np.int64  # a safe cast, as for data.validation


def test_a_model_with_nothing_prunable_is_said_so():
    example = [torch.from_numpy(_ids(2))]
    with pytest.raises(ValueError, match=r"nothing prunable in Embedding, GRU, LayerNorm, Linear: structured "
                                         r"pruning removes channels of Conv / Linear layers"):
        check_prunable(Recurrent(), example, 0.5)
    check_prunable(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), [torch.zeros(2, 4)], 0.5)


def test_qat_refuses_multihead_attention_naming_it():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, 1, enable_nested_tensor=False), nn.Linear(8, 3))
    data = TrainingData.from_arrays({"x": np.zeros((4, 5, 8), np.float32), "labels": np.zeros(4, np.int64)}, ["x"])
    with pytest.raises(ValueError, match=r"QAT does not support nn.MultiheadAttention \(0.layers.0.self_attn\): it "
                                         r"reads out_proj.weight directly"):
        prepare_qat(model, data)


def test_compression_needs_class_scores_first(tmp_path):
    ctx = _ctx(tmp_path, {"ids": _ids(), "labels": np.zeros(64, np.int64)})
    assert why_not(ctx) == ""
    ctx.reference.validation_outputs = {"logits": np.zeros(4, np.int64)}  # (argmax, logits): class ids first
    assert why_not(ctx).startswith("trains with cross-entropy on float class scores, and no output holds them")
