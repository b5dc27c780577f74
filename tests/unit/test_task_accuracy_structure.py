"""A compressed variant (verified by task accuracy, not closeness) still fails on an output it no longer
gives in the config's shape, or gives NaN for: a pruned layer feeding a returned tensor made 'emb' 8 wide
where the config says 16, verify passed it, and the build died at publish."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from builder.stages.base import Variant
from builder.stages.verify import _task_accuracy_only
from builder.tensors import compare_outputs


def _check(variant_outputs):
    reference = {"logits": np.ones((3, 4), np.float32), "emb": np.ones((3, 16), np.float32)}
    ctx = SimpleNamespace(reference=SimpleNamespace(labels=np.zeros(3, np.int64)))
    variant = Variant("onnx_pruned", "onnx", "fp32", Path("m"))
    variant.verification = {}
    return _task_accuracy_only(ctx, variant, [variant_outputs], compare_outputs(reference, variant_outputs))


def test_a_compressed_variant_is_judged_on_its_outputs_shapes_and_finiteness_not_closeness():
    far = {"logits": np.full((3, 4), 7.0, np.float32), "emb": np.full((3, 16), -2.0, np.float32)}
    assert _check(far) == []  # another function by design: closeness is not judged
    narrower = dict(far, emb=np.ones((3, 8), np.float32))
    assert _check(narrower) == ["emb: shape [3, 8] != reference [3, 16]"]
    nan = dict(far, emb=np.where(np.eye(3, 16) > 0, np.nan, 1.0).astype(np.float32))
    assert _check(nan) == ["emb: 3 of 48 values are NaN/Inf in the variant where the reference is finite"]
