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
