"""A version's lifecycle after the build, guarded: a version published below a higher one keeps the config
the higher one is served with; `register` sends only an intact version with its own config, once; a
stripped signature, a renamed or misnamed version folder, a damaged previous metadata.yaml and an empty or
repeated --max-regression limit are each named with the fix; `publish` names the model file first.

Repository states are published through stage publish with fake model files (tests/unit/test_interface_change.py
does the same); validate's replay is stood in where a test looks at other lines."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from builder.core.errors import UserInputError
from builder.repository import validate as validate_module
from builder.repository.layout import existing_versions, publish_version, reserve_version
from builder.repository.regression import parse_limits
from builder.repository.validate import validate_model
from builder.spec.model import parse_spec
from builder.stages import publish as publish_stage
from builder.stages.base import BuildContext, BuildOptions, Reference, Variant
from builder.storage.mlflow_registry import register_version
from tests.conftest import ec_key_pair, require, run_cli

NO_SERVER = "http://127.0.0.1:9"  # nothing answers: a refusal must come before the registry is asked


def _publish(tmp_path: Path, repo: Path, width: int = 16, instances: int | None = None, signing_key=None,
             version: int | None = None) -> dict:
    """One version of model 'm' (x: [width] -> y: [4]) with a fake ONNX file, through stage publish."""
    deploy = {"target": "cpu", "version_policy": "latest", **({"instances": instances} if instances else {})}
    spec = parse_spec({"name": "m", "source": {"module": "model:build"}, **({"version": version} if version else {}),
                       "inputs": [{"name": "x", "dtype": "float32", "shape": [width]}], "outputs": [{"name": "y"}],
                       "max_batch_size": 8, "deploy": deploy})
    work = tmp_path / f"work-{len(list(tmp_path.glob('work-*')))}"
    work.mkdir()
    reference = Reference(cases=[{"id": "b1", "inputs": {"x": np.zeros((1, width), np.float32)}}],
                          outputs=[{"y": np.arange(4, dtype=np.float32)[None]}],
                          output_dtypes={"y": "float32"}, output_shapes={"y": [4]})
    ctx = BuildContext(spec=spec, options=BuildOptions(repository=repo, signing_key=signing_key), workdir=work,
                       progress=lambda message: None, reference=reference, reference_kind="fake")
    (work / "model.onnx").write_bytes(f"fake model {width}".encode())
    variant = ctx.add_variant(Variant("onnx", "onnx", "fp32", work / "model.onnx", verified=True,
                                      verification={"tolerance": {"rel_l2": 1e-5}}))
    variant.selected = True
    ctx.selected = variant
    result = publish_stage.run(ctx)
    assert result.status.value == "OK", result.reason
    return ctx.published[0]


@pytest.fixture(autouse=True)
def no_warmup(monkeypatch):
    """publish's warm-up stood in: the fake model files are no models (what is tested here comes after)."""
    from builder.repository import publish
    monkeypatch.setattr(publish, "warmup_failure", lambda description: None)


@pytest.fixture
def replay_ok(monkeypatch):
    """validate's replay stood in (the fake files are no models): every version reproduces its reference."""
    monkeypatch.setattr(validate_module, "open_runner",
                        lambda *args, **kwargs: lambda inputs: {"y": np.arange(4, dtype=np.float32)[None]})


# -- 1. a version published below a higher one --------------------------------------------------------

def test_a_lower_version_keeps_the_config_the_latest_is_served_with(tmp_path):
    repo = tmp_path / "repo"
    with publish_version(repo, "m", version=9) as draft:
        (draft.folder / "model.onnx").write_text("nine")
        draft.config_text = 'name: "m"\n# version 9\n'
    assert draft.config_replaced and draft.note == ""
    with publish_version(repo, "m", version=5) as lower:
        (lower.folder / "model.pt").write_text("five")
        lower.config_text = 'name: "m"\n# version 5\n'
    assert existing_versions(repo / "m") == [5, 9]
    assert (repo / "m" / "config.pbtxt").read_text() == 'name: "m"\n# version 9\n'
    assert not lower.config_replaced
    assert lower.note == (
        "version 5 of 'm' was published below version 9: config.pbtxt was kept as version 9 has it (it is the config "
        "Triton serves version 9 with), so a latest version_policy goes on serving 9, not 5; to serve this build, "
        "build it without 'version:' (it takes the next number)")


def test_builds_finishing_out_of_order_leave_the_highest_versions_config(tmp_path):
    repo = tmp_path / "repo"
    with publish_version(repo, "m") as first:
        first.config_text = 'name: "m"\n# version 1\n'
    with reserve_version(repo, "m") as slow, reserve_version(repo, "m") as fast:
        assert (slow.version, fast.version) == (2, 3)
        with publish_version(repo, "m", reservation=fast) as draft:
            draft.config_text = 'name: "m"\n# version 3\n'
        with publish_version(repo, "m", reservation=slow) as draft:  # finishes last
            draft.config_text = 'name: "m"\n# version 2\n'
    assert existing_versions(repo / "m") == [1, 2, 3]
    assert (repo / "m" / "config.pbtxt").read_text() == 'name: "m"\n# version 3\n'


def test_a_signed_repository_validates_after_a_lower_version_is_published(tmp_path, replay_ok):
    require("model_signing", "signing")
    private, public = _key_pair(tmp_path)
    from builder.repository.signing import SigningKey
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, version=9, signing_key=SigningKey(private))
    _publish(tmp_path, repo, version=5, instances=2, signing_key=SigningKey(private))
    report = validate_model(repo / "m", public_key=public, require_signature=True)
    assert report.ok, report.lines()


# -- 2. register ----------------------------------------------------------------------------------------

def test_register_refuses_a_changed_version_before_asking_the_registry(tmp_path):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo)
    (repo / "m" / "1" / "model.onnx").write_bytes(b"replaced")
    with pytest.raises(UserInputError, match=r"/m/1: model\.onnx: sha256 differs from metadata\.yaml \(file changed "
                                             r"after the build\); not registering it: run `triton-builder validate`"):
        register_version(NO_SERVER, repo / "m")


def test_register_refuses_a_latest_version_whose_config_was_edited_out_of_its_interface(tmp_path):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo)
    config = repo / "m" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: 4"))
    with pytest.raises(UserInputError, match=re.escape(
            f"{config} does not describe version 1's interface (max_batch_size 8 -> 4; metadata.yaml's spec -> "
            "config.pbtxt): edited since the build")):
        register_version(NO_SERVER, repo / "m")


def test_register_refuses_an_older_version_whose_interface_the_config_no_longer_describes(tmp_path):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, width=16)
    _publish(tmp_path, repo, width=32)  # latest policy: published with a warning, config rewritten
    with pytest.raises(UserInputError, match=re.escape(
            "config.pbtxt is version 2's config and does not describe version 1's interface (input 'x' dims [16] -> "
            "[32]), and version 1 holds no copy of its own config (no signed_config.pbtxt: built unsigned)")):
        register_version(NO_SERVER, repo / "m", version=1)


@pytest.fixture(scope="module")
def mlflow(tmp_path_factory):
    from builder.storage import mlflow_registry
    try:
        mlflow_registry.mlflow_python()
    except Exception as err:  # noqa: BLE001 - no PyPI here
        pytest.skip(f"cannot install mlflow here: {err}")
    with mlflow_registry.MlflowServer(tmp_path_factory.mktemp("mlflow")) as running:
        yield running.url


def _registered(url: str, name: str) -> list[dict]:
    from builder.storage.mlflow_registry import _Rest
    return _Rest(url).call("GET", "api/2.0/mlflow/model-versions/search",
                           query={"filter": f"name='{name}'"}).get("model_versions", [])


@pytest.mark.slow
def test_register_attaches_the_versions_own_config_once(tmp_path, mlflow):
    require("model_signing", "signing")
    from builder.repository.signing import SigningKey
    from builder.storage.mlflow_registry import materialise
    private, _ = _key_pair(tmp_path)
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, width=16, signing_key=SigningKey(private))
    _publish(tmp_path, repo, width=32)
    done = register_version(mlflow, repo / "m", version=1, name="m_own", alias="prod")
    assert done["config"] == "1/signed_config.pbtxt (the config published with version 1)" and not done["already"]
    got = materialise("models:/m_own@prod", mlflow, cache=tmp_path / "cache")
    assert (got / "config.pbtxt").read_bytes() == (repo / "m" / "1" / "signed_config.pbtxt").read_bytes()
    assert b"dims: 16" in (got / "config.pbtxt").read_bytes().replace(b"[ ", b"").replace(b" ]", b"")

    again = register_version(mlflow, repo / "m", version=1, name="m_own")
    assert again["already"] and again["uri"] == done["uri"]
    assert again["note"] == (f"m version 1 is already registered as {done['uri']} with the same files and config; "
                             "nothing new registered")
    assert len(_registered(mlflow, "m_own")) == 1

    # the latest version with its config tuned in place since, or another build numbered alike: a new
    # registry version (MLflow's numbering), never the earlier one reused
    first = register_version(mlflow, repo / "m", name="m_own")
    config = repo / "m" / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 1", "count: 2"))
    tuned = register_version(mlflow, repo / "m", name="m_own")
    assert not tuned["already"] and tuned["uri"] != first["uri"]
    assert len(_registered(mlflow, "m_own")) == 3


@pytest.mark.slow
def test_register_of_an_older_unsigned_version_says_which_config_it_carries(tmp_path, mlflow):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, instances=1)
    _publish(tmp_path, repo, instances=2)  # same interface, other settings
    done = register_version(mlflow, repo / "m", version=1, name="m_older")
    assert done["config"] == "config.pbtxt of version 2 (version 1 holds no config of its own)"
    assert done["note"].startswith("version 1 is registered with the model's current config.pbtxt, version 2's")


# -- 3. signatures ------------------------------------------------------------------------------------------

def _key_pair(folder: Path) -> tuple[Path, Path]:
    return ec_key_pair(folder)


@pytest.fixture
def signed(tmp_path):
    require("model_signing", "signing")
    from builder.repository.signing import SigningKey
    keys = tmp_path / "keys"
    keys.mkdir()
    private, public = _key_pair(keys)
    repo = tmp_path / "repo"
    _publish(tmp_path, repo, signing_key=SigningKey(private))
    return repo, public


def test_a_stripped_signature_is_refused_not_taken_for_unsigned(signed, replay_ok):
    repo, public = signed
    (repo / "m" / "1" / "model.sig").unlink()
    report = validate_model(repo / "m", public_key=public)
    assert not report.ok
    assert report.failures == [
        "version 1: model.sig is missing but signed_config.pbtxt is there: the version was signed and its signature "
        "removed (tampered?); restore the version from where it was published, or rebuild it with --signing-key"]
    assert not validate_model(repo / "m").ok  # without a key too: the stripped signature is seen


def test_an_unsigned_version_checked_with_a_key_is_a_warning(signed, replay_ok):
    repo, public = signed
    copy = repo / "m" / "2"
    shutil.copytree(repo / "m" / "1", copy)
    for name in ("model.sig", "signed_config.pbtxt"):
        (copy / name).unlink()
    meta = yaml.safe_load((copy / "metadata.yaml").read_text())
    meta["version"] = 2
    (copy / "metadata.yaml").write_text(yaml.safe_dump(meta))
    config = repo / "m" / "config.pbtxt"
    config.write_text(config.read_text() + "# edited\n")
    report = validate_model(repo / "m", public_key=public, regression_seconds=0)
    assert report.ok, report.lines()  # documented: only --require-signature refuses unsigned versions
    lines = report.lines()
    assert "- warning: config.pbtxt: not checked with the public key: the latest version 2 is unsigned, so no signed " \
           "copy vouches for it" in lines
    assert "  warning: unsigned (no model.sig): not checked with the public key, only against metadata.yaml's " \
           "hashes (which anyone can rewrite); --require-signature refuses unsigned versions" in lines
    assert lines.index("version 2: OK (hashes match; worst rel L2 0.0e+00)") < len(lines) - 1


# -- 4. / 8. the version number and its folder -------------------------------------------------------

def test_a_renamed_version_folder_fails_naming_both_numbers(tmp_path, replay_ok):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo)
    (repo / "m" / "1").rename(repo / "m" / "7")
    report = validate_model(repo / "m")
    assert not report.ok
    assert report.versions[0].failures == [
        "metadata.yaml says version 1, but its folder is 7/ (Triton serves it as version 7): the folder was renamed "
        "or copied; move it back to 1/, or build the model again to publish a new version"]
    with pytest.raises(UserInputError, match=r"metadata\.yaml says version 1, but its folder is 7/ .*not registering"):
        register_version(NO_SERVER, repo / "m")


def test_a_version_folder_with_a_leading_zero_is_named_with_the_fix(tmp_path, replay_ok):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo)
    _publish(tmp_path, repo)
    (repo / "m" / "2").rename(repo / "m" / "02")
    assert existing_versions(repo / "m") == [1]  # as Triton: it skips "02" ("contains leading zeros")
    report = validate_model(repo / "m")
    assert not report.ok
    assert report.failures == [
        f"02/: not a version folder Triton loads (a leading zero: Triton skips it with a warning and serves no version "
        f"2 from it); version folders are plain numbers: rename it: mv {repo / 'm' / '02'} {repo / 'm' / '2'}"]
    assert [v.version for v in report.versions] == [1] and not report.versions[0].failures


# -- 5. --max-regression ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["", "  "])
def test_an_empty_max_regression_is_refused(text):
    with pytest.raises(UserInputError, match=r"^--max-regression is empty \(an unset variable\?\): give KEY=NUMBER"
                                             r"\[,KEY=NUMBER\.\.\.\] .*latency \(percent slower\).*or leave the flag "
                                             r"out for no gate$"):
        parse_limits(text)


def test_an_empty_max_regression_exits_2(tmp_path):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo)
    proc = run_cli("validate", str(repo / "m"), "--max-regression", "")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--max-regression is empty" in proc.stderr


def test_a_repeated_limit_is_refused():
    with pytest.raises(UserInputError, match=r"^--max-regression: accuracy is given twice \('accuracy=0.5,accuracy=3'\);"
                                             r" give each limit once$"):
        parse_limits("accuracy=0.5,accuracy=3")
    assert parse_limits(None) == {}


# -- 6. publish names the model file first ------------------------------------------------------------

def _version_with_reports(repo: Path, body: str) -> None:
    """Version 1 of 'm' as a build writes it, each file's content varying with ``body``: the reports sort
    before model.onnx, which an alphabetical cut of five left out."""
    with publish_version(repo, "m", version=1) as draft:
        for name in ("build_report.json", "build_report.md", "build_report.png", "drift_profile.json", "model.onnx",
                     "model.py", "reference.npz"):
            (draft.folder / name).write_text(f"{name} {body}")
        hashes = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in draft.folder.iterdir()}
        (draft.folder / "metadata.yaml").write_text(yaml.safe_dump({"version": 1, "files_sha256": hashes}))
        draft.config_text = CONFIG


CONFIG = """name: "m"
backend: "python"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 4 ] }
"""


def test_publish_names_the_model_file_first_and_counts_the_others(tmp_path, aws_mock):
    from builder.storage.s3 import S3Store, publish_repository
    repo = tmp_path / "repo"
    _version_with_reports(repo, "first build")
    store = S3Store("s3://models/prod")
    store.client.create_bucket(Bucket="models")
    publish_repository(repo, "s3://models/prod", client=store.client)
    shutil.rmtree(repo)  # version 1 built again: every file differs
    _version_with_reports(repo, "second build")
    with pytest.raises(UserInputError, match=re.escape(
            "already exists at s3://models/prod/m/1 with different files (model.onnx, metadata.yaml, reference.npz, "
            "model.py, build_report.json and 3 other files); versions are never overwritten")):
        publish_repository(repo, "s3://models/prod", client=store.client)


# -- 7. a damaged previous metadata.yaml -------------------------------------------------------------

@pytest.mark.parametrize("garbled, what", [
    ("just text\n", "is damaged: not a mapping of fields as build writes it (it reads as a YAML str)"),
    ("version: [1\n", "is not valid YAML (while parsing a flow sequence)"),
    ("version: 1\nartifact: onnx\n", "is damaged: its 'artifact' lacks the model's 'format' and 'file'"),
])
def test_a_damaged_previous_metadata_is_named_in_the_regression_line(tmp_path, replay_ok, garbled, what):
    repo = tmp_path / "repo"
    _publish(tmp_path, repo)
    _publish(tmp_path, repo)
    previous = repo / "m" / "1" / "metadata.yaml"
    previous.write_text(garbled)
    report = validate_model(repo / "m", 2, max_regression="rel_l2=1e-3")
    assert not report.ok  # still fails closed: the gate could not run
    assert report.regression.lines()[0] == (
        f"regression: version 2 vs version 1: not compared ({previous} {what}; restore it (validate --version 1 "
        "names what else changed), or remove that version)")
    assert report.regression.failures == [f"could not compare with version 1 (its metadata.yaml {what}); "
                                          "--max-regression needs both versions runnable here"]
    checked = validate_model(repo / "m", 1)  # the damaged version itself: a failure naming the file, no traceback
    assert checked.versions[0].failures == [f"metadata.yaml {what}: changed after the build; restore the version from "
                                            "where it was published, or rebuild it"]


def test_hash_check_is_one_function_for_validate_and_publish(tmp_path):
    from builder.storage import s3
    repo = tmp_path / "repo"
    _publish(tmp_path, repo)
    folder = repo / "m" / "1"
    (folder / "reference.npz").write_bytes(b"x")
    expected = validate_module.hash_failures(folder, yaml.safe_load((folder / "metadata.yaml").read_text())
                                             ["files_sha256"])
    assert expected == ["reference.npz: sha256 differs from metadata.yaml (file changed after the build)"]
    with pytest.raises(UserInputError, match=re.escape(f"{folder}: {expected[0]}; not publishing it")):
        s3.local_version_files(folder)
