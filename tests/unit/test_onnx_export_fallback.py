"""Stage export_onnx on a model no exporter takes: its onnx row must still be in the summary table."""

from __future__ import annotations

import textwrap

import yaml

from builder.pipeline import build
from builder.report import variant_rows


def spec_folder(tmp_path, layers: str, forward: str, inputs: list[dict], outputs: list[str], **spec):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.py").write_text(textwrap.dedent(f"""
        import torch
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__(); torch.manual_seed(0); {layers}
            def forward(self, x):
                {forward}
        def build():
            return M()
    """))
    data = {"name": "m", "source": {"module": "model:build"}, "inputs": inputs,
            "outputs": [{"name": n} for n in outputs], "max_batch_size": 4, **spec}
    (folder / "spec.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder / "spec.yaml"


def run_build(spec, tmp_path, quiet, variants):
    return build(spec, tmp_path / "repo", variants=variants, benchmark_seconds=0, progress=quiet).context


def test_when_every_exporter_fails_the_table_lists_onnx_as_failed_with_their_reasons(tmp_path, quiet):
    spec = spec_folder(tmp_path, "self.l = torch.nn.Linear(4, 4)",
                       "return torch.linalg.svdvals(self.l(x).reshape(-1, 2, 2))",
                       [{"name": "x", "dtype": "float32", "shape": [4]}], ["s"])
    ctx = run_build(spec, tmp_path, quiet, ["torchscript", "onnx"])
    row = next(r for r in variant_rows(ctx) if r["variant"] == "onnx")
    assert row["status"].startswith("FAILED to make: every ONNX exporter failed: dynamo: ")
    assert "legacy: " in ctx.not_made["onnx"][1]
