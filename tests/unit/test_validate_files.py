"""validate's file coverage: every published file of a version (reference.npz, drift_profile.json and
the reports too) is in metadata.yaml's files_sha256; a changed one fails, a file nobody published is
a warning, and a version published before those were hashed still validates (with a note)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from builder.repository.validate import validate_model


@pytest.fixture
def digits(built_repository, tmp_path):
    target = tmp_path / "repo" / "digits_cnn"
    shutil.copytree(built_repository / "digits_cnn", target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _meta(folder):
    return yaml.safe_load((folder / "1" / "metadata.yaml").read_text())


def test_every_published_file_is_hashed(digits):
    hashed = set(_meta(digits)["files_sha256"])
    published = {p.name for p in (digits / "1").iterdir() if p.is_file()} - {"metadata.yaml"}
    assert {"reference.npz", "drift_profile.json", "build_report.md", "model.onnx"} <= hashed
    assert hashed == published
    report = validate_model(digits)
    assert report.ok and report.versions[0].notes == [], report.lines()


@pytest.mark.parametrize("name", ["drift_profile.json", "build_report.md"])
def test_a_changed_extra_file_fails(digits, name):
    with open(digits / "1" / name, "ab") as f:
        f.write(b" ")
    report = validate_model(digits)
    assert not report.ok
    assert f"{name}: sha256 differs from metadata.yaml (file changed after the build)" in report.versions[0].failures


def test_a_file_nobody_published_is_a_warning_naming_it(digits):
    (digits / "1" / "extra.onnx").write_bytes(b"not ours")
    report = validate_model(digits)
    assert report.ok  # a warning: the published files are all intact
    assert any(line.startswith("  warning: extra.onnx: not published by triton-builder") for line in report.lines())


def test_a_version_published_before_extras_were_hashed_still_validates(digits):
    meta = _meta(digits)
    for name in ("reference.npz", "drift_profile.json", "build_report.md", "build_report.json"):
        meta["files_sha256"].pop(name, None)
    (digits / "1" / "metadata.yaml").write_text(yaml.safe_dump(meta))
    report = validate_model(digits)
    assert report.ok, report.lines()
    assert report.versions[0].notes == [
        "note: build_report.json, build_report.md, drift_profile.json, reference.npz not in metadata.yaml's "
        "files_sha256 (published before triton-builder hashed them): not checked"]
