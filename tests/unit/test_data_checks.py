"""The user's data checked at stage load (builder/accuracy/data_checks.py): labels against the output they
score (which one, their count, dtype, shape and range), data files that are not .npz archives or hold
no sample, and validation / calibration data the model fails on - each refused naming the file and
array - plus the top-1 choice (a class-id output is scored as it is, not argmaxed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from builder.core.errors import UserInputError
from builder.spec.model import load_spec
from builder.stages import load
from builder.stages.base import BuildContext, BuildOptions
from builder.accuracy.tensors import top1_accuracy, top1_output
from tests.tiny_models import write_model


def run_load(spec_path: Path, tmp_path: Path) -> BuildContext:
    """Stage load alone on the spec (nothing else runs; nothing is written)."""
    ctx = BuildContext(spec=load_spec(spec_path), options=BuildOptions(repository=tmp_path / "repo"),
                       workdir=tmp_path / "work", progress=lambda m: None)
    load.run(ctx)
    return ctx


def with_data(spec_path: Path, **arrays_by_field) -> Path:
    """spec_path with data.<field> set to an .npz of the given arrays (written beside it)."""
    data = {}
    for field, arrays in arrays_by_field.items():
        path = spec_path.parent / f"{field}.npz"
        if isinstance(arrays, (str, bytes)):
            path.write_text(arrays)
        else:
            np.savez(path, **arrays)
        data[field] = path.name
    spec = yaml.safe_load(spec_path.read_text())
    spec["data"] = data
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return spec_path


def argmax_arrays(count: int = 20) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((count, 6)).astype(np.float32),
            "temperature": rng.uniform(0.5, 2.0, count).astype(np.float32)}


def test_top1_scores_a_class_id_output_as_it_is_and_else_the_first_float_scores():
    labels = np.array([2, 0, 1])
    logits = np.eye(3, dtype=np.float32)[[2, 0, 0]]
    ids = np.array([2, 0, 1])
    # (argmax, logits): the class ids are the model's answer, wherever they come
    assert top1_output({"cls": ids, "logits": logits}, labels) == "cls"
    assert top1_output({"logits": logits, "cls": ids}, labels) == "cls"
    assert top1_accuracy(ids, labels) == 100.0  # an argmax over [N, 1] would always say class 0
    assert top1_accuracy(logits, labels) == pytest.approx(200 / 3)
    assert top1_output({"score": np.zeros(3, np.float32), "logits": logits}, labels) == "logits"
    assert top1_output({"score": np.zeros(3, np.float32), "mask": np.ones(3, bool)}, labels) is None
    # per-token labels [N, T] score an output [N, T, classes] along its last axis
    tags = np.zeros((3, 4, 5), np.float32)
    tags[..., 1] = 1.0
    assert top1_output({"tags": tags}, np.ones((3, 4), np.int64)) == "tags"
    assert top1_accuracy(tags, np.ones((3, 4), np.int64)) == 100.0
    # a map [C, H, W] per sample against one label per sample: no class axis to score (an argmax over
    # the flattened map read accuracy 0.0); [N, 1, classes] still scores its classes
    assert top1_output({"seg": np.zeros((3, 4, 8, 8), np.float32)}, labels) is None
    assert top1_output({"seg": np.zeros((3, 4, 8, 8), np.float32), "logits": logits[:, None, :]}, labels) == "logits"


def test_a_class_id_output_first_is_the_one_labels_score(tmp_path):
    import torch

    spec = write_model(tmp_path, "argmax")  # returns (label = argmax, probs)
    arrays = argmax_arrays()
    with torch.no_grad():
        labels = run_load(spec, tmp_path).model(*map(torch.from_numpy, arrays.values()))[0].numpy()
    ctx = run_load(with_data(spec, validation=dict(arrays, labels=labels)), tmp_path)
    ref = ctx.reference
    assert ref.top1_output == "label"
    assert top1_accuracy(ref.validation_outputs[ref.top1_output], ref.labels) == 100.0


@pytest.mark.parametrize("labels, message", [
    (np.zeros(7, np.int64), r"data.validation\['labels'\] \(validation.npz\) has 7 label\(s\) for 20 samples; "
                            r"give one per sample"),
    (np.zeros(20, np.float32), r"data.validation\['labels'\] \(validation.npz\) is float32; give integer class ids"),
    (np.where(np.arange(20) == 3, 99, 1), r"data.validation\['labels'\] \(validation.npz\) holds 1 class id \(99 at "
                                          r"sample 3\) outside 0..3 \(output 'probs' scores 4 classes\)"),
    (np.full(20, -1), r"holds 20 class ids \(-1 at sample 0, -1 at sample 1, -1 at sample 2, ...\) outside 0..3"),
    (np.zeros((20, 5), np.int64), r"data.validation\['labels'\] \(validation.npz\) has per-sample shape \[5\], which "
                                  r"no output's fits .*give one class id per sample"),
])
def test_labels_that_do_not_fit_are_refused_naming_them(tmp_path, labels, message):
    spec = with_data(write_model(tmp_path, "argmax"), validation=dict(argmax_arrays(), labels=labels))
    with pytest.raises(UserInputError, match=message):
        run_load(spec, tmp_path)


def test_per_token_labels_score_the_per_token_output(tmp_path):
    spec = write_model(tmp_path, "tagger")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, (10, 6))
    ctx = run_load(with_data(spec, validation={"ids": ids, "labels": rng.integers(0, 5, (10, 6))}), tmp_path)
    assert ctx.reference.top1_output == "tags"
    spec = with_data(spec, validation={"ids": ids, "labels": np.full((10, 6), 5)})
    with pytest.raises(UserInputError, match=r"holds 60 class ids \(5 at \[0, 0\], .*outside 0..4 \(output 'tags'"):
        run_load(spec, tmp_path)


def test_labels_no_output_can_score_are_dropped_with_a_warning(tmp_path):
    spec = write_model(tmp_path, "dotted")  # fc(x) [N, 3]: changed to one float per sample (a regression)
    model = spec.parent / "model.py"
    model.write_text(model.read_text().replace("return self.fc(x)", "return self.fc(x)[:, 0]"))
    spec = with_data(spec, validation={"input.1": np.ones((4, 6), np.float32), "labels": np.zeros(4, np.int64)})
    ctx = run_load(spec, tmp_path)
    assert ctx.reference.labels is None and ctx.reference.top1_output is None
    assert any("no output holds classes" in note and "top-1 accuracy is not measured" in note
               for note in ctx.notes), ctx.notes


def test_a_data_file_that_is_not_an_npz_or_holds_no_sample(tmp_path):
    spec = write_model(tmp_path, "argmax")
    with pytest.raises(UserInputError, match=r"data.validation: .*validation.npz is not an .npz archive; save one "
                                             r"array per input, keyed by its name, with np.savez"):
        run_load(with_data(spec, validation="x,temperature\n1,2\n"), tmp_path)
    with pytest.raises(UserInputError, match=r"data.validation has 0 samples \(validation.npz: every array's first "
                                             r"dimension is 0\)"):
        run_load(with_data(spec, validation=argmax_arrays(0)), tmp_path)
    with pytest.raises(UserInputError, match=r"data.calibration has 0 samples"):
        run_load(with_data(spec, calibration=argmax_arrays(0)), tmp_path)


def test_ids_past_the_vocabulary_name_the_data_array_not_the_spec(tmp_path):
    spec = write_model(tmp_path, "embed", inputs=[{"name": "ids", "dtype": "int64", "shape": [5],
                                                  "value_range": [0, 50]}])
    bad = np.full((12, 5), 7)
    bad[9, 2] = 120  # past Embedding(50): in the last batch, not the first
    with pytest.raises(UserInputError, match=r"data.validation\['ids'\]: the model fails on validation.npz \(index "
                                             r"out of range in self\) but runs on generated inputs .*'ids' holds "
                                             r"7..120, outside \[0, 50\)"):
        run_load(with_data(spec, validation={"ids": bad}), tmp_path)
    with pytest.raises(UserInputError, match=r"data.calibration\['ids'\]: the model fails on calibration.npz"):
        run_load(with_data(spec, calibration={"ids": bad}), tmp_path)


def test_too_few_calibration_samples_are_warned_about(tmp_path):
    spec = write_model(tmp_path, "argmax")
    ctx = run_load(with_data(spec, calibration=argmax_arrays(1)), tmp_path)
    assert any("data.calibration (calibration.npz) holds 1 sample, too few for INT8 calibration" in note
               and "give 100 or more" in note for note in ctx.notes), ctx.notes
    ctx = run_load(with_data(spec, calibration=argmax_arrays(40)), tmp_path)
    assert not any("calibration" in note for note in ctx.notes), ctx.notes


def test_verify_scores_the_class_id_output(tmp_path):
    import torch

    from builder.pipeline import build

    spec = write_model(tmp_path, "argmax")
    arrays = argmax_arrays()
    with torch.no_grad():
        labels = run_load(spec, tmp_path).model(*map(torch.from_numpy, arrays.values()))[0].numpy()
    labels[:5] = (labels[:5] + 1) % 4  # 75% right: an argmax over the [N] class ids would score class 0 instead
    result = build(with_data(spec, validation=dict(arrays, labels=labels)), tmp_path / "repo", variants=["onnx"],
                   benchmark_seconds=0, progress=lambda m: None)
    accuracy = result.context.variant("onnx").accuracy
    assert (accuracy["output"], accuracy["reference"], accuracy["variant"]) == ("label", 75.0, 75.0)
