"""Signed versions (builder/repository/signing.py) with the real OpenSSF model-signing and real EC keys."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, ec_key_pair, require, run_cli

require("model_signing", "signing")
require("OpenSSL", "signing")

from builder.core.errors import UserInputError, VerificationError  # noqa: E402
from builder.repository import signing  # noqa: E402


def _key_pair(folder: Path, name: str, password: bytes | None = None) -> tuple[Path, Path]:
    return ec_key_pair(folder, name, password)


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """digits built once (onnx only, no benchmark), signed with a key kept outside the repository."""
    from builder.pipeline import build

    keys = tmp_path_factory.mktemp("keys")
    private, public = _key_pair(keys, "signing")
    repo = tmp_path_factory.mktemp("signed") / "model_repository"
    build(EXAMPLES / "digits/spec.yaml", repo, variants=["onnx"], benchmark_seconds=0, progress=lambda m: None,
          signing_key=private)
    return repo, private, public


def _copy(repo: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model_repository"
    shutil.copytree(repo, target)
    return target


def test_a_signed_version_verifies_and_holds_no_key(signed):
    repo, _, public = signed
    version = repo / "digits_cnn" / "1"
    assert (version / signing.SIGNATURE_FILE).is_file()
    assert (version / signing.SIGNED_CONFIG).read_bytes() == (repo / "digits_cnn" / "config.pbtxt").read_bytes()
    proc = run_cli("validate", str(repo / "digits_cnn"), "--public-key", str(public), "--require-signature")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for path in repo.rglob("*"):
        assert not path.is_file() or b"PRIVATE KEY" not in path.read_bytes(), path


@pytest.mark.parametrize("name", ["model.onnx", "metadata.yaml", "signed_config.pbtxt"])
def test_a_one_byte_change_is_refused_naming_the_file(signed, tmp_path, name):
    repo, _, public = _copy(signed[0], tmp_path), None, signed[2]
    path = repo / "digits_cnn" / "1" / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    proc = run_cli("validate", str(repo / "digits_cnn"), "--public-key", str(public))
    assert proc.returncode == 1
    assert f"version 1: {name}: changed after signing" in proc.stdout
    # serve refuses it before starting anything (exit 1, the model, version and file named)
    proc = run_cli("serve", "--repository", str(repo), "--public-key", str(public), timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "refusing to serve" in proc.stderr and f"digits_cnn: version 1: {name}: changed after signing" in proc.stderr


def test_an_edited_served_config_and_an_added_file_are_refused(signed, tmp_path):
    repo, public = _copy(signed[0], tmp_path), signed[2]
    config = repo / "digits_cnn" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: ", "max_batch_size: 1"))
    (repo / "digits_cnn" / "1" / "extra.py").write_text("print('hi')\n")
    report = signing.verify_model(repo / "digits_cnn", [1], public)
    assert any(line.startswith("config.pbtxt: differs from 1/signed_config.pbtxt") for line in report), report
    assert "version 1: extra.py: added after signing" in report
    with pytest.raises(VerificationError, match="digits_cnn: config.pbtxt"):
        signing.verify_repository(repo, public)


def test_unsigned_versions_are_refused_only_when_required(signed, tmp_path):
    repo, public = _copy(signed[0], tmp_path), signed[2]
    (repo / "digits_cnn" / "1" / signing.SIGNATURE_FILE).unlink()  # unsigned: neither file (one alone is tampered)
    (repo / "digits_cnn" / "1" / signing.SIGNED_CONFIG).unlink()
    proc = run_cli("validate", str(repo / "digits_cnn"), "--public-key", str(public))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning: unsigned (no model.sig)" in proc.stdout
    proc = run_cli("validate", str(repo / "digits_cnn"), "--public-key", str(public), "--require-signature")
    assert proc.returncode == 1
    assert "version 1: unsigned (no model.sig); --require-signature refuses it" in proc.stdout
    proc = run_cli("validate", str(repo / "digits_cnn"), "--require-signature")
    assert proc.returncode == 2 and "--require-signature needs a public key" in proc.stderr


def test_another_key_is_refused(signed, tmp_path):
    _, other = _key_pair(tmp_path, "other")
    failures = signing.verify_model(signed[0] / "digits_cnn", [1], other)
    assert len(failures) == 1 and "was it signed with another key?" in failures[0]


def test_key_conventions(tmp_path, monkeypatch):
    private, public = _key_pair(tmp_path, "enc", password=b"s3cret")
    monkeypatch.setenv(signing.KEY_ENV, str(private))
    monkeypatch.setenv(signing.PASSWORD_ENV, "s3cret")
    key = signing.signing_key(None)
    assert key.path == private and "s3cret" not in repr(key)
    folder = tmp_path / "v"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"x" * 64)
    signing.sign_version(folder, key)
    assert signing.verify_version(folder, 1, public) == []
    with pytest.raises(UserInputError, match="signing key .*password in \\$TRITON_BUILDER_SIGNING_KEY_PASSWORD"):
        signing.sign_version(folder, signing.SigningKey(private, "wrong"))
    repo = tmp_path / "repo"
    repo.mkdir()
    inside = repo / "k.pem"
    inside.write_bytes(private.read_bytes())
    with pytest.raises(UserInputError, match="--signing-key: .* lies inside the model repository"):
        signing.signing_key(inside, repo)
    with pytest.raises(UserInputError, match="--public-key: .*nope.pub is not a file"):
        signing.public_key(tmp_path / "nope.pub")


def test_tune_write_refuses_a_signed_version_and_writes_nothing(signed, tmp_path):
    from builder.repository.tuned import write_tuned_config

    repo = _copy(signed[0], tmp_path)
    config = repo / "digits_cnn" / "config.pbtxt"
    before = config.read_bytes()
    with pytest.raises(UserInputError, match=r"digits_cnn version 1 is signed: writing the tuned config into .* in "
                                             r"place would break its signature .* use `tune --publish` with "
                                             r"--signing-key"):
        write_tuned_config(repo, "digits_cnn", before.decode(), {"winner": "x"})
    assert config.read_bytes() == before and not (repo / "digits_cnn" / "tuning.json").exists()


def test_select_and_tune_publish_sign_their_versions(signed, tmp_path, monkeypatch):
    from builder.repository.republish import publish_tuned
    from builder.repository.reselect import select_for_host
    from builder.repository.validate import validate_model

    repo, private, public = _copy(signed[0], tmp_path), signed[1], signed[2]
    elsewhere = {"cpu_model": "Another CPU", "isa_flags": ["avx2"], "isa_class": "avx2", "usable_cores": 4}
    report = select_for_host(repo, "digits_cnn", measure=lambda label, run, inputs, threads: {
        "throughput": 1000.0, "p50_ms": 0.5}, current_host=elsewhere, signing_key=private)
    assert report.published["version"] == 2
    # tune --publish: the key from the environment, as build takes it
    monkeypatch.setenv(signing.KEY_ENV, str(private))
    config = (repo / "digits_cnn" / "config.pbtxt").read_text()
    assert publish_tuned(repo, "digits_cnn", config, {"winner": "default"})["version"] == 3
    for version in (2, 3):
        assert (repo / "digits_cnn" / str(version) / signing.SIGNATURE_FILE).is_file()
        result = validate_model(repo / "digits_cnn", version, public_key=public, require_signature=True,
                                current_host=elsewhere)
        assert result.ok, result.lines()
    _, other = _key_pair(tmp_path, "other")
    assert not validate_model(repo / "digits_cnn", 3, public_key=other, require_signature=True,
                              current_host=elsewhere).ok  # really checked against the key
    monkeypatch.delenv(signing.KEY_ENV)
    with pytest.raises(UserInputError, match=r"3/model.sig: digits_cnn version 3 is signed, but no signing key was "
                                             r"given, .* pass --signing-key PEM or set \$TRITON_BUILDER_SIGNING_KEY"):
        publish_tuned(repo, "digits_cnn", config, {"winner": "default"})
    assert not (repo / "digits_cnn" / "4").exists()


def test_select_without_a_key_over_a_signed_version_is_refused_before_measuring(signed, tmp_path, monkeypatch):
    from builder.repository.reselect import select_for_host

    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    repo = _copy(signed[0], tmp_path)
    elsewhere = {"cpu_model": "Another CPU", "isa_flags": ["avx2"], "isa_class": "avx2", "usable_cores": 4}

    def measure(label, run, inputs, threads):
        raise AssertionError("measured before the refusal")
    with pytest.raises(UserInputError, match=r"digits_cnn version 1 is signed, but no signing key was given, so the "
                                             r"new version would be published unsigned .*--signing-key PEM or set "
                                             r"\$TRITON_BUILDER_SIGNING_KEY"):
        select_for_host(repo, "digits_cnn", measure=measure, current_host=elsewhere)
    assert not (repo / "digits_cnn" / "2").exists()
    # --dry-run publishes nothing: it still measures and says what it would do
    report = select_for_host(repo, "digits_cnn", measure=lambda label, run, inputs, threads: {
        "throughput": 1000.0, "p50_ms": 0.5}, current_host=elsewhere, dry_run=True)
    assert report.published is None and "--dry-run" in report.why


def test_tune_publish_without_a_key_over_a_signed_version_is_refused_before_any_measuring(signed, tmp_path,
                                                                                           monkeypatch):
    from builder.tuning.tune import run_tune

    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    repo = _copy(signed[0], tmp_path)
    # no server at this URL: the refusal must come before tune contacts one
    with pytest.raises(UserInputError, match=r"digits_cnn version 1 is signed, but no signing key was given"):
        run_tune("digits_cnn", repo, "grpc://127.0.0.1:1", p99_budget_ms=10, publish=True)


def test_tune_write_on_a_signed_version_is_refused_before_any_measuring(signed, tmp_path):
    from builder.tuning.tune import run_tune

    repo = _copy(signed[0], tmp_path)
    # no server at this URL: the refusal must come before tune contacts one
    with pytest.raises(UserInputError, match=r"digits_cnn version 1 is signed: .* use `tune --publish`"):
        run_tune("digits_cnn", repo, "grpc://127.0.0.1:1", p99_budget_ms=10, write=True)
