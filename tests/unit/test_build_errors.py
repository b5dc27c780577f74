"""Every user mistake: exit code 2 (or UserInputError), a message naming the field/file and the
fix, and nothing written. A verification failure: exit code 1 with the per-output list."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from builder.core.errors import UserInputError, VerificationError
from builder.pipeline import build
from tests.conftest import edit_spec, run_cli


def assert_nothing_written(tmp_path, repo):
    assert not repo.exists() or not any(p for p in repo.iterdir() if not p.name.startswith(".")), list(repo.iterdir())
    leftovers = [p.name for p in tmp_path.iterdir() if "staging" in p.name]
    assert not leftovers, leftovers


def test_bad_yaml_exits_2_with_line_and_writes_nothing(digits_copy, tmp_path):
    (digits_copy / "spec.yaml").write_text("name: digits_cnn\ninputs: [ {name: image\n")
    repo = tmp_path / "repo"
    proc = run_cli("build", str(digits_copy / "spec.yaml"), "--repository", str(repo))
    assert proc.returncode == 2, proc.stderr
    assert "not valid YAML at line" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not repo.exists()


def test_unknown_key_exits_2_via_cli(digits_copy, tmp_path):
    spec = edit_spec(digits_copy, batch=4)
    proc = run_cli("build", str(spec), "--repository", str(tmp_path / "repo"))
    assert proc.returncode == 2
    assert "unknown key(s) 'batch'; known keys: name, version" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("bad_name", ["../x", 'a"b'])
def test_bad_name_exits_2(digits_copy, tmp_path, bad_name):
    spec = edit_spec(digits_copy, name=bad_name)
    repo = tmp_path / "repo"
    proc = run_cli("build", str(spec), "--repository", str(repo))
    assert proc.returncode == 2
    assert "field 'name'" in proc.stderr and "letters, digits, '_' and '-'" in proc.stderr
    assert_nothing_written(tmp_path, repo)
    assert not (tmp_path / "x").exists()


def test_missing_keys_and_bad_dtype(digits_copy, tmp_path, quiet):
    with pytest.raises(UserInputError, match=r"field 'outputs': missing"):
        build(edit_spec(digits_copy, outputs=None), tmp_path / "repo", progress=quiet)
    spec = edit_spec(digits_copy, outputs=[{"name": "logits"}],
                     inputs=[{"name": "image", "dtype": "float128", "shape": [1, 8, 8]}])
    with pytest.raises(UserInputError, match=r"inputs\[0\].dtype': 'float128' is not supported"):
        build(spec, tmp_path / "repo", progress=quiet)
    assert_nothing_written(tmp_path, tmp_path / "repo")


def test_missing_data_file(digits_copy, tmp_path, quiet):
    spec = edit_spec(digits_copy, data={"validation": "data/missing.npz"})
    with pytest.raises(UserInputError, match=r"field 'data.validation': file not found: .*missing.npz"):
        build(spec, tmp_path / "repo", progress=quiet)


def test_spec_shape_that_does_not_match_the_model(digits_copy, tmp_path, quiet):
    spec = edit_spec(digits_copy, data=None, inputs=[{"name": "image", "dtype": "float32", "shape": [3, 8, 8]}])
    with pytest.raises(UserInputError, match=r"field 'inputs': the model rejected inputs built from the spec "
                                             r"\(image\[2, 3, 8, 8\] float32\).*Fix inputs\[\]\.shape"):
        build(spec, tmp_path / "repo", progress=quiet)
    assert_nothing_written(tmp_path, tmp_path / "repo")


def test_validation_data_that_does_not_fit_the_spec(digits_copy, tmp_path, quiet):
    import numpy as np
    np.savez(digits_copy / "data" / "val.npz", image=np.zeros((4, 1, 9, 9), np.float32))
    with pytest.raises(UserInputError, match=r"data.validation: val.npz\['image'\] has per-sample shape \[1, 9, 9\], "
                                             r"the spec says \[1, 8, 8\]"):
        build(digits_copy / "spec.yaml", tmp_path / "repo", progress=quiet)


def test_validation_data_of_python_objects_names_the_array_and_is_not_unpickled(digits_copy, tmp_path, quiet):
    import numpy as np
    np.savez(digits_copy / "data" / "val.npz", image=np.array([Payload()] * 4, dtype=object))
    with pytest.raises(UserInputError, match=r"data.validation: val.npz\['image'\] holds Python objects "
                                             r"\(dtype=object\), which are never unpickled"):
        build(digits_copy / "spec.yaml", tmp_path / "repo", progress=quiet)
    assert_nothing_written(tmp_path, tmp_path / "repo")


def test_weights_that_do_not_fit_the_module(digits_copy, tmp_path, quiet):
    from safetensors.torch import save_file
    save_file({"conv.weight": torch.zeros(3, 3)}, str(digits_copy / "weights.safetensors"))
    repo = tmp_path / "repo"
    with pytest.raises(UserInputError, match=r"source.weights: weights.safetensors does not fit the module: .*Missing key"):
        build(digits_copy / "spec.yaml", repo, progress=quiet)
    assert_nothing_written(tmp_path, repo)


class Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_pickle_weights_are_refused_not_unpickled(digits_copy, tmp_path, capsys):
    evil = digits_copy / "weights.pt"
    evil.write_bytes(pickle.dumps({"conv": Payload()}))
    spec = edit_spec(digits_copy, source={"module": "model:build", "weights": "weights.pt"})
    repo = tmp_path / "repo"
    with pytest.raises(UserInputError, match=r"source.weights: .*weights.pt holds more than plain tensors .* never unpickled"):
        build(spec, repo, progress=lambda m: None)
    assert "this must never run" not in capsys.readouterr().out
    assert_nothing_written(tmp_path, repo)


@pytest.mark.slow(reason="builds a model (in-process or through the CLI)")
def test_cli_error_text_carries_no_terminal_escapes(digits_copy, tmp_path):
    torch.save(torch.nn.Linear(2, 2), str(digits_copy / "weights.pt"))  # a whole module: torch's text bolds words
    spec = edit_spec(digits_copy, source={"module": "model:build", "weights": "weights.pt"})
    proc = run_cli("build", str(spec), "--repository", str(tmp_path / "repo"))
    assert proc.returncode == 2 and "source.weights" in proc.stderr, proc.stderr
    assert "\x1b" not in proc.stderr


@pytest.mark.slow(reason="builds a model (in-process or through the CLI)")
def test_pt_state_dict_is_accepted(digits_copy, tmp_path, quiet):
    from safetensors.torch import load_file
    torch.save(load_file(str(digits_copy / "weights.safetensors")), digits_copy / "weights.pt")
    spec = edit_spec(digits_copy, source={"module": "model:build", "weights": "weights.pt"})
    result = build(spec, tmp_path / "repo", variants=["onnx"], benchmark_seconds=0, progress=quiet)
    assert result.published[0]["version"] == 1


def test_module_that_cannot_be_imported(digits_copy, tmp_path, quiet):
    spec = edit_spec(digits_copy, source={"module": "nomodule:build"})
    with pytest.raises(UserInputError, match=r"source.module': cannot import 'nomodule'"):
        build(spec, tmp_path / "repo", progress=quiet)


def test_unknown_variant_lists_supported(digits_copy, tmp_path, quiet):
    with pytest.raises(UserInputError, match=r"unknown variant 'onnx_int3'; supported: .*onnx.*To add one: register"):
        build(digits_copy / "spec.yaml", tmp_path / "repo", variants=["onnx_int3"], progress=quiet)


@pytest.mark.slow(reason="builds a model (in-process or through the CLI)")
def test_verification_failure_exits_1_with_per_output_numbers(digits_copy, tmp_path):
    spec = edit_spec(digits_copy, variants=["onnx"], verify={"tolerances": {"fp32": {"rel_l2": 1e-12}}})
    repo = tmp_path / "repo"
    proc = run_cli("build", str(spec), "--repository", str(repo), "--benchmark-seconds", "0")
    assert proc.returncode == 1, proc.stderr
    assert "no variant passed verification; nothing was published" in proc.stderr
    assert "- onnx: failed verification:" in proc.stderr
    assert "- logits: rel L2" in proc.stderr and "> 1e-12" in proc.stderr
    assert_nothing_written(tmp_path, repo)


@pytest.mark.slow(reason="builds a model (in-process or through the CLI)")
def test_strict_fails_when_any_variant_fails(digits_copy, tmp_path, quiet):
    spec = edit_spec(digits_copy, verify={"tolerances": {"fp32": {"max_abs": 0.0}}})
    # torchscript (trace) is bit-exact and passes; onnx differs slightly and fails max_abs 0
    result = build(spec, tmp_path / "repo", variants=["onnx", "torchscript"], benchmark_seconds=0, progress=quiet)
    assert result.context.selected.name == "torchscript"
    onnx = result.context.variant("onnx")
    assert onnx.verified is False and "logits: max abs" in onnx.rejected
    with pytest.raises(VerificationError, match=r"1 variant\(s\) failed verification \(--strict\)"):
        build(spec, tmp_path / "repo2", variants=["onnx", "torchscript"], strict=True, benchmark_seconds=0,
              progress=quiet)
    assert not (tmp_path / "repo2").exists()


@pytest.mark.slow(reason="builds a model (in-process or through the CLI)")
def test_a_variant_that_could_not_be_made_is_in_the_table_and_fails_strict(digits_copy, tmp_path, quiet,
                                                                          monkeypatch):
    from builder.report.build_report import format_table
    from builder.stages import optimize

    def broken(ctx):
        raise RuntimeError("the optimiser crashed on node Conv_3")

    monkeypatch.setitem(optimize.MAKERS, "onnx_opt", broken)
    result = build(digits_copy / "spec.yaml", tmp_path / "repo", variants=["onnx", "onnx_opt"], benchmark_seconds=0,
                   progress=quiet)
    row = next(r for r in result.rows if r["variant"] == "onnx_opt")
    assert row["status"] == "FAILED to make: the optimiser crashed on node Conv_3"
    assert "onnx_opt | -" in format_table(result.rows)
    with pytest.raises(VerificationError, match=r"1 could not be made \(--strict\); nothing was published") as info:
        build(digits_copy / "spec.yaml", tmp_path / "repo2", variants=["onnx", "onnx_opt"], strict=True,
              benchmark_seconds=0, progress=quiet)
    assert "onnx_opt: not made: the optimiser crashed on node Conv_3" in str(info.value)
    assert not (tmp_path / "repo2").exists()


@pytest.mark.slow(reason="builds a model (in-process or through the CLI)")
def test_existing_version_is_never_overwritten(digits_copy, tmp_path, quiet):
    repo = tmp_path / "repo"
    build(digits_copy / "spec.yaml", repo, variants=["onnx"], benchmark_seconds=0, progress=quiet)
    before = sorted(p.name for p in (repo / "digits_cnn" / "1").iterdir())
    spec = edit_spec(digits_copy, version=1)
    with pytest.raises(UserInputError, match=r"version 1 of model 'digits_cnn' already exists .* never overwritten"):
        build(spec, repo, variants=["onnx"], progress=quiet)
    assert sorted(p.name for p in (repo / "digits_cnn" / "1").iterdir()) == before


def test_register_without_a_reachable_registry_fails_before_writing(digits_copy, tmp_path, monkeypatch):
    from builder.core.processes import free_port

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    repo = tmp_path / "repo"
    with pytest.raises(UserInputError, match=r"--registry: which MLflow server\? pass --registry URL or set "
                                             r"\$MLFLOW_TRACKING_URI"):
        build(digits_copy / "spec.yaml", repo, register=True, benchmark_seconds=0)
    dead = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    with pytest.raises(UserInputError, match=rf"--registry {dead}: no MLflow server answers there"):
        build(digits_copy / "spec.yaml", repo, register=True, registry=dead, benchmark_seconds=0)
    with pytest.raises(UserInputError, match="--alias prod: only with --register"):
        build(digits_copy / "spec.yaml", repo, alias="prod", benchmark_seconds=0)
    proc = run_cli("build", str(digits_copy / "spec.yaml"), "--repository", str(repo), "--register",
                   "--registry", "ftp://example")
    assert proc.returncode == 2 and "give the MLflow server's http(s):// URL" in proc.stderr, proc.stderr
    assert_nothing_written(tmp_path, repo)


@pytest.mark.slow(reason="builds a model (in-process or through the CLI)")
def test_onnx_beyond_the_target_release_is_refused_before_publishing(digits_copy, tmp_path, quiet, monkeypatch):
    from builder.repository import triton_releases

    repo = tmp_path / "repo"
    spec = edit_spec(digits_copy, onnx={"opset": 22})
    with pytest.raises(UserInputError, match=r"onnx.opset: 22 is newer than Triton 24.10 loads \(its onnxruntime "
                                             r"1.19.2 implements opset <= 21\); set onnx.opset: 21 or lower"):
        build(spec, repo, progress=quiet, triton_release="24.10")
    edit_spec(digits_copy, onnx=None)
    with pytest.raises(UserInputError, match=r"--triton-release 19.01: not in triton-builder's runtime table "
                                             r"\(known: 24.10, 24.11, 26.05, 26.06, 26.07, 26.08\)"):
        build(digits_copy / "spec.yaml", repo, triton_release="19.01", progress=quiet)
    # a release whose onnxruntime loads only IR <= 9 (a stand-in row): the IR-10 export is rejected with the fix
    old = triton_releases.TritonRelease("19.02", "1.0.0", "0.2.0", "-", "-", "3.6", False)
    monkeypatch.setitem(triton_releases.RELEASES, "19.02", old)
    monkeypatch.setitem(triton_releases.ONNXRUNTIME_LIMITS, "0.2.0", (9, 21))
    with pytest.raises(VerificationError, match="no variant passed verification") as err:
        build(digits_copy / "spec.yaml", repo, variants=["onnx"], triton_release="19.02", benchmark_seconds=0,
              progress=quiet)
    assert "model.onnx: ONNX IR version 10 > 9, the newest onnxruntime 0.2.0 (Triton 19.02, onnxruntime backend) " \
           "loads: export with IR version <= 9" in str(err.value), str(err.value)
    assert_nothing_written(tmp_path, repo)


@pytest.mark.slow(reason="builds a model (in-process or through the CLI)")
def test_the_same_spec_builds_for_26_07_where_24_10_refuses_it(digits_copy, tmp_path, quiet):
    """opset 22: beyond 24.10's onnxruntime 1.19.2 (21), within 26.07's 1.27.0 (26); the version records 26.07."""
    import onnx
    import yaml

    spec = edit_spec(digits_copy, onnx={"opset": 22})
    repo = tmp_path / "repo"
    with pytest.raises(UserInputError, match=r"onnx.opset: 22 is newer than Triton 24.10 loads"):
        build(spec, repo, variants=["onnx"], triton_release="24.10", benchmark_seconds=0, progress=quiet)
    result = build(spec, repo, variants=["onnx"], triton_release="26.07", benchmark_seconds=0, progress=quiet)
    version = Path(result.published[0]["path"])
    meta = yaml.safe_load((version / "metadata.yaml").read_text())
    assert meta["artifact"]["triton_release"] == "26.07"
    opset = next(o.version for o in onnx.load(str(version / "model.onnx"), load_external_data=False).opset_import
                 if o.domain in ("", "ai.onnx"))
    assert opset == 22


@pytest.mark.slow(reason="builds a model (in-process or through the CLI)")
def test_torchscript_for_libtorch_follows_the_release(digits_copy, tmp_path, quiet, monkeypatch):
    """TorchScript saved by this torch (2.13) is refused for 24.10's libtorch 2.5 (target cpu) with the fix, and
    published as pytorch_libtorch for 26.07's libtorch 2.13."""
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")  # the pinned torch; the decision depends on it
    repo = tmp_path / "repo"
    with pytest.raises(VerificationError, match="no variant passed verification") as err:
        build(digits_copy / "spec.yaml", repo, variants=["torchscript"], target="cpu", triton_release="24.10",
              benchmark_seconds=0, progress=quiet)
    assert ("TorchScript saved by torch 2.13.0+cpu is newer than Triton 24.10's libtorch 2.5.0a0+e000cf0ad9 "
            "(pytorch_libtorch backend), which may not load it: build for --triton-release 26.07 or newer") in str(err.value)
    assert_nothing_written(tmp_path, repo)
    result = build(digits_copy / "spec.yaml", repo, variants=["torchscript"], target="cpu", triton_release="26.07",
                   benchmark_seconds=0, progress=quiet)
    assert result.published[0]["backend"] == "pytorch_libtorch"


@pytest.mark.parametrize("target", ["python", "cpu"])
def test_a_tensorrt_variant_off_the_gpu_target_is_refused_up_front(target):
    from builder.core.errors import UserInputError
    from builder.pipeline import build  # noqa: F401 - imports every stage, so every variant is registered
    from builder.model.variants import resolve_variants

    with pytest.raises(UserInputError, match=rf"variants tensorrt_fp16 \(--variants or the spec's variants\): "
                                             rf"TensorRT plans .* not on target '{target}'; build with --target gpu"):
        resolve_variants(["onnx", "tensorrt_fp16"], target)
    assert resolve_variants(["onnx", "tensorrt_fp16"], "gpu") == ["onnx", "tensorrt_fp16"]


def test_cpu_int8_variants_are_defaults_on_cpu_targets_and_opt_in_on_gpu():
    from builder.pipeline import build  # noqa: F401 - imports every stage, so every variant is registered
    from builder.model.variants import resolve_variants

    cpu_int8 = {"onnx_int8_static", "onnx_int8_dynamic", "torchscript_int8_dynamic"}
    for target in ("python", "cpu"):
        assert cpu_int8 <= set(resolve_variants(None, target)), target
    gpu = resolve_variants(None, "gpu")
    assert not cpu_int8 & set(gpu) and {"onnx", "onnx_fp16"} <= set(gpu)
    assert resolve_variants(["onnx_int8_static"], "gpu") == ["onnx_int8_static"]  # asked for: built
