"""`triton-builder select` publishes only what the served version's build made, as it was published
(builder/repository/provenance.py), keeps a size `tune --publish` chose, and records its own
measurements as this host's (builder/repository/reselect.py). Measurements and the host are injected:
nothing here depends on this machine's speed."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from builder.core.errors import UserInputError
from builder.core.files import sha256_file
from builder.repository.config import thread_parameter
from builder.repository.republish import publish_tuned
from builder.repository.reselect import select_for_host
from tests.conftest import EXAMPLES

HERE = {"cpu_model": "AMD EPYC 7B13", "isa_flags": ["avx2"], "isa_class": "avx2", "usable_cores": 2}


def _perturbed_example(folder: Path) -> Path:
    """examples/digits with other weights (the head scaled): another model, same code and interface."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(EXAMPLES / "digits", folder)
    weights = load_file(folder / "weights.safetensors")
    weights["head.weight"] = weights["head.weight"] * 1.5
    save_file(weights, folder / "weights.safetensors")
    return folder / "spec.yaml"


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory):
    """Build A (weights as shipped) served torchscript as digits_cnn/1; build B (other weights) then served
    onnx as digits_cnn/2 with its torchscript published as digits_cnn__torchscript/1."""
    from builder.pipeline import build

    root = tmp_path_factory.mktemp("two_builds")
    repo = root / "model_repository"
    build(EXAMPLES / "digits/spec.yaml", repo, variants=["torchscript"], benchmark_seconds=0, progress=lambda m: None)
    build(_perturbed_example(root / "digits_b"), repo, variants=["onnx", "torchscript"], benchmark_seconds=0,
          publish_variants=True, progress=lambda m: None)
    assert _meta(repo, "digits_cnn/1")["artifact"]["variant"] == "torchscript"
    assert _meta(repo, "digits_cnn/2")["artifact"]["variant"] == "onnx"
    assert _meta(repo, "digits_cnn__torchscript/1")["source"] == _meta(repo, "digits_cnn/2")["source"]
    return repo


def _meta(repo: Path, label: str) -> dict:
    return yaml.safe_load((repo / label / "metadata.yaml").read_text())


def _write_meta(repo: Path, label: str, meta: dict) -> None:
    (repo / label / "metadata.yaml").write_text(yaml.safe_dump(meta))


def _copy(repo: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model_repository"
    shutil.copytree(repo, target)
    return target


def _torchscript_wins(label, runner, inputs, threads):
    """Every torchscript candidate (build A's digits_cnn/1 or build B's companion) reads 2x the onnx one."""
    assert runner(inputs)
    fast = label.split(" ")[0] in ("digits_cnn/1", "digits_cnn__torchscript/1")
    return {"throughput": 2000.0 if fast else 1000.0, "p50_ms": 0.5 if fast else 1.0}


def test_a_version_of_another_build_is_excluded_not_published(two_builds, tmp_path):
    repo = _copy(two_builds, tmp_path)
    report = select_for_host(repo, "digits_cnn", measure=_torchscript_wins, current_host=HERE)
    older = next(c for c in report.candidates if c.label == "digits_cnn/1")
    assert older.excluded.startswith("from another build: weights.safetensors differs from version 2's")
    assert "rebuild with --publish-variants" in older.excluded
    assert any("digits_cnn/1: excluded (from another build: weights.safetensors differs from version 2's" in line
               for line in report.lines())
    # build B's torchscript is the candidate of that variant, and what is published
    assert report.winner.label == "digits_cnn__torchscript/1"
    assert report.published["version"] == 3
    assert sha256_file(repo / "digits_cnn/3/model.pt") == sha256_file(repo / "digits_cnn__torchscript/1/model.pt")
    assert sha256_file(repo / "digits_cnn/3/model.pt") != sha256_file(repo / "digits_cnn/1/model.pt")
    published = _meta(repo, "digits_cnn/3")
    assert published["source"] == _meta(repo, "digits_cnn/2")["source"]
    assert "from another build" in published["selection"]["candidates"]["digits_cnn/1"]
    # the version select published keeps its build's source: the next select still takes it
    again = select_for_host(repo, "digits_cnn", measure=_torchscript_wins, current_host=HERE, dry_run=True)
    assert {c.label: c.excluded for c in again.candidates} == {"digits_cnn/3": "", "digits_cnn/2": ""}


def test_a_candidate_whose_files_changed_is_excluded_naming_the_file(two_builds, tmp_path):
    repo = _copy(two_builds, tmp_path)
    # build B's torchscript overwritten by build A's (model and reference together: its own replay passes)
    for name in ("model.pt", "reference.npz"):
        shutil.copyfile(repo / "digits_cnn/1" / name, repo / "digits_cnn__torchscript/1" / name)
    report = select_for_host(repo, "digits_cnn", measure=_torchscript_wins, current_host=HERE)
    tampered = next(c for c in report.candidates if c.label == "digits_cnn__torchscript/1")
    assert tampered.excluded == ("model.pt: sha256 differs from metadata.yaml (file changed after the build); "
                                 "reference.npz: sha256 differs from metadata.yaml (file changed after the build): "
                                 "tampered or half-copied; rebuild it")
    assert report.winner.label == "digits_cnn/2" and report.published["version"] == 3
    assert (repo / "digits_cnn/3/model.onnx").is_file() and not (repo / "digits_cnn/3/model.pt").exists()


def test_a_served_version_whose_files_changed_refuses_select(two_builds, tmp_path):
    import onnx

    repo = _copy(two_builds, tmp_path)
    served = repo / "digits_cnn/2/model.onnx"
    model = onnx.load(str(served))
    model.doc_string = "edited after the build"  # still a valid model computing the same: its replay passes
    onnx.save(model, str(served))

    def measure(label, runner, inputs, threads):
        raise AssertionError("measured a tampered repository")
    with pytest.raises(UserInputError, match=r"digits_cnn/2: digits_cnn version 2, the served version select starts "
                                             r"from, is not what was published \(model.onnx: sha256 differs from "
                                             r"metadata.yaml \(file changed after the build\): tampered or "
                                             r"half-copied; rebuild it\); run `triton-builder validate .*digits_cnn` "
                                             r"to see every problem: nothing was measured or published"):
        select_for_host(repo, "digits_cnn", measure=measure, current_host=HERE)
    assert not (repo / "digits_cnn/3").exists()


def test_select_keeps_the_size_tune_published(two_builds, tmp_path):
    from builder.repository.config import config_as_dict
    from builder.repository.tuned import config_text_from_dict

    repo = _copy(two_builds, tmp_path)
    tuned = config_as_dict((repo / "digits_cnn/config.pbtxt").read_text())
    tuned["instance_group"][0]["count"] = 3
    tuned["parameters"]["intra_op_threads"] = {"string_value": "2"}
    assert publish_tuned(repo, "digits_cnn", config_text_from_dict(tuned), {"winner": "3 x 2"})["version"] == 3
    big = {**HERE, "usable_cores": 8}  # sized here, a compute-bound model would get 2 x 4

    def served_wins(label, runner, inputs, threads):
        return {"throughput": 2000.0 if label.startswith("digits_cnn/") else 1000.0, "p50_ms": 50.0}
    report = select_for_host(repo, "digits_cnn", measure=served_wins, current_host=big)
    assert report.sizing == (3, 2)
    assert report.size_kept == "by triton-builder tune (measured on the running server; tuning.json)"
    assert "instances kept: by triton-builder tune" in report.why and report.published["version"] == 4
    config = config_as_dict((repo / "digits_cnn/config.pbtxt").read_text())
    assert config["instance_group"][0]["count"] == 3
    assert config["parameters"][thread_parameter(config["parameters"])] == {"string_value": "2"}

    # another variant wins: its config (never tuned) is given the tuned size, and the lines say to tune it
    switched = select_for_host(repo, "digits_cnn", measure=_torchscript_wins, current_host=big)
    assert switched.winner.label == "digits_cnn__torchscript/1" and switched.published["version"] == 5
    assert "tuned for onnx: run `triton-builder tune --publish` again for torchscript" in switched.why
    config = config_as_dict((repo / "digits_cnn/config.pbtxt").read_text())
    assert config["instance_group"][0]["count"] == 3
    assert config["parameters"][thread_parameter(config["parameters"])] == {"string_value": "2"}
    assert _meta(repo, "digits_cnn/5")["serving"]["sized"].startswith("by triton-builder tune")


def test_the_published_benchmark_is_this_hosts_and_the_build_hosts_is_kept_apart(two_builds, tmp_path):
    repo = _copy(two_builds, tmp_path)
    built = {"latency_ms_b1": {"p50": 0.0319}, "throughput_by_batch": {"1": 27854.8, "32": 133306.7},
             "best_throughput": 133306.7, "best_batch": 32, "peak_memory_mb": 1.5}
    meta = _meta(repo, "digits_cnn__torchscript/1")
    _write_meta(repo, "digits_cnn__torchscript/1", {**meta, "benchmark": built})
    report = select_for_host(repo, "digits_cnn", measure=_torchscript_wins, current_host=HERE)
    assert report.winner.label == "digits_cnn__torchscript/1"
    published = _meta(repo, f"digits_cnn/{report.published['version']}")
    assert published["host"] == HERE
    benchmark = published["benchmark"]
    assert benchmark["measured_by"].startswith("triton-builder select on this host (AMD EPYC 7B13, 2 usable cores): "
                                               "in-process, batch 1")
    assert benchmark["latency_ms_b1"] == {"p50": 0.5} and benchmark["throughput_by_batch"]["1"] == 2000.0
    assert 133306.7 not in benchmark["throughput_by_batch"].values() and benchmark["best_throughput"] != 133306.7
    kept = published["benchmark_on_build_host"]
    assert kept["host"] == meta["host"] and kept["best_throughput"] == 133306.7


# --- signed repositories: what select signs must have been signed with its key -------------------------------

@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """digits built once, onnx served and torchscript published beside it, both signed."""
    pytest.importorskip("model_signing")
    from builder.pipeline import build
    from tests.conftest import ec_key_pair

    private, public = ec_key_pair(tmp_path_factory.mktemp("keys"))
    repo = tmp_path_factory.mktemp("signed") / "model_repository"
    build(EXAMPLES / "digits/spec.yaml", repo, variants=["onnx", "torchscript"], benchmark_seconds=0,
          publish_variants=True, progress=lambda m: None, signing_key=private)
    return repo, private, public


@pytest.mark.parametrize("how, why", [
    ("hashes rewritten", r"model\.pt: changed after signing \(its hash no longer matches model\.sig\)"),
    ("signature removed", r"^model\.sig is missing but signed_config\.pbtxt is there: signed, then its signature "
                          r"removed \(tampered\?\)"),
    ("unsigned", r"^unsigned \(no model\.sig\) in a signed repository: select would sign what nobody signed; "
                 r"rebuild it with --signing-key"),
])
def test_a_candidate_not_signed_with_the_key_is_not_re_signed(signed, two_builds, tmp_path, monkeypatch, how, why):
    from builder.repository import signing
    from builder.repository.validate import validate_model

    monkeypatch.delenv(signing.PUBLIC_KEY_ENV, raising=False)
    repo, private, public = _copy(signed[0], tmp_path), signed[1], signed[2]
    # another model's torchscript in place of the companion, with metadata.yaml's hashes rewritten to match it
    companion = repo / "digits_cnn__torchscript/1"
    meta = _meta(repo, "digits_cnn__torchscript/1")
    for name in ("model.pt", "reference.npz"):
        shutil.copyfile(two_builds / "digits_cnn__torchscript/1" / name, companion / name)
        meta["files_sha256"][name] = sha256_file(companion / name)
    _write_meta(repo, "digits_cnn__torchscript/1", meta)
    if how != "hashes rewritten":
        (companion / signing.SIGNATURE_FILE).unlink()
    if how == "unsigned":
        (companion / signing.SIGNED_CONFIG).unlink()

    def measure(label, runner, inputs, threads):
        assert runner(inputs)
        fast = label.startswith("digits_cnn__torchscript")
        return {"throughput": 2000.0 if fast else 1000.0, "p50_ms": 0.5 if fast else 1.0}
    report = select_for_host(repo, "digits_cnn", measure=measure, current_host=HERE, signing_key=private)
    excluded = next(c for c in report.candidates if c.label == "digits_cnn__torchscript/1").excluded
    assert re.search(why, excluded), excluded
    assert report.winner.label == "digits_cnn/1" and report.published["version"] == 2
    assert (repo / "digits_cnn/2/model.onnx").is_file()
    checked = validate_model(repo / "digits_cnn", 2, public_key=public, require_signature=True, current_host=HERE)
    assert checked.ok, checked.lines()


def test_a_served_version_changed_after_signing_refuses_select(signed, tmp_path, monkeypatch):
    from builder.repository import signing

    monkeypatch.delenv(signing.PUBLIC_KEY_ENV, raising=False)
    repo, private = _copy(signed[0], tmp_path), signed[1]
    meta = _meta(repo, "digits_cnn/1")  # metadata.yaml is in no files_sha256: only the signature covers it
    meta["serving"]["sized"] = "from the spec (deploy.instances)"
    _write_meta(repo, "digits_cnn/1", meta)

    def measure(label, runner, inputs, threads):
        raise AssertionError("measured a tampered repository")
    with pytest.raises(UserInputError, match=r"digits_cnn version 1, the served version select starts from, is not "
                                             r"what was published \(metadata.yaml: changed after signing .*\); run "
                                             r"`triton-builder validate "):
        select_for_host(repo, "digits_cnn", measure=measure, current_host=HERE, signing_key=private)
    assert not (repo / "digits_cnn/2").exists()


def test_a_republished_config_keeps_each_tensors_reshape(tmp_path):
    """A scalar per sample is dims [1] + reshape []: the config select and tune --publish check and replay
    must say so, as the text they write does."""
    from builder.repository.republish import renamed_config

    text = ('name: "m"\nbackend: "python"\nmax_batch_size: 8\n'
            'input [{ name: "x" data_type: TYPE_FP32 dims: [4] }]\n'
            'output [{ name: "p" data_type: TYPE_INT64 dims: [1] reshape: { shape: [] } }]\n')
    written, config = renamed_config(tmp_path, "m2", None, text=text)
    assert config.outputs[0].reshape == [] and config.inputs[0].reshape is None
    assert 'name: "m2"' in written and "reshape" in written


def test_after_a_key_change_select_names_the_public_key_and_takes_the_old_one(signed, tmp_path, monkeypatch):
    from builder.repository import signing
    from tests.conftest import ec_key_pair

    monkeypatch.delenv(signing.PUBLIC_KEY_ENV, raising=False)
    repo, old_public = _copy(signed[0], tmp_path), signed[2]
    new_private, _ = ec_key_pair(tmp_path, "rotated")

    def measure(label, runner, inputs, threads):
        return {"throughput": 100.0, "p50_ms": 1.0}
    with pytest.raises(UserInputError, match=r"was it signed with another key\?.*if it was signed with another key "
                                             r"\(a key change\), give that key's public half: --public-key PEM or "
                                             r"\$TRITON_BUILDER_PUBLIC_KEY"):
        select_for_host(repo, "digits_cnn", measure=measure, current_host=HERE, signing_key=new_private)
    report = select_for_host(repo, "digits_cnn", measure=measure, current_host=HERE, signing_key=new_private,
                             public_key=old_public, dry_run=True)
    assert not [c for c in report.candidates if "signature" in c.excluded], [c.excluded for c in report.candidates]
