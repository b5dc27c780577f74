"""A model with data-dependent control flow: its trace is caught as unsafe and not shipped."""

from __future__ import annotations

import textwrap

import yaml

from builder.pipeline import build

BRANCHY = textwrap.dedent('''
    import torch

    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            if bool(x.sum() > 0):
                return x * self.scale
            return x - 1.0

    def build():
        return Branchy()
''')


def test_data_dependent_branch_is_trace_unsafe(tmp_path):
    folder = tmp_path / "branchy"
    folder.mkdir()
    (folder / "branchy_model.py").write_text(BRANCHY)
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "branchy", "source": {"module": "branchy_model:build"},
        "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}], "outputs": [{"name": "y"}],
        "max_batch_size": 8,
    }))
    result = build(spec, tmp_path / "repo", variants=["torchscript", "onnx"], benchmark_seconds=0,
                   progress=lambda m: None)
    ctx = result.context
    stage = next(r for r in ctx.results if r.stage == "export_torchscript")
    assert stage.outputs["trace_unsafe"] is True
    assert any(note.startswith("trace-unsafe") for note in ctx.notes)
    torchscript = ctx.variant("torchscript")
    assert torchscript.exporter == "torch.jit.script" and torchscript.verified is True
    # the ONNX exporters trace too: the frozen branch must fail verification, never be published
    onnx = ctx.variant("onnx")
    assert onnx is None or onnx.verified is False
    assert ctx.selected.name == "torchscript"
    report = (tmp_path / "repo" / "branchy" / "1" / "build_report.md").read_text()
    assert "trace-unsafe" in report
