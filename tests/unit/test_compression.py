"""Training-time compression (stage compress, builder/compression/): real torch-pruning, real
fine-tuning, real onnxruntime, on tiny models and tiny budgets.

Covered: the budget stop (steps and an injected clock), the SKIPPED reason naming data.training,
structured pruning through a residual addition and a concatenation (shapes, ONNX runs and agrees),
determinism of a rerun, the spec keys, and verification by task accuracy on digits: the pass path
(its own outputs become reference.npz, metadata says verified_by: task_accuracy) and the fail path
(an accuracy budget nothing can meet).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from builder.compression.prune import count_params_macs, prune_iteratively
from builder.compression.train import Budget, TrainingData, cross_entropy, fine_tune
from builder.core.errors import UserInputError
from builder.pipeline import build
from builder.repository.metadata import read_metadata, read_reference
from builder.model.runtime import open_runner
from builder.spec.model import parse_spec
from builder.spec.compression import CompressionSpec
from builder.stages.base import Status
from builder.stages.common import export_module_onnx
from tests.conftest import EXAMPLES


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = self.stem(x)
        h = torch.relu(self.body(h) + h)  # the residual: stem and body's last conv must keep equal channels
        return self.head(h.mean((2, 3)))


class Concat(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.left = nn.Conv2d(3, 8, 3, padding=1)
        self.right = nn.Conv2d(3, 12, 1)
        self.mix = nn.Conv2d(20, 16, 3, padding=1)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.cat([torch.relu(self.left(x)), torch.relu(self.right(x))], dim=1)  # the concat
        return self.head(torch.relu(self.mix(h)).mean((2, 3)))


def _data(count: int = 64) -> TrainingData:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((count, 3, 8, 8)).astype(np.float32)
    return TrainingData.from_arrays({"x": x, "labels": (x.mean((1, 2, 3)) > 0).astype(np.int64)}, ["x"])


def _spec(exporter: str = "auto"):
    return parse_spec({"name": "tiny", "source": {"module": "m:build"}, "max_batch_size": 8, "onnx": {"exporter": exporter},
                       "inputs": [{"name": "x", "shape": [3, 8, 8]}], "outputs": [{"name": "y"}]})


def _prune(model, seed: int = 0):
    settings = CompressionSpec(prune_ratio=0.5, prune_steps=2, steps=4, seed=seed, batch_size=16)
    return prune_iteratively(model, _data(), settings, Budget(100, 600), evaluate=lambda m: 50.0, floor=0.0)


# ------------------------------------------------------------------------------------------------
# the fine-tuning budget


def test_fine_tuning_stops_at_the_step_budget():
    model, data = Concat(), _data()
    budget = Budget(steps=3, seconds=600)
    log = fine_tune(model, data, cross_entropy, budget, steps=10, lr=1e-3, seed=0, batch_size=16)
    assert (log.steps, log.stopped_by, budget.used_steps) == (3, "budget steps", 3)
    assert not model.training


def test_fine_tuning_stops_at_the_time_budget():
    ticks = iter(range(1000))  # an injected clock: one second per reading
    budget = Budget(steps=1000, seconds=5, clock=lambda: float(next(ticks)))
    lines = []
    log = fine_tune(Concat(), _data(), cross_entropy, budget, steps=1000, lr=1e-3, seed=0, batch_size=16,
                    evaluate=lambda m: 12.5, progress=lines.append, label="tiny")
    assert log.stopped_by == "budget seconds" and 0 < log.steps < 10
    assert log.accuracy == 12.5 and lines[-1] == f"    tiny: {log.steps} steps (budget seconds), accuracy 12.50%"


# ------------------------------------------------------------------------------------------------
# structured pruning through residual and concatenated branches


@pytest.mark.slow(reason="prunes a model and exports it to ONNX")
@pytest.mark.parametrize("make", [Residual, Concat], ids=["residual", "concat"])
def test_structured_pruning_keeps_branches_consistent_and_exports(make, tmp_path):
    model = make().eval()
    example = _data().inputs[0][:5]
    before, _ = count_params_macs(model, [example])
    result = _prune(model)
    pruned = result.model
    after, _ = count_params_macs(pruned, [example])
    assert result.ratio == 0.5 and [h["ratio"] for h in result.history] == [0.25, 0.5]
    assert after < 0.6 * before, (before, after)
    assert pruned.head.out_features == 4  # the task head keeps its classes
    if make is Residual:
        assert pruned.stem[0].out_channels == pruned.body[3].out_channels < 16
    else:
        assert pruned.mix.in_channels == pruned.left.out_channels + pruned.right.out_channels < 20
    with torch.no_grad():
        expected = pruned(example).numpy()
    assert expected.shape == (5, 4)
    path = tmp_path / "model.onnx"
    export_module_onnx(pruned, _spec(), path)
    got = open_runner("onnx", path, ["y"], ["x"])({"x": example.numpy()})["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_pruning_twice_with_the_same_seed_gives_the_same_model():
    first, second = _prune(Residual()).model.state_dict(), _prune(Residual()).model.state_dict()
    assert list(first) == list(second)
    for name in first:
        assert torch.equal(first[name], second[name]), name
    third = _prune(Residual(), seed=1).model.state_dict()
    assert any(not torch.equal(first[n], third[n]) for n in first if first[n].is_floating_point())


# ------------------------------------------------------------------------------------------------
# the spec


def test_compression_spec_keys_and_errors(tmp_path):
    base = {"name": "m", "source": {"module": "m:build"}, "inputs": [{"name": "x", "shape": [2]}],
            "outputs": [{"name": "y"}], "max_batch_size": 4}
    spec = parse_spec(dict(base, data={"training": "data:batches"}, compression={"prune_ratio": 0.3, "alpha": 0,
                                                                                  "student": "small:build"}))
    assert spec.data.training == "data:batches"
    assert (spec.compression.prune_ratio, spec.compression.alpha, spec.compression.student) == (0.3, 0.0, "small:build")
    assert spec.compression.steps == 300 and spec.compression.seconds == 60.0
    with pytest.raises(UserInputError, match=r"field 'compression.prune_ratio': must be a finite number in \(0, 1\)"):
        parse_spec(dict(base, compression={"prune_ratio": 1.0}))
    with pytest.raises(UserInputError, match=r"field 'compression.alpha': must be a finite number in \[0, 1\]"):
        parse_spec(dict(base, compression={"alpha": 1.5}))
    with pytest.raises(UserInputError, match=r"'compression.student': 'nope' is not 'python.module:callable'"):
        parse_spec(dict(base, compression={"student": "nope"}))
    with pytest.raises(UserInputError, match=r"field 'data.training': file not found"):
        parse_spec(dict(base, data={"training": "missing.npz"}), tmp_path / "spec.yaml")


# ------------------------------------------------------------------------------------------------
# builds on digits


def _digits(tmp_path, **changes):
    folder = tmp_path / "digits"
    shutil.copytree(EXAMPLES / "digits", folder, ignore=shutil.ignore_patterns("__pycache__"))
    data = yaml.safe_load((folder / "spec.yaml").read_text())
    for key, value in changes.items():
        if value is None:
            data["data"].pop(key, None)
        else:
            data[key] = value
    (folder / "spec.yaml").write_text(yaml.safe_dump(data))
    return folder / "spec.yaml"


SMALL = {"prune_ratio": 0.5, "prune_steps": 2, "steps": 80, "seconds": 60}


@pytest.mark.slow(reason="builds digits")
def test_without_training_data_the_variants_are_skipped_naming_data_training(tmp_path, quiet):
    spec = _digits(tmp_path, training=None)
    result = build(spec, tmp_path / "repo", variants=["onnx", "onnx_pruned", "onnx_qat_int8"], benchmark_seconds=0,
                   progress=quiet)
    stage = next(r for r in result.results if r.stage == "compress")
    assert stage.status is Status.SKIPPED
    assert stage.reason.startswith("onnx_pruned, onnx_qat_int8: needs labelled training data: set data.training")
    assert [v.name for v in result.context.variants] == ["onnx"]
    assert "onnx_pruned: skipped: needs labelled training data: set data.training" in " ".join(result.context.notes)


@pytest.fixture(scope="module")
def pruned_build(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compress")
    spec = _digits(tmp, compression=SMALL)
    return build(spec, tmp / "repo", variants=["onnx", "onnx_pruned"], benchmark_seconds=0,
                 publish_variants=True, progress=None)


def test_pruned_variant_is_verified_by_task_accuracy_and_publishes_its_own_outputs(pruned_build):
    ctx = pruned_build.context
    pruned, plain = ctx.variant("onnx_pruned"), ctx.variant("onnx")
    assert pruned.verified and pruned.verified_by == "task_accuracy" and plain.verified_by == "reference"
    assert pruned.accuracy["drop"] <= 1.0
    assert pruned.stats["params"] < plain.stats["params"] and plain.stats["of"] == "the user's model"
    history = pruned.compression["history"]
    # the largest ratio that kept the accuracy floor is the one exported
    assert pruned.compression["ratio"] == max(h["ratio"] for h in history if h["kept"]) and history[0]["ratio"] == 0.25
    # it differs from the reference (no closeness gate), so its published reference.npz holds its own outputs
    assert pruned.verification["metrics"]["logits"]["rel_l2"] > 1e-3
    folder = pruned.published_as
    published = next(p for p in pruned_build.published if p["name"] == folder)
    folder = Path(published["path"])
    meta = read_metadata(folder / "metadata.yaml")
    assert meta["verified_by"] == "task_accuracy" and meta["compression"]["ratio"] == pruned.compression["ratio"]
    cases, outputs = read_reference(folder / "reference.npz")
    run = open_runner("onnx", folder / meta["artifact"]["file"], ["logits"], ["image"])
    for case, stored in zip(cases, outputs):
        np.testing.assert_allclose(run(case["inputs"])["logits"], stored["logits"], rtol=1e-6)
    # the drift profile describes what this variant serves: its own outputs on the validation set
    import json

    from builder.monitoring.drift_profile import build_profile
    score = "output:logits:score"
    published = json.loads((folder / "drift_profile.json").read_text())["features"][score]["mean"]
    own = build_profile(ctx.reference.validation_inputs, pruned.own_validation_outputs)["features"][score]["mean"]
    theirs = build_profile(ctx.reference.validation_inputs, ctx.reference.validation_outputs)["features"][score]["mean"]
    assert published == pytest.approx(own, rel=1e-6) and published != pytest.approx(theirs, rel=1e-6)
    report = (folder / "build_report.md").read_text()
    assert "verified by task accuracy" in report and "## Compression" in report


@pytest.mark.slow(reason="builds compressed variants")
def test_a_compressed_variant_outside_the_accuracy_budget_is_rejected(tmp_path, quiet):
    # a budget nothing can meet: 90 % of the channels gone, one tiny step, no accuracy drop allowed
    spec = _digits(tmp_path, compression={"prune_ratio": 0.9, "prune_steps": 1, "steps": 1, "learning_rate": 1e-9},
                   verify={"max_accuracy_drop": 0.0})
    result = build(spec, tmp_path / "repo", variants=["onnx", "onnx_pruned"], benchmark_seconds=0, progress=quiet)
    pruned = result.context.variant("onnx_pruned")
    assert pruned.verified is False and not pruned.eligible
    assert "no ratio kept accuracy" in " ".join(pruned.notes)
    assert pruned.rejected.startswith("failed verification:\n- logits: top-1 accuracy")
    assert "> 0.0 allowed" in pruned.rejected
    assert result.context.selected.name == "onnx"


# ------------------------------------------------------------------------------------------------
# quantisation-aware training: both exports of the trained model run and agree with torch


@pytest.mark.slow(reason="fine-tunes a QAT model and exports it to ONNX")
def test_qat_model_exports_as_qdq_both_ways(tmp_path):
    from builder.compression import qat
    import onnx

    data = _data()
    model, notes = qat.prepare_qat(Residual().eval(), data, batch_size=16)
    assert notes[0] == "BatchNorm folded into the convs (torch.fx fuse)" and notes[1].startswith("4 Conv/Linear")
    fine_tune(model, data, cross_entropy, Budget(3, 600), steps=3, lr=1e-4, seed=0, batch_size=16)
    qat.freeze(model)
    x = data.inputs[0][:8]
    with torch.no_grad():
        fake_quant = model(x).numpy()
    # the fake-quant ops exported as they are, weights folded to INT8 initializers
    direct = tmp_path / "direct.onnx"
    export_module_onnx(model, _spec("legacy"), direct)  # (the dynamo exporter refuses the fake-quant ops)
    assert qat.fold_weight_quantizers(direct) == 4
    graph = onnx.load(str(direct)).graph
    assert sum(n.op_type == "QuantizeLinear" for n in graph.node) >= 4
    assert {i.data_type for i in graph.initializer} >= {onnx.TensorProto.INT8}
    got = open_runner("onnx", direct, ["y"], ["x"])({"x": x.numpy()})["y"]
    np.testing.assert_allclose(got, fake_quant, atol=0.05)
    # onnxruntime's conversion of the trained float weights (what onnx_qat_int8 ships)
    qat.to_float(model)
    plain = tmp_path / "float.onnx"
    export_module_onnx(model, _spec(), plain)
    converted = tmp_path / "int8.onnx"
    how = qat.quantize_with_onnxruntime(plain, converted, [{"x": data.inputs[0][i:i + 16].numpy()} for i in (0, 16)])
    assert how.startswith("onnxruntime quantize_static(QDQ, per_channel=True") and "2 training batch(es)" in how
    assert "DequantizeLinear" in {n.op_type for n in onnx.load(str(converted)).graph.node}
    got = open_runner("onnx", converted, ["y"], ["x"])({"x": x.numpy()})["y"]
    assert got.shape == (8, 4) and np.abs(got - fake_quant).max() < 0.25 * np.abs(fake_quant).max() + 0.05


def test_report_pareto_front_and_qat_comparison():
    from builder.report.compression import compression_lines, pareto_front

    assert pareto_front([("onnx", 1.0, 0.0), ("pruned", 1.9, 0.0), ("int8", 2.5, 0.4), ("slow", 0.8, 0.5)]) == \
        ["pruned", "int8"]
    row = {"size MB": 0.04, "p50 ms (b=1)": 0.02, "eligible": True, "acc drop": 0.0, "x onnx": 1.0,
           "verified_by": "reference", "params": 100, "flops": 400, "accuracy": 99.0, "throughput": 1000.0}
    rows = [dict(row, variant="onnx_int8_static"), dict(row, variant="onnx_qat_int8", verified_by="task_accuracy",
                                                        accuracy=99.5, throughput=900.0, **{"x onnx": 0.9})]
    text = "\n".join(compression_lines(rows))
    assert "| onnx_qat_int8 | verified by task accuracy | 100 | 0.000 |" in text
    assert ("onnx_qat_int8 (quantisation-aware) vs onnx_int8_static (post-training): top-1 99.50% vs 99.00%, "
            "best throughput 900 vs 1000 inf/s") in text
    assert "build onnx_int8_static too" in "\n".join(compression_lines(rows[1:]))


def test_select_on_another_host_checks_each_variant_against_its_own_reference(pruned_build, tmp_path):
    # `select` replays every published variant: the pruned one against its own outputs, and when it wins,
    # the new version of digits_cnn carries them (so check keeps passing)
    from builder.repository.reselect import select_for_host
    from tests.unit.test_select import HERE, _measure

    repo = tmp_path / "repo"
    shutil.copytree(pruned_build.context.options.repository, repo)
    report = select_for_host(repo, "digits_cnn", measure=_measure("digits_cnn__onnx_pruned"), current_host=HERE)
    assert [c.excluded for c in report.candidates] == ["", ""]
    assert report.winner.variant == "onnx_pruned" and report.published["version"] == 2
    _, new = read_reference(repo / "digits_cnn" / "2" / "reference.npz")
    _, own = read_reference(repo / "digits_cnn__onnx_pruned" / "1" / "reference.npz")
    np.testing.assert_array_equal(new[0]["logits"], own[0]["logits"])


# ------------------------------------------------------------------------------------------------
# distillation into a named student with feature matching; training data from a callable


STUDENT = '''
import torch
class Small(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1); self.head = torch.nn.Linear(6, 4)
    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))
def build():
    return Small()
def batches():
    import numpy as np
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.standard_normal((8, 3, 8, 8)).astype("float32")
        yield {"x": x, "labels": (x.mean((1, 2, 3)) > 0).astype("int64")}
'''


def test_distillation_into_a_named_student_with_feature_matching(tmp_path):
    from types import SimpleNamespace

    from builder.compression.distill import distill, import_student
    from builder.stages.compress import load_training

    (tmp_path / "student.py").write_text(STUDENT)
    student = import_student("student:build", tmp_path)
    assert type(student).__name__ == "Small"
    with pytest.raises(UserInputError, match=r"compression.student: 'student' has no callable 'nope'"):
        import_student("student:nope", tmp_path)
    spec = parse_spec({"name": "tiny", "source": {"module": "m:build"}, "max_batch_size": 8,
                       "inputs": [{"name": "x", "shape": [3, 8, 8]}], "outputs": [{"name": "y"}],
                       "data": {"training": "student:batches"}}, tmp_path / "spec.yaml")
    arrays = load_training(SimpleNamespace(spec=spec))  # the callable's batches, concatenated
    assert arrays["x"].shape == (24, 3, 8, 8) and arrays["labels"].dtype == np.int64
    teacher, before = Concat().eval(), copy.deepcopy(student.state_dict())
    settings = CompressionSpec(steps=4, batch_size=8, feature_matching=True, temperature=2.0, alpha=0.5)
    lines = []
    log = distill(teacher, student, TrainingData.from_arrays(arrays, ["x"]), settings, Budget(4, 600),
                  evaluate=lambda m: 75.0, progress=lines.append)
    assert (log.steps, log.stopped_by, log.accuracy) == (4, "steps", 75.0)
    assert any(not torch.equal(before[k], v) for k, v in student.state_dict().items())
    assert all(p.requires_grad for p in teacher.parameters())  # the teacher is handed back as it came
    assert lines[-1] == "    onnx_distilled: 4 steps (steps), accuracy 75.00%"


def test_training_data_errors_name_data_training(tmp_path):
    from types import SimpleNamespace

    from builder.stages.compress import load_training

    np.savez(tmp_path / "nolabels.npz", x=np.zeros((4, 3, 8, 8), np.float32))
    np.savez(tmp_path / "short.npz", x=np.zeros((4, 3, 8, 8), np.float32), labels=np.zeros(3, np.int64))
    np.savez(tmp_path / "floats.npz", x=np.zeros((4, 3, 8, 8), np.float32), labels=np.zeros(4, np.float32))
    base = {"name": "tiny", "source": {"module": "m:build"}, "max_batch_size": 8,
            "inputs": [{"name": "x", "shape": [3, 8, 8]}], "outputs": [{"name": "y"}]}
    cases = {"nolabels.npz": r"data.training: nolabels.npz has no array 'labels' \(it has: x\)",
             "short.npz": r"data.training: short.npz: the inputs and labels have different sample counts \[3, 4\]",
             "floats.npz": r"data.training: floats.npz\['labels'\] is float32; give integer class ids"}
    for name, message in cases.items():
        spec = parse_spec(dict(base, data={"training": name}), tmp_path / "spec.yaml")
        with pytest.raises(UserInputError, match=message):
            load_training(SimpleNamespace(spec=spec))


def test_every_reason_to_skip_names_what_to_set():
    from types import SimpleNamespace

    from builder.stages.compress import why_not

    base = {"name": "tiny", "source": {"module": "m:build"}, "max_batch_size": 8, "data": {"training": "d:f"},
            "inputs": [{"name": "x", "shape": [3, 8, 8]}], "outputs": [{"name": "y"}]}
    labelled = SimpleNamespace(labels=np.zeros(4, np.int64))

    def reason(model=Concat(), reference=labelled, **changes):
        return why_not(SimpleNamespace(spec=parse_spec(dict(base, **changes)), model=model, reference=reference))

    assert reason() == ""
    assert reason(data={}).startswith("needs labelled training data: set data.training")
    assert reason(model=object()) == "needs a trainable PyTorch model (source.module); the source is module"
    assert reason(max_batch_size=0).startswith("needs a batch dimension (max_batch_size > 0)")
    assert reason(reference=SimpleNamespace(labels=None)).endswith("data.validation with a 'labels' array")
