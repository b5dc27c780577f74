"""Task-aware verification (builder/accuracy/task_metrics.py, verify.metric): an embedding judged by per-sample cosine,
similarity order and nearest neighbours, with injected outputs; and the verdict a real build records."""

from __future__ import annotations

import numpy as np
import pytest

from builder.core.errors import UserInputError
from builder.spec.model import VerifySpec
from builder.accuracy.task_metrics import embedding_failures, embedding_metrics
from builder.accuracy.tensors import compare_outputs, merge_case_metrics, tolerance_failures

RNG = np.random.default_rng(0)
REFERENCE = RNG.normal(size=(64, 32)).astype(np.float32)
EMBEDDING = VerifySpec(metric="embedding")


def test_a_rescaled_embedding_keeps_its_task_but_fails_a_whole_tensor_rel_l2():
    """Every vector scaled by 0.8-1.2 (what an INT8 scale error does): direction, order and neighbours are
    intact, so a retrieval user sees no change; a whole-tensor rel L2 reads ~0.11 and refuses it."""
    scaled = REFERENCE * RNG.uniform(0.8, 1.2, size=(64, 1)).astype(np.float32)
    metrics = compare_outputs({"embedding": REFERENCE}, {"embedding": scaled})
    m = metrics["embedding"]
    assert m["rel_l2"] > 0.1 and m["row_cosine_min"] > 0.9999 and m["spearman"] > 0.999 and m["neighbours_kept"] == 1
    assert tolerance_failures(metrics, VerifySpec().tolerance("int8"))  # rel_l2 metric: refused
    assert tolerance_failures(metrics, EMBEDDING.tolerance("int8")) == []  # embedding metric: passes


def test_a_scrambled_embedding_fails_with_its_numbers():
    noisy = REFERENCE + RNG.normal(scale=1.0, size=REFERENCE.shape).astype(np.float32)
    metrics = compare_outputs({"embedding": REFERENCE}, {"embedding": noisy})
    failures = tolerance_failures(metrics, EMBEDDING.tolerance("int8"))
    assert len(failures) == 1 and failures[0].startswith("embedding: per-sample cosine ")
    assert "similarity-order Spearman" in failures[0] and "top-5 neighbours kept" in failures[0]


def test_order_and_neighbours_need_four_samples_and_merge_to_the_worst_case():
    assert set(embedding_metrics(REFERENCE[:3], REFERENCE[:3])) == {"row_cosine_min"}
    assert embedding_metrics(REFERENCE[0], REFERENCE[0]) == {}  # one vector: no samples to tell apart
    swapped = REFERENCE[:8].copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # two samples answered with each other's vectors
    merged = merge_case_metrics([compare_outputs({"e": REFERENCE[:8]}, {"e": REFERENCE[:8]}),
                                 compare_outputs({"e": REFERENCE[:8]}, {"e": swapped})])
    assert merged["e"]["row_cosine_min"] < 0.5 and merged["e"]["spearman"] < 1.0
    assert embedding_failures(merged["e"], {"min_row_cosine": 0.99})[0].startswith("per-sample cosine ")


def test_the_metric_applies_to_lossy_variants_and_fp32_stays_exact():
    assert "rel_l2" not in EMBEDDING.tolerance("int8") and EMBEDDING.tolerance("int8")["min_row_cosine"] == 0.99
    assert EMBEDDING.tolerance("fp32")["rel_l2"] == 1e-5 and "min_row_cosine" not in EMBEDDING.tolerance("fp32")
    custom = VerifySpec(metric="embedding", tolerances={"int8": {"min_spearman": 0.95}})
    assert custom.tolerance("int8")["min_spearman"] == 0.95


def test_an_unknown_metric_or_a_similarity_over_one_is_refused_naming_the_field(digits_copy):
    from builder.spec.model import load_spec
    from tests.conftest import edit_spec

    with pytest.raises(UserInputError, match=r"field 'verify.metric': 'cosine' is not supported; use one of: rel_l2, embedding"):
        load_spec(edit_spec(digits_copy, verify={"metric": "cosine"}))
    with pytest.raises(UserInputError, match=r"field 'verify.tolerances.int8.min_row_cosine': is a similarity or share of at "
                                             r"most 1, got 1.5"):
        load_spec(edit_spec(digits_copy, verify={"metric": "embedding", "tolerances": {"int8": {"min_row_cosine": 1.5}}}))
    assert load_spec(edit_spec(digits_copy, verify={"metric": "embedding"})).verify.metric == "embedding"


@pytest.mark.slow(reason="builds a model")
def test_a_build_records_the_task_verdict_with_its_numbers(tmp_path, quiet):
    import shutil

    import yaml

    from builder.pipeline import build
    from tests.conftest import ROOT

    folder = tmp_path / "bert_tiny"
    shutil.copytree(ROOT / "examples" / "bert_tiny", folder, ignore=shutil.ignore_patterns("__pycache__"))
    spec = yaml.safe_load((folder / "spec.yaml").read_text())
    spec["verify"] = {"metric": "embedding"}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    result = build(folder / "spec.yaml", tmp_path / "repo", variants=["onnx", "onnx_int8_dynamic"],
                   benchmark_seconds=0, progress=quiet)
    int8 = result.context.variant("onnx_int8_dynamic")
    task = int8.verification["task_metric"]
    assert task["metric"] == "embedding" and task["samples"] > 4
    assert set(task["numbers"]["embedding"]) == {"row_cosine_min", "spearman", "neighbours_kept"}
    assert task["limits"] == {"min_row_cosine": 0.99, "min_spearman": 0.99, "min_neighbours": 0.9}
    assert any(n.startswith("judged as an embedding on ") and "per-sample cosine" in n for n in int8.notes)
    assert "task_metric" not in (result.context.variant("onnx").verification or {})  # FP32: rel L2 as before


def test_the_cases_show_the_same_function_and_the_validation_set_holds_the_task():
    """The verification cases hold generated inputs (random token ids): their similarity order means nothing,
    so there only a per-sample cosine >= 0.95 is asked; data.validation is held to the full tolerance."""
    from builder.accuracy.task_metrics import on_cases

    full = EMBEDDING.tolerance("int8")
    assert on_cases(full) == {"max_mismatch": 0.05, "min_row_cosine": 0.95}
    assert on_cases(VerifySpec().tolerance("int8")) == VerifySpec().tolerance("int8")  # rel_l2: unchanged


def test_a_near_zero_dimension_is_no_lost_signal_for_an_embedding():
    reference = REFERENCE.copy()
    reference[:, 2] *= 1e-4  # one dimension ~0: a whole-tensor check reads its noise as a lost column
    noisy = reference.copy()
    noisy[:, 2] += RNG.normal(scale=3e-3, size=len(noisy)).astype(np.float32)
    metrics = compare_outputs({"embedding": reference}, {"embedding": noisy})
    assert any("is lost" in line for line in tolerance_failures(metrics, VerifySpec().tolerance("int8")))
    assert tolerance_failures(metrics, EMBEDDING.tolerance("int8")) == []


LOGITS = RNG.normal(size=(200, 5)).astype(np.float32)
TEXT = VerifySpec(metric="text_classification")


def test_a_classifier_is_judged_by_the_labels_it_keeps():
    """Logits shifted and rescaled per sample keep every label (rel L2 refuses them); one label in ten
    flipped is refused with its share - per sample for text, per token for token classification."""
    from builder.accuracy.task_metrics import label_metrics

    shifted = LOGITS * 1.3 + RNG.normal(size=(200, 1)).astype(np.float32)
    metrics = compare_outputs({"logits": LOGITS}, {"logits": shifted})
    assert metrics["logits"]["label_agreement"] == 1.0 and metrics["logits"]["rel_l2"] > 0.1
    assert tolerance_failures(metrics, VerifySpec().tolerance("int8"))
    assert tolerance_failures(metrics, TEXT.tolerance("int8")) == []
    flipped = LOGITS.copy()
    rows = np.arange(0, 200, 10)
    flipped[rows] = -flipped[rows]  # the lowest logit becomes the highest: those labels change
    failures = tolerance_failures(compare_outputs({"logits": LOGITS}, {"logits": flipped}), TEXT.tolerance("int8"))
    assert len(failures) == 1 and failures[0].startswith("logits: labels kept 0.9000 < 0.99")
    tokens = RNG.normal(size=(4, 16, 9)).astype(np.float32)
    changed = tokens.copy()
    changed[0, :4] = -changed[0, :4]  # 4 of 64 tokens relabelled
    assert label_metrics(tokens, changed) == {"label_agreement": 60 / 64}
    assert label_metrics(LOGITS[:, :1], LOGITS[:, :1]) == {}  # one column: no label to keep
    token = VerifySpec(metric="token_classification")
    assert token.tolerance("int8")["min_label_agreement"] == 0.99 and "rel_l2" not in token.tolerance("int8")


def test_on_the_generated_cases_most_labels_must_be_kept():
    from builder.accuracy.task_metrics import on_cases

    assert on_cases(TEXT.tolerance("int8"))["min_label_agreement"] == 0.9
    assert TEXT.tolerance("fp32")["rel_l2"] == 1e-5  # FP32 stays exact


@pytest.mark.slow(reason="builds a model")
def test_a_classifier_build_records_its_label_verdict(digits_copy, tmp_path, quiet):
    from builder.pipeline import build
    from builder.spec.model import load_spec
    from tests.conftest import edit_spec

    spec = edit_spec(digits_copy, verify={"metric": "text_classification"})
    assert load_spec(spec).verify.metric == "text_classification"
    result = build(spec, tmp_path / "repo", variants=["onnx", "onnx_int8_dynamic"], benchmark_seconds=0, progress=quiet)
    int8 = result.context.variant("onnx_int8_dynamic")
    task = int8.verification["task_metric"]
    assert task["metric"] == "text_classification" and task["limits"] == {"min_label_agreement": 0.99}
    assert set(task["numbers"]["logits"]) == {"label_agreement"} and 0 <= task["numbers"]["logits"]["label_agreement"] <= 1
    assert any(n.startswith("judged as a text classification on ") and "labels kept on " in n for n in int8.notes)
