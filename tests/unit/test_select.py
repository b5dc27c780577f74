"""`triton-builder select` (builder/repository/reselect.py): a repository built elsewhere is re-measured
here and the winner republished. Measurements and the host are injected, so the outcome does not
depend on this machine; the replay against reference.npz and the publish are real."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from builder.core.errors import UserInputError
from builder.repository.reselect import select_for_host
from tests.conftest import EXAMPLES

HERE = {"cpu_model": "AMD EPYC 7B13", "isa_flags": ["avx2"], "isa_class": "avx2", "usable_cores": 2}


@pytest.fixture(scope="module")
def variants_repository(tmp_path_factory):
    """digits built with its onnx and torchscript variants published (no benchmark)."""
    from builder.pipeline import build

    repo = tmp_path_factory.mktemp("select_repo") / "model_repository"
    build(EXAMPLES / "digits/spec.yaml", repo, variants=["onnx", "torchscript"], benchmark_seconds=0,
          publish_variants=True, progress=lambda m: None)
    return repo


def _copy(repo, tmp_path):
    target = tmp_path / "repo"
    shutil.copytree(repo, target)
    return target


def _measure(fast: str, p50_ms: float = 0.5):
    """A measure that makes variant ``fast`` (by the label's model name) the quickest."""
    def run(label, runner, inputs, threads):
        assert runner(inputs)  # really runs the candidate on the batch-1 inputs
        is_fast = fast in label
        return {"throughput": 2000.0 if is_fast else 1000.0, "p50_ms": p50_ms if is_fast else 2 * p50_ms}
    return run


def _served(repo):
    meta = yaml.safe_load((repo / "digits_cnn" / "1" / "metadata.yaml").read_text())
    return meta["artifact"]["variant"]


def test_select_publishes_the_winner_of_this_host(variants_repository, tmp_path):
    repo = _copy(variants_repository, tmp_path)
    served = _served(repo)
    other = next(p.name.split("__", 1)[1] for p in repo.iterdir() if p.name.startswith("digits_cnn__"))
    assert other != served
    report = select_for_host(repo, "digits_cnn", measure=_measure(f"digits_cnn__{other}"), current_host=HERE)
    assert report.winner.variant == other and report.published["version"] == 2
    assert report.sizing == (2, 1)  # 2 usable cores, 0.5 ms a call: overhead-bound
    meta = yaml.safe_load((repo / "digits_cnn" / "2" / "metadata.yaml").read_text())
    assert meta["model_name"] == "digits_cnn" and meta["artifact"]["variant"] == other
    assert meta["host"] == HERE and meta["serving"]["instances"] == 2
    assert meta["reselected_from"]["served_version"] == 1
    config = (repo / "digits_cnn" / "config.pbtxt").read_text()
    assert 'name: "digits_cnn"' in config and "count: 2" in config
    from builder.repository.validate import validate_model
    checked = validate_model(repo / "digits_cnn", 2, current_host=HERE)
    assert checked.ok, checked.lines()
    assert checked.host_warnings == []

    # run again on the same host: the served variant and size are already right
    again = select_for_host(repo, "digits_cnn", measure=_measure("digits_cnn/2"), current_host=HERE)  # it, served
    assert again.published is None and "nothing published" in again.why


def test_select_keeps_the_variant_and_resizes_for_a_bigger_host(variants_repository, tmp_path):
    repo = _copy(variants_repository, tmp_path)
    served = _served(repo)
    big = {**HERE, "usable_cores": 8}
    report = select_for_host(repo, "digits_cnn", measure=_measure("digits_cnn/", p50_ms=50.0), current_host=big)
    assert report.winner.variant == served
    assert report.sizing == (2, 4)  # compute-bound: fewer instances, more threads
    config = (repo / "digits_cnn" / "config.pbtxt").read_text()
    assert "count: 2" in config and 'string_value: "4"' in config


def test_dry_run_publishes_nothing_and_unknown_model_is_named(variants_repository, tmp_path):
    repo = _copy(variants_repository, tmp_path)
    report = select_for_host(repo, "digits_cnn", measure=_measure("digits_cnn__"), current_host=HERE, dry_run=True)
    assert report.published is None and "--dry-run" in report.why
    assert not (repo / "digits_cnn" / "2").exists()
    with pytest.raises(UserInputError, match=r"model 'nope' is not in .* \(its models: digits_cnn, .*\); name one "
                                             r"of them, or pass the --repository that holds 'nope'"):
        select_for_host(repo, "nope", measure=_measure("x"), current_host=HERE)


def test_a_variant_that_differs_from_the_reference_is_excluded(variants_repository, tmp_path):
    import numpy as np

    repo = _copy(variants_repository, tmp_path)

    def wrong(label, runner, inputs, threads):
        return {"throughput": 1.0, "p50_ms": 1.0}
    # break one candidate: its reference replay runs a model with scrambled weights
    other = next(p for p in repo.iterdir() if p.name.startswith("digits_cnn__"))
    meta = yaml.safe_load((other / "1" / "metadata.yaml").read_text())
    meta["verification"] = {"tolerance": {"rel_l2": -1.0}}  # nothing can pass a negative tolerance
    (other / "1" / "metadata.yaml").write_text(yaml.safe_dump(meta))
    report = select_for_host(repo, "digits_cnn", measure=wrong, current_host=HERE, dry_run=True)
    excluded = [c for c in report.candidates if c.excluded]
    assert len(excluded) == 1 and "differs from the reference" in excluded[0].excluded
    assert np.isfinite(report.winner.measured["p50_ms"])


def test_same_decision_on_a_different_host_is_recorded_so_the_warnings_stop(variants_repository, tmp_path):
    from builder.core.host import host_warnings

    repo = _copy(variants_repository, tmp_path)
    served = _served(repo)
    first = select_for_host(repo, "digits_cnn", measure=_measure("digits_cnn/"), current_host=HERE)
    meta = yaml.safe_load((repo / "digits_cnn" / "2" / "metadata.yaml").read_text())
    assert first.winner.variant == served and first.published["version"] == 2  # same variant, this host recorded
    assert host_warnings(meta, "digits_cnn", HERE) == []


def test_select_ranks_objective_tradeoff_by_the_builds_j_not_by_throughput(variants_repository, tmp_path):
    # injected: onnx has the higher throughput but the slower p50; J = alpha*acc - beta*p50 - gamma*MB prefers
    # torchscript (same build-time accuracy), throughput prefers onnx - select must follow the build's objective
    def measure(label, runner, inputs, threads):
        assert runner(inputs)
        onnx = label.startswith("digits_cnn/")
        return {"throughput": 2000.0 if onnx else 1000.0, "p50_ms": 2.0 if onnx else 0.5}

    plain = select_for_host(_copy(variants_repository, tmp_path / "a"), "digits_cnn", measure=measure,
                            current_host=HERE, dry_run=True)
    assert plain.objective == "throughput" and plain.winner.variant == "onnx"

    repo = _copy(variants_repository, tmp_path / "b")
    meta_path = repo / "digits_cnn" / "1" / "metadata.yaml"
    meta = yaml.safe_load(meta_path.read_text())
    meta["selection"].update(objective="tradeoff", weights={"alpha": 1.0, "beta": 2.0, "gamma": 0.0})
    meta_path.write_text(yaml.safe_dump(meta))
    report = select_for_host(repo, "digits_cnn", measure=measure, current_host=HERE)
    assert report.objective == "tradeoff" and report.weights == {"alpha": 1.0, "beta": 2.0, "gamma": 0.0}
    scores = {c.variant: c.measured for c in report.candidates}
    accuracy = meta["accuracy"]["variant"]
    assert scores["onnx"]["J"] == pytest.approx(accuracy - 2.0 * 2.0)
    assert scores["torchscript"]["accuracy"] == pytest.approx(accuracy)
    assert report.winner.variant == "torchscript"
    assert any(line.strip().startswith("torchscript") and ", J " in line for line in report.lines())
    published = yaml.safe_load((repo / "digits_cnn" / "2" / "metadata.yaml").read_text())
    assert published["artifact"]["variant"] == "torchscript"
    assert published["selection"]["objective"] == "tradeoff"
    assert published["selection"]["weights"] == {"alpha": 1.0, "beta": 2.0, "gamma": 0.0}


def _batching_measure(p50_ms: float, batched_per_call: float):
    """Batch 1: 1000 calls/s at ``p50_ms``; a larger batch: ``batched_per_call`` calls/s (checked to be batched)."""
    def run(label, runner, inputs, threads):
        rows = len(next(iter(inputs.values())))
        assert runner(inputs)
        if " batch " in label:
            assert rows == int(label.rsplit(" ", 1)[1]) > 1, (label, rows)
            return {"throughput": batched_per_call, "p50_ms": p50_ms * 4}
        assert rows == 1
        return {"throughput": 1000.0, "p50_ms": p50_ms}
    return run


def _config_delay(repo):
    import re

    found = re.search(r"max_queue_delay_microseconds: (\d+)", (repo / "digits_cnn" / "config.pbtxt").read_text())
    return int(found.group(1)) if found else 0


@pytest.mark.parametrize("p50_ms, batched_per_call, delay", [
    (2.0, 1000.0 / 32 * 4, 200),  # batch 32: 4x the samples/s of batch 1, 2 ms a call: wait 0.1 of it
    (2.0, 1000.0 / 32 * 2, 0),  # batching pays only 2x here: no wait
    (0.5, 1000.0, 0),  # pays 32x, but the model's 0.5 ms is under the per-request overhead
])
def test_select_resizes_the_batching_delay_from_this_hosts_measurements(variants_repository, tmp_path, p50_ms,
                                                                         batched_per_call, delay):
    repo = _copy(variants_repository, tmp_path)
    report = select_for_host(repo, "digits_cnn", measure=_batching_measure(p50_ms, batched_per_call),
                             current_host={**HERE, "usable_cores": 8})
    assert report.delay[0] == delay and "measured on this host by triton-builder select" in report.delay[1]
    assert _config_delay(repo) == delay
    serving = yaml.safe_load((repo / "digits_cnn" / "2" / "metadata.yaml").read_text())["serving"]
    assert serving["max_queue_delay_microseconds"] == delay and serving["delay_sized"] == report.delay[1]


def test_select_keeps_a_delay_the_spec_set(variants_repository, tmp_path):
    repo = _copy(variants_repository, tmp_path)
    meta_path = repo / "digits_cnn" / "1" / "metadata.yaml"
    meta = yaml.safe_load(meta_path.read_text())
    meta["serving"].update(max_queue_delay_microseconds=700,
                           delay_sized="from the spec (deploy.max_queue_delay_microseconds)")
    meta_path.write_text(yaml.safe_dump(meta))
    config = repo / "digits_cnn" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_queue_delay_microseconds: 0", "max_queue_delay_microseconds: 700"))
    report = select_for_host(repo, "digits_cnn", measure=_batching_measure(2.0, 1000.0 / 32 * 4),
                             current_host={**HERE, "usable_cores": 8})
    assert report.delay is None and report.published["version"] == 2
    assert _config_delay(repo) == 700


def test_select_keeps_the_instances_the_spec_set(variants_repository, tmp_path):
    """deploy.instances in the spec is the user's choice: select re-measures the variants but sizes nothing."""
    repo = _copy(variants_repository, tmp_path)
    meta_path = repo / "digits_cnn" / "1" / "metadata.yaml"
    meta = yaml.safe_load(meta_path.read_text())
    meta["serving"].update(instances=3, intra_op_threads=1, sized="from the spec (deploy.instances)")
    meta_path.write_text(yaml.safe_dump(meta))
    config = repo / "digits_cnn" / "config.pbtxt"
    text = config.read_text()
    assert "count: 1" in text
    config.write_text(text.replace("count: 1", "count: 3"))
    big = {**HERE, "usable_cores": 8}  # sized here, a compute-bound model would get 2 x 4
    report = select_for_host(repo, "digits_cnn", measure=_measure("digits_cnn/", p50_ms=50.0), current_host=big)
    assert report.sizing == (3, 1) and report.size_kept == "from the spec (deploy.instances)"
    assert report.published["version"] == 2  # another host: recorded anew
    assert "instances kept: from the spec" in report.why
    assert "count: 3" in config.read_text() and 'string_value: "4"' not in config.read_text()
    serving = yaml.safe_load((repo / "digits_cnn" / "2" / "metadata.yaml").read_text())["serving"]
    assert serving["instances"] == 3 and serving["sized"] == "from the spec (deploy.instances)"
    again = select_for_host(repo, "digits_cnn", measure=_measure("digits_cnn/2", p50_ms=50.0), current_host=big)
    assert again.published is None and "nothing published" in again.why


@pytest.mark.parametrize("other_speed, published_other", [(1040.0, False), (1200.0, True)])
def test_select_publishes_the_variant_closer_to_the_reference_inside_the_noise(variants_repository, tmp_path,
                                                                                other_speed, published_other):
    """The build's tie rule on the serving host: the other variant answers 0.1 % off the reference (a
    tolerated error it really replays with); 4 % faster is noise (the served one stays), 20 % is not."""
    import builder.model.runtime
    import builder.repository.reselect

    repo = _copy(variants_repository, tmp_path)
    served = _served(repo)
    other = next(p for p in repo.iterdir() if p.name.startswith("digits_cnn__"))
    meta_path = other / "1" / "metadata.yaml"
    meta = yaml.safe_load(meta_path.read_text())
    meta["verification"] = {**(meta.get("verification") or {}), "tolerance": {"rel_l2": 1e-2}}
    meta_path.write_text(yaml.safe_dump(meta))
    real_open = builder.model.runtime.open_runner

    def open_runner(fmt, path, *args, **kwargs):
        run = real_open(fmt, path, *args, **kwargs)
        if other not in Path(path).parents:
            return run
        return lambda feeds: {k: v * 1.001 for k, v in run(feeds).items()}

    def measure(label, runner, inputs, threads):
        return {"throughput": other_speed if label.startswith(other.name) else 1000.0, "p50_ms": 1.0}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(builder.repository.reselect, "open_runner", open_runner)
        report = select_for_host(repo, "digits_cnn", measure=measure, current_host=HERE, dry_run=True)
    far = next(c for c in report.candidates if c.folder.parent == other)
    assert 5e-4 < far.rel_l2 < 2e-3
    if published_other:
        assert report.winner is far and report.tie_rule is None
    else:
        assert report.winner.variant == served and report.winner.rel_l2 < 1e-5
        assert report.tie_rule.startswith(f"within measurement noise of {far.label} (1.04x")
        assert any(report.tie_rule in line for line in report.lines())


@pytest.mark.parametrize("readings, switched", [
    ([2000.0, 1000.0, 1020.0, 1010.0, 1030.0], False),  # one lucky reading: back to back it is noise
    ([2000.0, 1000.0, 1900.0, 1000.0, 1950.0], True),   # it stays ahead: the change stands
])
def test_a_change_of_variant_must_hold_when_measured_again_back_to_back(variants_repository, tmp_path, readings,
                                                                        switched):
    repo = _copy(variants_repository, tmp_path)
    served = _served(repo)
    other = next(p.name for p in repo.iterdir() if p.name.startswith("digits_cnn__"))
    challenger = readings[:1] + readings[2::2]  # its first reading, then its confirm readings
    incumbent = readings[1:2] + readings[1::2]

    def measure(label, runner, inputs, threads):  # later calls (sizing the batching delay) repeat the last
        queue = challenger if label.startswith(other) else incumbent
        return {"throughput": queue.pop(0) if len(queue) > 1 else queue[0], "p50_ms": 1.0}

    report = select_for_host(repo, "digits_cnn", measure=measure, current_host=HERE, dry_run=True)
    if switched:
        assert report.winner.variant != served and report.tie_rule is None
    else:
        assert report.winner.variant == served
        assert report.tie_rule.startswith(f"kept: {other.split('__', 1)[1]} read only 1.0")
        assert "a change needs more than 1.10x" in report.tie_rule
