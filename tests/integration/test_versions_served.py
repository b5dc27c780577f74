"""A model's versions share one config.pbtxt: two versions of different formats (ONNX, then TorchScript,
as the build's measured selection may pick on another day or host) are served side by side under
version_policy all by the python backend (target python) - each version's model.py finds its own model file -
and answer like their reference; validate passes both. A standard folder's versions share one backend
(tests/unit/test_interface_change.py)."""

from __future__ import annotations

import numpy as np
import pytest

from builder.pipeline import build
from builder.repository.metadata import read_reference
from builder.repository.validate import validate_model
from builder.serving.client import TritonClient
from builder.serving.embedded import EmbeddedServer
from tests.tiny_models import write_model

pytestmark = pytest.mark.integration


def test_versions_of_different_formats_serve_side_by_side(tmp_path, quiet):
    repo = tmp_path / "repo"
    for variant in ("onnx", "torchscript"):
        spec = write_model(tmp_path, "dotted", variants=[variant], deploy={"version_policy": "all",
                                                                                          "target": "python"})
        build(spec, repo, benchmark_seconds=0, progress=quiet)
    assert (repo / "dotted" / "1" / "model.onnx").is_file() and (repo / "dotted" / "2" / "model.pt").is_file()
    assert 'model_file"' in (repo / "dotted" / "config.pbtxt").read_text()
    cases, outputs = read_reference(repo / "dotted" / "1" / "reference.npz")
    with EmbeddedServer(repo, load_models=["dotted"], ready_timeout=90) as server:
        with TritonClient(server.http_url, "http") as client:
            for version in (1, 2):
                for case, expected in zip(cases, outputs):
                    got = client.infer("dotted", {"input.1": case["inputs"]["input.1"]}, version=version)
                    np.testing.assert_allclose(got["logits:0"], expected["logits:0"], rtol=1e-5, atol=1e-6)
    report = validate_model(repo / "dotted")
    assert report.ok, report
