"""A module-wrapped BERT encoder built WITHOUT value_range (issue 49): its generated cases are inputs a
tokenizer could make (attention_mask: ones then zero padding, never a row of padding only - the rule its
name gives), so the faithful FP32 variants pass, and an INT8 variant is derived only from a base that
passed. Random weights from a tiny BertConfig (hidden 32, 2 layers, vocabulary 100), offline. Whether an
INT8 variant passes depends on the host's kernels and is not asserted; where it comes from is.
Marker slow (under a minute on 2 cores)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from builder.optimise.openvino_tools import cpu_plugin_problem
from builder.pipeline import build
from tests.conftest import ROOT, require

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = ROOT / "tests" / "bert_encoder_model.py"
SEQ = {"shape": [-1], "min_shape": [1], "opt_shape": [8], "max_shape": [16]}
INT8 = ["onnx_int8_dynamic", "openvino_int8"]


def test_bert_encoder_without_value_range_passes_and_int8_comes_only_from_a_passing_base(tmp_path, monkeypatch):
    require("transformers", "examples")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "bert"
    folder.mkdir()
    shutil.copy(MODEL, folder / "bert_model.py")
    spec = {"name": "bert_enc", "source": {"module": "bert_model:build"}, "max_batch_size": 4,
            "inputs": [{"name": "input_ids", "dtype": "int64", **SEQ}, {"name": "attention_mask", "dtype": "int64", **SEQ}],
            "outputs": [{"name": "last_hidden_state"}], "quantization": {"search": "off"}}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    openvino_runs = cpu_plugin_problem() is None
    fp32 = ["onnx", "onnx_opt"] + (["openvino"] if openvino_runs else [])
    said: list[str] = []
    result = build(folder / "spec.yaml", tmp_path / "repo", variants=fp32 + INT8, benchmark_seconds=0,
                   progress=said.append)
    ctx = result.context

    load = next(r for r in ctx.results if r.stage == "load")
    assert load.outputs["generated_inputs"]["attention_mask"].endswith("(transformers name)")
    mask_cases = [c["inputs"]["attention_mask"] for c in ctx.reference.cases]
    assert all((m[:, 0] == 1).all() for m in mask_cases)  # no row of padding only, at any size
    assert any((m == 0).any() for m in mask_cases)  # padding is exercised

    states = {v.name: (v.verified, v.rejected.splitlines()[:3]) for v in ctx.variants}
    for name in fp32:
        assert ctx.variant(name) is not None and ctx.variant(name).verified is True, (name, states, ctx.not_made)
    for name in INT8:
        variant = ctx.variant(name)
        if variant is None:  # skipped (NotApplicable, its base failed, no CPU plugin): never a failure to make
            assert ctx.not_made[name][0] == "skipped", ctx.not_made
            continue
        base = ctx.variant(variant.base)
        assert base is not None and base.verified is True, (name, variant.base, states)
        assert variant.verification["vs_base"]["base"] == variant.base
    assert any(line.startswith("  generated inputs: input_ids: ") for line in said)
    report = next((tmp_path / "repo").rglob("build_report.md")).read_text()
    assert "## Generated inputs" in report and "- attention_mask: padding mask: ones, then zero padding" in report
