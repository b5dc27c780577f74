"""Atomic publish, version numbering, metadata, and the `validate` regression check."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest
import yaml

from builder.core.errors import UserInputError
from builder.repository.config import parse_config
from builder.repository.layout import existing_versions, model_dir, publish_version
from builder.repository.metadata import read_reference
from builder.repository.validate import validate_model
from tests.conftest import run_cli


def test_publish_numbers_versions_and_leaves_others_alone(tmp_path):
    repo = tmp_path / "repo"
    for _ in range(2):
        with publish_version(repo, "m") as draft:
            (draft.folder / "model.onnx").write_text("x")
            draft.config_text = 'name: "m"\n'
    assert existing_versions(repo / "m") == [1, 2]
    with publish_version(repo, "other") as draft:
        (draft.folder / "f").write_text("y")
        draft.config_text = 'name: "other"\n'
    assert (repo / "m" / "1" / "model.onnx").read_text() == "x"
    assert existing_versions(repo / "other") == [1]


def test_failed_publish_leaves_nothing(tmp_path):
    repo = tmp_path / "repo"
    with pytest.raises(RuntimeError, match="boom"):
        with publish_version(repo, "m") as draft:
            (draft.folder / "model.onnx").write_text("half")
            raise RuntimeError("boom")
    assert not (repo / "m").exists()
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


def test_failed_publish_of_new_version_keeps_existing_ones(tmp_path):
    repo = tmp_path / "repo"
    with publish_version(repo, "m") as draft:
        (draft.folder / "a").write_text("v1")
        draft.config_text = 'name: "m"\n'
    with pytest.raises(RuntimeError):
        with publish_version(repo, "m") as draft:
            raise RuntimeError("boom")
    assert existing_versions(repo / "m") == [1] and (repo / "m" / "config.pbtxt").read_text() == 'name: "m"\n'


@pytest.mark.parametrize("name", ["..", "../evil", "a/b", ".hidden"])
def test_model_dir_refuses_traversal(tmp_path, name):
    with pytest.raises(UserInputError):
        model_dir(tmp_path, name)


def test_published_version_holds_the_artifact_record(built_repository):
    folder = built_repository / "digits_cnn" / "1"
    names = {p.name for p in folder.iterdir()}
    assert {"model.onnx", "metadata.yaml", "reference.npz", "drift_profile.json", "build_report.md",
            "build_report.json"} <= names and "model.py" not in names  # the default: a standard folder
    meta = yaml.safe_load((folder / "metadata.yaml").read_text())
    assert meta["model_name"] == "digits_cnn" and meta["version"] == 1
    assert meta["artifact"]["exporter"] == "dynamo" and meta["artifact"]["opset"] >= 18
    assert meta["artifact"]["backend"] == "onnxruntime_onnx"
    assert set(meta["versions"]) >= {"torch", "onnx", "onnxruntime", "openvino", "python"}
    assert len(meta["files_sha256"]["model.onnx"]) == 64
    assert meta["source"]["sha256"]["weights.safetensors"]
    assert meta["verification"]["metrics"]["logits"]["rel_l2"] < 1e-5
    assert meta["accuracy"]["reference"] > 90 and abs(meta["accuracy"]["drop"]) <= 1
    cases, outputs = read_reference(folder / "reference.npz")
    assert [c["inputs"]["image"].shape[0] for c in cases] == [1, 3, 64]
    assert outputs[0]["logits"].shape == (1, 10)
    config = parse_config((built_repository / "digits_cnn" / "config.pbtxt").read_text())
    assert config.platform == "onnxruntime_onnx" and config.max_batch_size == 64


def test_bert_reference_covers_dynamic_sizes(built_repository):
    cases, _ = read_reference(built_repository / "bert_tiny" / "1" / "reference.npz")
    lengths = {c["inputs"]["input_ids"].shape[1] for c in cases}
    batches = {c["inputs"]["input_ids"].shape[0] for c in cases}
    assert len(lengths) >= 3 and {1, 16, 64} <= lengths
    assert {1, 3, 16} <= batches
    config = parse_config((built_repository / "bert_tiny" / "config.pbtxt").read_text())
    assert list(config.input[0].dims) == [-1]
    # warmed up with the first reference case's first sample (its own length, a concrete dim), not zeros
    warm = config.model_warmup[0].inputs["input_ids"]
    first = cases[0]["inputs"]["input_ids"][0]
    assert not warm.zero_data and list(warm.dims) == [len(first)]
    data = (built_repository / "bert_tiny" / "warmup" / warm.input_data_file).read_bytes()
    assert np.array_equal(np.frombuffer(data, dtype=np.int64), first)


def test_validate_passes_on_a_fresh_build(built_repository):
    report = validate_model(built_repository / "bert_tiny")
    assert report.ok, report.lines()
    assert report.versions[0].metrics["embedding"]["rel_l2"] < 1e-5


def test_validate_catches_a_changed_file_and_exits_1(built_repository, tmp_path):
    copy = tmp_path / "digits_cnn"
    shutil.copytree(built_repository / "digits_cnn", copy)
    with open(copy / "1" / "model.onnx", "ab") as handle:
        handle.write(b"\0")
    proc = run_cli("validate", str(copy))
    assert proc.returncode == 1
    assert "model.onnx: sha256 differs from metadata.yaml" in proc.stdout


def test_validate_catches_drifted_reference_outputs(built_repository, tmp_path):
    copy = tmp_path / "digits_cnn"
    shutil.copytree(built_repository / "digits_cnn", copy)
    path = copy / "1" / "reference.npz"
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files}
    for key in arrays:
        if key.startswith("output/"):
            arrays[key] = arrays[key] + 0.5
    np.savez_compressed(path, **arrays)
    report = validate_model(copy)  # reference.npz is in files_sha256: the change itself is caught first
    assert report.versions[0].failures == ["reference.npz: sha256 differs from metadata.yaml (file changed after "
                                           "the build)"]
    meta = yaml.safe_load((copy / "1" / "metadata.yaml").read_text())  # metadata rewritten along with it
    meta["files_sha256"]["reference.npz"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (copy / "1" / "metadata.yaml").write_text(yaml.safe_dump(meta))
    report = validate_model(copy)
    assert not report.ok
    assert any("logits: rel L2" in f for f in report.versions[0].failures)


def test_validate_missing_folder_exits_2(tmp_path):
    proc = run_cli("validate", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "no such model folder" in proc.stderr


def test_published_files_are_readable_by_the_serving_user(tmp_path):
    # Triton often runs as another uid than the builder (a container's triton-server user)
    import os
    import stat

    (tmp_path / "mine").mkdir(mode=0o700)  # the user's own folder keeps its mode
    repo = tmp_path / "mine" / "srv" / "models" / "repo"
    previous = os.umask(0o077)  # a builder whose own files are private
    try:
        with publish_version(repo, "m") as draft:
            (draft.folder / "model.onnx").write_text("x")
            (draft.folder / "sub").mkdir()
            (draft.folder / "sub" / "data").write_text("y")
            draft.config_text = 'name: "m"\n'
    finally:
        os.umask(previous)
    # the root and the parents the build created: 0755, or the serving user cannot reach the 0644 files
    for folder in (repo, repo.parent, repo.parent.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, f"{folder}: {stat.filemode(folder.stat().st_mode)}"
    assert stat.S_IMODE((tmp_path / "mine").stat().st_mode) == 0o700
    for path in [repo / "m", *(repo / "m").rglob("*")]:
        mode = path.stat().st_mode
        if "__pycache__" in path.parts:
            continue
        assert mode & stat.S_IROTH, f"{path} is not readable by others ({stat.filemode(mode)})"
        if path.is_dir():
            assert mode & stat.S_IXOTH, f"{path} cannot be entered by others ({stat.filemode(mode)})"
