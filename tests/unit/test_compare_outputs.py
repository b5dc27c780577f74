"""compare_outputs / tolerance_failures (builder/accuracy/tensors.py), the one comparison behind verify, check,
validate, select and the regression gate: a variant's NaN where the reference is finite, a mixed-scale
output whose small columns a variant lost, and which output top-1 accuracy is scored on."""

from __future__ import annotations

import numpy as np
import pytest

from builder.repository.regression import RegressionCheck, _gate
from builder.accuracy.tensors import UNMEASURED, compare_outputs, merge_case_metrics, tolerance_failures, top1_output

INT8 = {"rel_l2": 0.1}


def test_nan_in_the_variant_where_the_reference_is_finite_fails_every_tolerance():
    reference = {"y": np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)}
    variant = {"y": np.array([[1.0, 2.0, np.nan, 4.0]], np.float32)}
    metrics = merge_case_metrics([compare_outputs(reference, variant), compare_outputs(reference, reference)])
    for tolerance in (INT8, {"rel_l2": 1e-5, "max_abs": 1e-3, "min_cosine": 0.99}, {}):
        assert tolerance_failures(metrics, tolerance) == [
            "y: 1 of 8 values are NaN/Inf in the variant where the reference is finite"]
    check = RegressionCheck(2, 1)
    check.outputs = metrics
    _gate(check, {"rel_l2": 1.0})
    assert check.failures == ["outputs y: rel L2 inf from version 1 > rel_l2=1 (nonfinite_in_variant)"]



@pytest.mark.parametrize("key", UNMEASURED)
def test_every_output_without_a_distance_fails_verification_and_the_regression_gate(key):
    """One list of the keys that leave an output without a distance: verify and the gate read it alike."""
    metrics = {"y": {key: 1.0, "rel_l2": 0.0, "max_abs": 0.0, "max_rel": 0.0, "cosine": 1.0, "compared": 4.0,
                     "got": [2], "expected": [3]}}
    assert len(tolerance_failures(metrics, INT8)) == 1
    check = RegressionCheck(2, 1)
    check.outputs = {"y": {key: 1.0, "rel_l2": 0.0}}
    _gate(check, {"rel_l2": 1.0})
    assert check.failures == [f"outputs y: rel L2 inf from version 1 > rel_l2=1 ({key})"]

def test_a_nan_metric_fails_instead_of_passing():
    metrics = {"y": {"rel_l2": float("nan"), "max_abs": 0.0, "max_rel": 0.0, "cosine": 1.0, "compared": 4.0}}
    assert tolerance_failures(metrics, INT8)[0].startswith("y: rel L2 nan > 1e-01")


def _boxes_and_probs(rows: int, seed: int = 0) -> np.ndarray:
    """[rows, 8]: four pixel coordinates 0..640 beside four class probabilities 0..1 (a detection head)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.uniform(0, 640, (rows, 4)), rng.uniform(0, 1, (rows, 4))], axis=1).astype(np.float32)


def test_a_variant_that_lost_the_small_columns_of_a_mixed_scale_output_fails():
    ref = _boxes_and_probs(64)
    wiped = ref.copy()
    wiped[:, :4] += np.float32(0.3)  # boxes a little off, as per-tensor INT8 rounding makes them
    wiped[:, 4:] = 0.0               # every probability rounded to 0
    metrics = compare_outputs({"det": ref}, {"det": wiped})
    assert metrics["det"]["rel_l2"] < 1e-2  # the whole tensor's rel L2 saw nothing wrong
    failures = tolerance_failures(metrics, INT8)
    assert len(failures) == 1
    assert failures[0].startswith("det: column 4 of the last axis (values ~0.") and \
        "in its largest column) is lost: rel L2 1.0e+00 of its own values" in failures[0]


@pytest.mark.parametrize("noise", [1e-3, 5e-2])
def test_small_columns_kept_within_their_own_scale_pass(noise):
    ref = _boxes_and_probs(64)
    rng = np.random.default_rng(1)
    close = ref * (1 + noise * rng.standard_normal(ref.shape)).astype(np.float32)
    assert tolerance_failures(compare_outputs({"det": ref}, {"det": close}), INT8) == []


def test_homogeneous_outputs_and_few_rows_are_not_judged_by_column():
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 5, (64, 10)).astype(np.float32)
    step = np.float32(np.abs(logits).max() / 127)  # INT8-like rounding of the whole tensor
    quantized = np.round(logits / step) * step
    assert "lost_column_rel_l2" not in compare_outputs({"y": logits}, {"y": quantized})["y"]
    one = np.array([[10.0, -8.0, 0.001, 6.0]], np.float32)  # one sample: a near-zero logit is chance
    assert "lost_column_rel_l2" not in compare_outputs({"y": one}, {"y": np.round(one)})["y"]


def test_merged_cases_keep_the_worst_cases_column():
    ref = _boxes_and_probs(16)
    worse, better = ref.copy(), ref.copy()
    worse[:, 5] = 0.0
    better[:, 6] *= 0.2
    merged = merge_case_metrics([compare_outputs({"det": ref}, {"det": better}),
                                 compare_outputs({"det": ref}, {"det": worse})])
    assert merged["det"]["lost_column_rel_l2"] == pytest.approx(1.0)
    assert merged["det"]["lost_column"].startswith("column 5 ")


def test_top1_scores_the_output_the_labels_fit_not_the_first_one():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 10, 200)
    logits = rng.normal(0, 1, (200, 10)).astype(np.float32)
    logits[np.arange(200), labels] += 5  # the head knows the classes
    features = rng.normal(0, 1, (200, 256)).astype(np.float32)  # an embedding: its argmax is noise
    assert top1_output({"features": features, "logits": logits}, labels) == "logits"
    ids = logits.argmax(axis=1).astype(np.int64)
    assert top1_output({"features": features, "logits": logits, "ids": ids}, labels) == "ids"
    # an integer output with one value per sample that is not a class id (a token count): not scored
    tokens = rng.integers(1, 30, 200)
    assert top1_output({"n_tokens": tokens, "logits": logits}, labels) == "logits"
