"""A model folder's versions share ONE config.pbtxt (builder/repository/interface.py): a new version
whose interface differs is refused where the version_policy also serves older versions (all), published
with a warning under latest, published silently when unchanged; `validate` fails a version the model's
config.pbtxt no longer describes. Repository states are built with stage publish on tiny fake models."""

from __future__ import annotations

import re

import numpy as np
import pytest
import yaml

from builder.core.errors import UserInputError
from builder.repository.layout import existing_versions
from builder.repository.validate import validate_model
from builder.spec.model import parse_spec
from builder.stages import publish as publish_stage
from builder.stages.base import BuildContext, BuildOptions, Reference, Variant


def _context(tmp_path, repo, width=16, policy="latest", publish_variants=False, progress=None, selected="onnx",
             target="cpu"):
    """What stage publish reads after select: a spec (x: [width] -> y: [4]), its reference, a fake ONNX file."""
    spec = parse_spec({"name": "m", "source": {"module": "model:build"},
                       "inputs": [{"name": "x", "dtype": "float32", "shape": [width]}],
                       "outputs": [{"name": "y"}], "max_batch_size": 8,
                       "deploy": {"target": target, "version_policy": policy, "publish_variants": publish_variants}})
    work = tmp_path / f"work{width}{policy}"
    work.mkdir(exist_ok=True)
    x = np.zeros((1, width), np.float32)
    y = np.arange(4, dtype=np.float32)[None]
    reference = Reference(cases=[{"id": "b1", "inputs": {"x": x}}], outputs=[{"y": y}],
                          output_dtypes={"y": "float32"}, output_shapes={"y": [4]})
    ctx = BuildContext(spec=spec, options=BuildOptions(repository=repo), workdir=work,
                       progress=progress or (lambda message: None), reference=reference, reference_kind="fake")
    for name, fmt, file in (("onnx", "onnx", "model.onnx"), ("torchscript", "torchscript", "model.pt")):
        (work / file).write_bytes(b"not a real model")
        variant = ctx.add_variant(Variant(name, fmt, "fp32", work / file, verified=True,
                                          verification={"tolerance": {"rel_l2": 1e-5}}))
        variant.selected = name == selected
    ctx.selected = ctx.variant(selected)
    return ctx


def _publish(tmp_path, repo, **kwargs):
    ctx = _context(tmp_path, repo, **kwargs)
    result = publish_stage.run(ctx)
    assert result.status.value == "OK", result.reason
    return ctx, result


def _config_text(repo, name="m"):
    return (repo / name / "config.pbtxt").read_text()


def test_changed_interface_is_refused_when_version_policy_all_serves_the_older_versions(tmp_path):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, width=16, policy="all")
    before = _config_text(repo)
    with pytest.raises(UserInputError, match=r"model 'm': the config\.pbtxt this build publishes describes another "
                                             r"interface than version 1 of .* was built for \(version 1: input 'x' "
                                             r"dims \[16\] -> \[32\]\).*deploy\.version_policy all serves those "
                                             r"too.*Nothing was published.*new model name \(spec field 'name'\).*"
                                             r"deploy\.version_policy: latest.*remove version 1 from"):
        publish_stage.run(_context(tmp_path, repo, width=32, policy="all"))
    assert existing_versions(repo / "m") == [1] and _config_text(repo) == before
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


def test_refusal_comes_before_any_model_is_written_with_publish_variants(tmp_path):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, width=16, policy="all", publish_variants=True)
    assert existing_versions(repo / "m") == [1] and existing_versions(repo / "m__torchscript") == [1]
    with pytest.raises(UserInputError, match=r"model 'm': .*input 'x' dims \[16\] -> \[32\]"):
        publish_stage.run(_context(tmp_path, repo, width=32, policy="all", publish_variants=True))
    assert existing_versions(repo / "m") == [1] and existing_versions(repo / "m__torchscript") == [1]


def test_changed_interface_under_latest_publishes_with_a_warning(tmp_path):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, width=16)
    said: list[str] = []
    ctx, result = _publish(tmp_path, repo, width=32, progress=said.append)
    assert existing_versions(repo / "m") == [1, 2] and "dims: [ 32 ]" in _config_text(repo)
    warning = result.outputs["warnings"][0]
    expected = (r"model 'm' version 2 changes the interface \(input 'x' dims \[16\] -> \[32\]\): .*version 1 keeps "
                r"an interface it no longer describes.*rolling back by deleting version 2 will not serve version 1\. "
                r"To roll back, build the previous spec again")
    assert re.search(expected, warning), warning
    assert f"warning: {warning}" in said and f"warning: {warning}" in ctx.notes
    meta = yaml.safe_load((repo / "m" / "2" / "metadata.yaml").read_text())
    assert f"warning: {warning}" in meta["notes"]  # and in build_report.md's notes
    assert warning in (repo / "m" / "2" / "build_report.md").read_text()


def test_unchanged_interface_publishes_silently(tmp_path):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, width=16, policy="all")
    said: list[str] = []
    ctx, result = _publish(tmp_path, repo, width=16, policy="all", progress=said.append)
    assert existing_versions(repo / "m") == [1, 2]
    assert "warnings" not in result.outputs and not [m for m in said if "warning" in m] and not ctx.notes


def test_switching_to_latest_is_the_fix_and_going_back_to_all_is_refused(tmp_path):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, width=16, policy="all")
    _publish(tmp_path, repo, width=32, policy="latest")  # warned, published as version 2
    # version 1 (dims [16]) would be served again by a config with dims [32]: refused, naming version 1 only
    with pytest.raises(UserInputError, match=r"than version 1 of .*\(version 1: input 'x' dims \[16\] -> \[32\]\).*"
                                             r"version_policy all serves"):
        publish_stage.run(_context(tmp_path, repo, width=32, policy="all"))


def test_a_version_for_another_backend_is_an_interface_change(tmp_path):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, policy="all")  # target cpu: ONNX on Triton's onnxruntime backend
    with pytest.raises(UserInputError, match=r"version 1: backend onnxruntime_onnx -> pytorch_libtorch"):
        publish_stage.run(_context(tmp_path, repo, policy="all", selected="torchscript"))
    assert existing_versions(repo / "m") == [1]


def test_the_python_backend_serves_versions_of_different_formats_under_one_config(tmp_path):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, policy="all", target="python")  # model.onnx; model.py finds each version's file
    ctx, result = _publish(tmp_path, repo, policy="all", target="python", selected="torchscript")
    assert existing_versions(repo / "m") == [1, 2] and "warnings" not in result.outputs
    assert (repo / "m" / "1" / "model.onnx").is_file() and (repo / "m" / "2" / "model.pt").is_file()


def test_validate_fails_an_older_version_the_config_no_longer_describes(tmp_path):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, width=16)
    _publish(tmp_path, repo, width=32)
    # the fake model files are not replayable: only the interface check is looked at
    checked = validate_model(repo / "m", 1)
    failures = checked.versions[0].failures
    assert not checked.ok and failures, checked.lines()
    assert re.search(r"config\.pbtxt does not describe this version's interface \(input 'x' dims \[16\] -> \[32\]; "
                     r"metadata\.yaml's spec -> config\.pbtxt\).*build this version's spec again as a new version",
                     failures[0]), failures


def test_validate_passes_the_interface_check_of_a_matching_version(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, width=16)
    _publish(tmp_path, repo, width=32)
    from builder.repository import validate as validate_module

    # the fake files are not models: replay with a runner that returns the stored reference outputs
    monkeypatch.setattr(validate_module, "open_runner",
                        lambda *args, **kwargs: lambda inputs: {"y": np.arange(4, dtype=np.float32)[None]})
    monkeypatch.setattr(validate_module, "regression_vs_previous", lambda *args, **kwargs: None)
    latest = validate_model(repo / "m", 2)
    assert latest.ok, latest.lines()
    older = validate_model(repo / "m", 1)
    assert not older.ok and len(older.versions[0].failures) == 1


def test_publish_model_itself_refuses_for_every_caller(tmp_path):
    # select and tune --publish reach publish_model without stage publish's check
    from builder.repository.publish import config_for, publish_model
    from builder.repository.description import VersionDescription

    repo = tmp_path / "repo"
    _publish(tmp_path, repo, width=16, policy="all")
    spec = _context(tmp_path, repo, width=16, policy="all").spec
    config = config_for(spec, "onnx", "cpu", "m", {"y": ("float32", [4])})
    config.max_batch_size = 4
    (tmp_path / "model.onnx").write_bytes(b"x")
    with pytest.raises(UserInputError, match=r"\(version 1: max_batch_size 8 -> 4\).*Nothing was published"):
        publish_model(repo, VersionDescription(name="m", config=config, model_format="onnx",
                                               model_files=[tmp_path / "model.onnx"], metadata={}))
    assert existing_versions(repo / "m") == [1]


def test_interface_changes_name_each_field():
    from builder.repository.interface import interface_changes

    old = {"max_batch_size": 8, "input": [("a", "TYPE_FP32", [1], []), ("b", "TYPE_INT64", [-1], None)],
           "output": [("y", "TYPE_FP32", [4], None)]}
    new = {"max_batch_size": 0, "input": [("b", "TYPE_INT32", [-1], None), ("a", "TYPE_FP32", [1], None)],
           "output": [("z", "TYPE_FP32", [4], None)]}
    assert interface_changes(old, new) == [
        "max_batch_size 8 -> 0", "input 'a' reshape [] -> none", "input 'b' data_type TYPE_INT64 -> TYPE_INT32",
        "input order ['a', 'b'] -> ['b', 'a']", "output 'y' removed", "output 'z' added"]
    assert interface_changes(old, old) == []


def test_a_build_is_refused_at_load_before_export_and_verification(tmp_path):
    from builder.pipeline import build
    from tests.tiny_models import write_model

    repo = tmp_path / "repo"
    build(write_model(tmp_path, "dotted", variants=["onnx"], deploy={"version_policy": "all"}), repo,
          benchmark_seconds=0, progress=lambda m: None)
    said: list[str] = []
    spec = write_model(tmp_path, "dotted", variants=["onnx"], deploy={"version_policy": "all"},
                       outputs=[{"name": "scores"}])
    with pytest.raises(UserInputError, match=r"version 1: output 'logits:0' removed, output 'scores' added"):
        build(spec, repo, benchmark_seconds=0, progress=said.append)
    assert not [line for line in said if "export_onnx" in line], said
    assert existing_versions(repo / "dotted") == [1]
