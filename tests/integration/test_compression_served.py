"""Training-time compression on the real embedded tritonserver: digits built with onnx_pruned,
onnx_distilled and onnx_qat_int8 on small budgets (every eligible variant published), each verified
by task accuracy, served by the python backend, and the served gate (check) passing over HTTP and
gRPC against each variant's OWN verified outputs (its reference.npz)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import yaml

from builder.pipeline import build
from builder.repository.metadata import read_metadata, read_reference
from builder.serving.check import check_served
from builder.serving.embedded import EmbeddedServer
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.integration

COMPRESSED = ("onnx_pruned", "onnx_distilled", "onnx_qat_int8")


@pytest.fixture(scope="module")
def compressed_repository(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compressed")
    folder = tmp / "digits"
    shutil.copytree(EXAMPLES / "digits", folder, ignore=shutil.ignore_patterns("__pycache__"))
    spec = yaml.safe_load((folder / "spec.yaml").read_text())
    spec["compression"] = {"prune_ratio": 0.5, "prune_steps": 2, "steps": 60, "seconds": 60}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    repo = tmp / "model_repository"
    # no measuring: the preference order publishes onnx as digits_cnn, the others as digits_cnn__<variant>
    result = build(folder / "spec.yaml", repo, variants=["onnx", *COMPRESSED], benchmark_seconds=0,
                   publish_variants=True, progress=lambda message: None)
    return repo, result


def test_compressed_variants_serve_and_pass_check_against_their_own_outputs(compressed_repository):
    repo, result = compressed_repository
    ctx = result.context
    for name in COMPRESSED:
        variant = ctx.variant(name)
        assert variant.verified and variant.verified_by == "task_accuracy", (name, variant.rejected)
        assert variant.accuracy["drop"] <= 1.0 and variant.published_as == f"digits_cnn__{name}"
        meta = read_metadata(repo / variant.published_as / "1" / "metadata.yaml")
        assert meta["verified_by"] == "task_accuracy" and meta["compression"]["method"]
        _, stored = read_reference(repo / variant.published_as / "1" / "reference.npz")
        _, reference = read_reference(repo / "digits_cnn" / "1" / "reference.npz")  # onnx: the eager reference's
        assert not np.allclose(stored[0]["logits"], reference[0]["logits"], rtol=1e-5, atol=1e-5), name
    assert ctx.variant("onnx_qat_int8").precision == "int8"
    server = EmbeddedServer(repo, ready_timeout=120)
    server.start()
    try:
        for name in ("digits_cnn", *(f"digits_cnn__{n}" for n in COMPRESSED)):
            report = check_served(name, repository=repo, url=server.http_url, grpc_url=server.grpc_url)
            assert report.ok, "\n".join(report.lines())
            assert set(report.metrics) == {"http", "grpc"}
            if name != "digits_cnn":
                assert report.lines()[-1].startswith(f"- compared with: the {name.split('__')[1]} variant's own outputs "
                                                     "(verified by task accuracy at build time: top-1 ")
    finally:
        server.stop()
    assert not server.is_running()
