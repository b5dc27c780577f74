"""A fast subset of the model-zoo conformance run (benchmarks/model_zoo.py): a transformers
architecture made from its config offline and two plain-torch models of benchmarks/zoo_models.py,
built, verified, published, served on the embedded tritonserver and checked over HTTP and gRPC.
Marker slow (about half a minute on 2 idle cores)."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT, require


def _zoo():
    import importlib.util
    spec = importlib.util.spec_from_file_location("model_zoo", ROOT / "benchmarks" / "model_zoo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_zoo_subset_builds_serves_and_checks(tmp_path, monkeypatch):
    """A transformers encoder, a detector whose outputs' length depends on the data (no batch dimension)
    and a loop whose trip count depends on the input values (trace-unsafe: the scripted TorchScript is
    published, the traced ONNX fails verification), served together, checked over HTTP and gRPC."""
    require("transformers", "examples")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    zoo = _zoo()
    run_zoo, table = zoo.run_zoo, zoo.table
    rows = {r["model"]: r for r in run_zoo(["distilbert", "detector", "refine_loop"], tmp_path,
                                           ["onnx", "torchscript"])}
    text = table(list(rows.values()))
    assert all(not r["refusal"] for r in rows.values()), text
    for row in rows.values():
        assert row["served_rel_l2"] is not None and row["served_rel_l2"] < 1e-5, text
    assert rows["distilbert"]["published"] == "onnx" and rows["distilbert"]["exporter"] in ("dynamo", "legacy")
    assert rows["detector"]["published"] == "onnx", text
    assert rows["refine_loop"]["published"] == "torchscript" and rows["refine_loop"]["verified"] == "torchscript", text
    assert "trace-unsafe" in rows["refine_loop"]["note"], text
    assert all(r["speedup"] is None for r in rows.values()) and "| x FP32 onnx |" in text  # nothing measured
    config = (tmp_path / "model_repository" / "zoo_detector" / "config.pbtxt").read_text()
    assert "max_batch_size: 0" in config and "dims: [ -1, 4 ]" in config and "dims: [ -1 ]" in config
