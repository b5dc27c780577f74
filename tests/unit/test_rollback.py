"""`rollback` (builder/repository/rollback.py, builder/storage/s3_rollback.py): an earlier verified version served
again by one atomic config.pbtxt change, recorded in rollout.yaml, signed where the model is signed, refused where
the version fails validate; local, monitored and s3://. Served for real in tests/integration/test_rollouts.py."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

import builder
from builder.core.errors import UserInputError, VerificationError
from builder.repository.config import parse_config
from builder.repository.signing import RECORD_FILE, RECORD_SIGNATURE
from tests.conftest import ec_key_pair
from tests.tiny_models import write_model


def _policy(folder: Path) -> tuple[str, list[int]]:
    config = parse_config((folder / "config.pbtxt").read_text())
    which = config.version_policy.WhichOneof("policy_choice")
    return which, list(config.version_policy.specific.versions) if which == "specific" else []


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """embed built three times (versions 1, 2, 3), unsigned; and twice signed, in another repository."""
    from builder.pipeline import build

    root = tmp_path_factory.mktemp("rollback")
    spec = write_model(root, "embed", variants=["onnx"])
    for _ in range(3):
        build(spec, root / "plain", benchmark_seconds=0, progress=lambda m: None)
    private, public = ec_key_pair(root)
    for _ in range(2):
        build(spec, root / "signed", benchmark_seconds=0, progress=lambda m: None, signing_key=private)
    return root, private, public


@pytest.fixture
def repo(built, tmp_path):
    shutil.copytree(built[0] / "plain", tmp_path / "repo")
    return tmp_path / "repo"


def test_rollback_serves_the_version_before_the_served_one_and_records_when(repo):
    report = builder.rollback("embed", repo)
    assert (report.from_version, report.to_version) == (3, 2)
    assert _policy(repo / "embed") == ("specific", [2])
    record = yaml.safe_load((repo / "embed" / RECORD_FILE).read_text())
    assert record["served_version"] == 2 and record["replaced_policy"] == "latest { num_versions: 1 }"
    assert [e["version"] for e in report.history][-1] == 2 and "rollback from version 3" in report.history[-1]["event"]
    assert builder.rollback("embed", repo).to_version == 1  # again: the one before the one now served
    assert builder.rollback("embed", repo, to=3).to_version == 3  # forward again
    record = yaml.safe_load((repo / "embed" / RECORD_FILE).read_text())
    assert [h["version"] for h in record["history"]] == [2, 1, 3]
    assert record["replaced_policy"] == "latest { num_versions: 1 }"  # the model's own, not a rollback's
    assert builder.validate("embed", repo).ok


@pytest.mark.parametrize("to, message", [  # the API names its parameter (to), the CLI its flag (--to)
    (7, "to 7: model 'embed' has no version 7 in "),
    (3, "to 3: version 3 of 'embed' is already the served one"),
])
def test_a_version_that_is_not_there_or_already_served_is_refused(repo, to, message):
    with pytest.raises(UserInputError, match="^" + re.escape(message)):
        builder.rollback("embed", repo, to=to)
    assert _policy(repo / "embed")[0] != "specific" and not (repo / "embed" / RECORD_FILE).exists()


def test_no_version_before_the_served_one_is_said(repo):
    builder.rollback("embed", repo, to=1)
    with pytest.raises(UserInputError, match=r"model 'embed' has no version before the served version 1 .*name one with (--)?to N"):
        builder.rollback("embed", repo)


def test_an_unknown_model_names_those_there(repo):
    with pytest.raises(UserInputError, match=r"model 'nope' is not in .*its models: embed"):
        builder.rollback("nope", repo)


def test_a_version_that_fails_validate_is_refused_naming_it_and_the_fix(repo):
    (repo / "embed" / "2" / "model.onnx").write_bytes(b"tampered")
    before = (repo / "embed" / "config.pbtxt").read_bytes()
    with pytest.raises(VerificationError, match=re.escape(
            "refusing to roll 'embed' back to version 2: it fails validate:\n  - model.onnx: sha256 differs")) as err:
        builder.rollback("embed", repo)
    assert "triton-builder validate embed --repository" in str(err.value) and "--model-version 2" in str(err.value)
    assert "nothing was changed" in str(err.value)
    assert (repo / "embed" / "config.pbtxt").read_bytes() == before and not (repo / "embed" / RECORD_FILE).exists()


def test_a_signed_model_needs_a_key_and_its_signed_record_vouches_for_the_config(built, tmp_path, monkeypatch):
    _, private, public = built
    monkeypatch.delenv("TRITON_BUILDER_SIGNING_KEY", raising=False)
    repo = tmp_path / "repo"
    shutil.copytree(built[0] / "signed", repo)
    with pytest.raises(UserInputError, match=r"'embed' is signed .*pass (--signing-key|signing_key) PEM"):
        builder.rollback("embed", repo)
    report = builder.rollback("embed", repo, signing_key=private, public_key=public)
    assert report.signed and "version 1's own config (its signed copy)" in report.config_source
    assert (repo / "embed" / RECORD_SIGNATURE).is_file()
    assert builder.validate("embed", repo, public_key=public, require_signature=True).ok
    # the record edited after signing: the config is no longer vouched for
    record = repo / "embed" / RECORD_FILE
    record.write_text(record.read_text().replace("served_version: 1", "served_version: 2"))
    failed = builder.validate("embed", repo, public_key=public, require_signature=True)
    assert not failed.ok and any("config.pbtxt: differs from 2/signed_config.pbtxt" in f for f in failed.failures)


def test_a_tuned_version_published_after_a_rollback_is_served_again(repo):
    from builder.repository.republish import publish_tuned

    builder.rollback("embed", repo)
    text = (repo / "embed" / "config.pbtxt").read_text()
    published = publish_tuned(repo, "embed", text, {"winner": "same config"})
    assert published["version"] == 4
    assert _policy(repo / "embed") == ("latest", [])


def test_s3_rollback_pins_the_bucket_config_and_records_it(repo, aws_mock):
    from builder.storage.s3 import S3Store, publish_repository

    store = S3Store("s3://models/prod")
    store.client.create_bucket(Bucket="models")
    publish_repository(repo, "s3://models/prod", client=store.client)
    report = builder.rollback("embed", "s3://models/prod", to=1)
    assert (report.from_version, report.to_version) == (3, 1)
    config = parse_config(store.config_text("embed"))
    assert list(config.version_policy.specific.versions) == [1]
    assert yaml.safe_load(store.get_bytes("embed", RECORD_FILE))["served_version"] == 1
    with pytest.raises(UserInputError, match=r"^to 9: model 'embed' has no version 9 in s3://models/prod"):
        builder.rollback("embed", "s3://models/prod", to=9)


def test_s3_rollback_refuses_a_version_whose_files_fail_validate(repo, aws_mock):
    from builder.storage.s3 import S3Store, publish_repository

    store = S3Store("s3://models/prod")
    store.client.create_bucket(Bucket="models")
    publish_repository(repo, "s3://models/prod", client=store.client)
    before = store.config_text("embed")
    data = bytearray(store.get_bytes("embed", 2, "model.onnx"))
    data[-1] ^= 0xFF  # the same size (the marker still checks out), other bytes
    store.put_bytes(bytes(data), "embed", 2, "model.onnx")
    with pytest.raises(VerificationError, match=r"refusing to roll 'embed' back to version 2: it fails validate:\n  - model.onnx: sha256 differs"):
        builder.rollback("embed", "s3://models/prod")
    assert store.config_text("embed") == before


def test_the_cli_rolls_back_and_prints_json(repo, capsys):
    from builder.cli import main

    assert main(["rollback", "embed", "--repository", str(repo), "--to", "1", "-o", "json"]) == 0
    out = capsys.readouterr().out
    assert '"to_version": 1' in out and '"from_version": 3' in out
    assert main(["rollback", "embed", "--repository", str(repo), "--to", "9"]) == 2
    assert "--to 9: model 'embed' has no version 9" in capsys.readouterr().err  # the CLI names its flag


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    """embed with deploy.monitor, built twice: an ensemble embed over embed__model (versions 1, 2)."""
    from builder.pipeline import build

    root = tmp_path_factory.mktemp("monitored")
    spec = write_model(root, "embed", variants=["onnx"], deploy={"monitor": True})
    for _ in range(2):
        build(spec, root / "repo", benchmark_seconds=0, progress=lambda m: None)
    return root / "repo"


def test_a_monitored_model_rolls_back_its_model_step(monitored, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(monitored, repo)
    ensemble = (repo / "embed" / "config.pbtxt").read_text()
    report = builder.rollback("embed", repo)
    assert (report.from_version, report.to_version) == (2, 1)
    assert _policy(repo / "embed__model") == ("specific", [1])
    assert (repo / "embed" / "config.pbtxt").read_text() == ensemble  # the ensemble takes the step's served version
    assert (repo / "embed__model" / RECORD_FILE).is_file()
