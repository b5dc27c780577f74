"""Tiny models of the shapes users bring that the examples do not cover, written as spec folders.

Usage::

    spec = write_model(tmp_path, "argmax")   # tmp_path/argmax/{model.py, spec.yaml}
"""

from __future__ import annotations

from pathlib import Path

import yaml

MODELS = {
    # a class id per sample (argmax, shape [batch]) and a scalar input per sample (temperature)
    "argmax": ('''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.fc = torch.nn.Linear(6, 4)
    def forward(self, x, temperature):
        logits = self.fc(x) / temperature.unsqueeze(-1)
        return logits.argmax(dim=-1), logits.softmax(-1)
''', {"inputs": [{"name": "x", "dtype": "float32", "shape": [6]},
                {"name": "temperature", "dtype": "float32", "shape": [], "value_range": [0.5, 2.0]}],
      "outputs": [{"name": "label"}, {"name": "probs"}], "max_batch_size": 8}),
    # int64 ids, no data, a vocabulary (50) smaller than the default generated ids [0, 100)
    "embed": ('''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.emb = torch.nn.Embedding(50, 8)
    def forward(self, ids):
        return self.emb(ids).mean(1)
''', {"inputs": [{"name": "ids", "dtype": "int64", "shape": [5]}], "outputs": [{"name": "vec"}],
      "max_batch_size": 8}),
    # rejects every id it could be given: nothing to probe
    "ids_never": ('''
import torch
class M(torch.nn.Module):
    def forward(self, ids):
        if bool((ids >= 0).all()):
            raise IndexError("index out of range in self")
        return ids.float()
''', {"inputs": [{"name": "ids", "dtype": "int64", "shape": [5]}], "outputs": [{"name": "y"}],
      "max_batch_size": 8}),
    # no batching; the number of rows out depends on the data (detections above a score threshold)
    "detect": ('''
import torch
class M(torch.nn.Module):
    def forward(self, x):
        return x[x.sum(-1) > 0.5]
''', {"inputs": [{"name": "x", "dtype": "float32", "shape": [64, 4]}], "outputs": [{"name": "boxes"}],
      "max_batch_size": 0}),
    # the same with a threshold no generated input reaches: every output is empty
    "detect_empty": ('''
import torch
class M(torch.nn.Module):
    def forward(self, x):
        return x[x.sum(-1) > 100.0]
''', {"inputs": [{"name": "x", "dtype": "float32", "shape": [64, 4]}], "outputs": [{"name": "boxes"}],
      "max_batch_size": 0}),
    # a threshold every generated input passes: every run gives 64 rows, only the graph knows better
    "detect_full": ('''
import torch
class M(torch.nn.Module):
    def forward(self, x):
        return x[x.sum(-1) > -1000.0]
''', {"inputs": [{"name": "x", "dtype": "float32", "shape": [64, 4]}], "outputs": [{"name": "boxes"}],
      "max_batch_size": 0}),
    # per-token outputs over a dynamic sequence length: dynamo declares nn.LSTM's output at the example's length
    "tagger": ('''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 8); self.rnn = torch.nn.LSTM(8, 8, batch_first=True)
        self.head = torch.nn.Linear(8, 5)
    def forward(self, ids):
        return self.head(self.rnn(self.emb(ids))[0])
''', {"inputs": [{"name": "ids", "dtype": "int64", "shape": [-1], "value_range": [0, 50], "min_shape": [2],
                  "opt_shape": [6], "max_shape": [9]}], "outputs": [{"name": "tags"}], "max_batch_size": 4}),
    # every dtype the spec lists, in and out: raw uint8 HWC pixels normalised inside the model, an int64
    # label (scalar per sample) and float32 probabilities out, and bool/int8/int16/int32/float16/float64
    "mixed": ('''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.fc = torch.nn.Linear(3, 4)
    def forward(self, pixels, mask, scale, offset, ids, count, half):
        x = pixels.float().permute(0, 3, 1, 2) / 255.0
        feat = ((x - 0.5) / 0.25).mean((2, 3))
        logits = self.fc(feat) * scale.float().unsqueeze(-1) + offset.float() * 0.1 + ids.float() * 0.01
        logits = logits + mask.float() + half.float()
        probs = logits.softmax(-1)
        label = probs.argmax(-1)
        return (label, probs, probs.amax(-1).double(), mask & (ids.float() > 20),
                (offset.float() * 2).clamp(-128, 127).to(torch.int8), count + label.int(),
                half * 2, (ids.float() * 3).to(torch.int16), pixels[:, 0, 0, :])
''', {"inputs": [{"name": "pixels", "dtype": "uint8", "shape": [8, 8, 3]},
                {"name": "mask", "dtype": "bool", "shape": [4]},
                {"name": "scale", "dtype": "float64", "shape": [], "value_range": [0.5, 2.0]},
                {"name": "offset", "dtype": "int8", "shape": [4]},
                {"name": "ids", "dtype": "int16", "shape": [4]},
                {"name": "count", "dtype": "int32", "shape": []},
                {"name": "half", "dtype": "float16", "shape": [4]}],
      "outputs": [{"name": "label", "dtype": "int64"}, {"name": "probs", "dtype": "float32"},
                  {"name": "confidence", "dtype": "float64"}, {"name": "flags", "dtype": "bool"},
                  {"name": "offset2", "dtype": "int8"}, {"name": "total", "dtype": "int32"},
                  {"name": "half2", "dtype": "float16"}, {"name": "ids3", "dtype": "int16"},
                  {"name": "corner", "dtype": "uint8"}],
      "max_batch_size": 8}),
    # tensor names as other exporters write them: PyTorch's legacy 'input.1', tf2onnx's 'logits:0'
    "dotted": ('''
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.fc = torch.nn.Linear(6, 3)
    def forward(self, x):
        return self.fc(x)
''', {"inputs": [{"name": "input.1", "dtype": "float32", "shape": [6]}], "outputs": [{"name": "logits:0"}],
      "max_batch_size": 8}),
}


def write_model(root: Path, kind: str, name: str | None = None, **spec_changes) -> Path:
    """A spec folder for MODELS[kind]; returns its spec.yaml."""
    source, spec = MODELS[kind]
    folder = root / kind
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(source.lstrip() + "\n\ndef build():\n    return M()\n")
    data = {"name": name or kind, "source": {"module": "model:build"}, **spec, "variants": ["onnx", "torchscript"]}
    data.update(spec_changes)
    (folder / "spec.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "spec.yaml"
