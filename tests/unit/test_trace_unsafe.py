"""A model with data-dependent control flow: its trace is caught as unsafe and not shipped."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from builder.core.errors import VerificationError
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


LOOPY = textwrap.dedent('''
    import torch

    class Loopy(torch.nn.Module):
        """The loop's trip count depends on the input values."""

        def forward(self, x):
            for _ in range(int(x.abs().sum() * 1000) % 7 + 1):
                x = torch.tanh(x) * 1.5 + 0.1
            return x

    def build():
        return Loopy()
''')


def test_a_data_dependent_loop_with_onnx_only_fails_naming_the_trace_and_the_fix(tmp_path):
    """dynamo refuses the loop, the legacy exporter traces it (trip count frozen): verification fails, and
    the error says why and what to do instead of only the numbers."""
    folder = tmp_path / "loopy"
    folder.mkdir()
    (folder / "loopy_model.py").write_text(LOOPY)
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "loopy", "source": {"module": "loopy_model:build"},
        "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}], "outputs": [{"name": "y"}],
        "max_batch_size": 0,  # the trip count comes from the whole input: a batch would mix samples (refused)
    }))
    with pytest.raises(VerificationError, match=r"(?s)onnx: failed verification:.*hint: the legacy exporter TRACES "
                                                r"the model.*frozen at the export example; add torchscript to variants"):
        build(spec, tmp_path / "repo", variants=["onnx"], benchmark_seconds=0, progress=lambda m: None)
