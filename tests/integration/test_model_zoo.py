"""A fast subset of the model-zoo conformance run (benchmarks/model_zoo.py): transformers
architectures made from configs offline, built, verified, published, served on the embedded
tritonserver and checked over HTTP and gRPC. Marker slow (about a minute on 2 cores)."""

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
    require("transformers", "examples")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    zoo = _zoo()
    run_zoo, table = zoo.run_zoo, zoo.table
    rows = run_zoo(["resnet", "distilbert"], tmp_path, ["onnx"])
    assert all(not r["refusal"] for r in rows), table(rows)
    for row in rows:
        assert row["published"] == "onnx" and row["exporter"] in ("dynamo", "legacy")
        assert row["served_rel_l2"] is not None and row["served_rel_l2"] < 1e-5, table(rows)
