"""The GPU path, tested without a GPU: TensorRT profiles, the tensorrt_plan and ONNX-on-GPU configs,
the compose plan-build service and its script (run against FAKE trtexec / nvidia-smi test doubles),
the plan compatibility check through `triton-builder validate`, and the GPU-only steps being
SKIPPED with a reason (never silently). tests/integration/test_gpu.py runs the real thing on a GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builder.core.errors import UserInputError
from builder.tensorrt.compatibility import (check_plan_compatibility, parse_compute_capability,
                                              parse_nvidia_smi, parse_tensorrt_version, plan_compatibility_failures,
                                              tensorrt_version_from_log)
from builder.repository.config import parse_config, render_config
from builder.tensorrt.plan_build import load_recipe, parse_performance, trtexec_command
from builder.repository.publish import config_for
from builder.model.runtime import open_runner, tensorrt_unavailable_reason
from builder.spec.model import parse_spec
from builder.stages import tensorrt as tensorrt_stage
from builder.stages import verify as verify_stage
from builder.stages.base import BuildContext, BuildOptions, Status, Variant
from builder.tensorrt.profiles import (derive_profiles, is_static, opt_batch_size, profiles_as_dict, shape_string,
                                       tensorrt_api_shapes, trtexec_shape_args)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-plans.sh"
GPU_HERE = not tensorrt_unavailable_reason()
PLAN_MODEL = "digits_cnn__tensorrt_fp16"


def make_spec(**overrides):
    data = {"name": "m", "source": {"module": "model:build"},
            "inputs": [{"name": "image", "dtype": "float32", "shape": [3, 32, 32]}],
            "outputs": [{"name": "logits"}], "max_batch_size": 64}
    data.update(overrides)
    return parse_spec(data)


# --------------------------------------------------------------------------------------------
# profiles


def test_profiles_static_model_with_batching():
    profiles = derive_profiles(make_spec())
    assert tensorrt_api_shapes(profiles) == [("image", (1, 3, 32, 32), (32, 3, 32, 32), (64, 3, 32, 32))]
    assert not is_static(profiles)  # the batch dimension is dynamic
    assert trtexec_shape_args(profiles) == ["--minShapes=image:1x3x32x32", "--optShapes=image:32x3x32x32",
                                            "--maxShapes=image:64x3x32x32"]


def test_profiles_opt_batch_is_the_largest_preferred_batch_size():
    spec = make_spec(deploy={"preferred_batch_sizes": [4, 16, 8]})
    assert opt_batch_size(spec) == 16
    assert derive_profiles(spec)[0].opt == (16, 3, 32, 32)
    assert opt_batch_size(make_spec(max_batch_size=1)) == 1


def test_profiles_dynamic_dims_use_the_spec_profile_shapes():
    spec = make_spec(max_batch_size=8, inputs=[
        {"name": "input_ids", "dtype": "int64", "shape": [-1]},
        {"name": "pixels", "dtype": "float32", "shape": [3, -1, -1],
         "min_shape": [3, 8, 8], "opt_shape": [3, 128, 96], "max_shape": [3, 256, 256]}])
    profiles = derive_profiles(spec)
    assert profiles_as_dict(profiles) == {
        "input_ids": {"min": [1, 1], "opt": [4, 16], "max": [8, 64]},
        "pixels": {"min": [1, 3, 8, 8], "opt": [4, 3, 128, 96], "max": [8, 3, 256, 256]}}
    assert shape_string(profiles, "opt") == "input_ids:4x16,pixels:4x3x128x96"
    assert trtexec_shape_args(profiles)[2] == "--maxShapes=input_ids:8x64,pixels:8x3x256x256"


def test_profiles_without_batch_dimension():
    static = derive_profiles(make_spec(max_batch_size=0))
    assert tensorrt_api_shapes(static) == [("image", (3, 32, 32), (3, 32, 32), (3, 32, 32))]
    assert is_static(static) and trtexec_shape_args(static) == []  # trtexec takes the ONNX file's shapes
    dynamic = derive_profiles(make_spec(max_batch_size=0, inputs=[{"name": "x", "shape": [-1, 4]}]))
    assert profiles_as_dict(dynamic) == {"x": {"min": [1, 4], "opt": [16, 4], "max": [64, 4]}}


def test_profiles_unbatched_scalar_input_is_left_out_of_the_shape_strings():
    """A 0-d input (shape [], max_batch_size 0) used to render as ``t:`` - an empty shape onnxruntime's
    trt_profile_*_shapes parser rejects and trtexec cannot read. It is static: listed nowhere."""
    from builder.tensorrt.gpu_config import onnx_tensorrt_parameters
    scalar = {"name": "t", "dtype": "float32", "shape": []}
    mixed = make_spec(max_batch_size=0, inputs=[scalar, {"name": "x", "shape": [-1, 4]}])
    profiles = derive_profiles(mixed)
    assert profiles_as_dict(profiles)["t"] == {"min": [], "opt": [], "max": []}
    assert trtexec_shape_args(profiles) == ["--minShapes=x:1x4", "--optShapes=x:16x4", "--maxShapes=x:64x4"]
    assert onnx_tensorrt_parameters(mixed, {"profiles": True}) == {
        "trt_profile_min_shapes": "x:1x4", "trt_profile_opt_shapes": "x:16x4", "trt_profile_max_shapes": "x:64x4"}
    only = derive_profiles(make_spec(max_batch_size=0, inputs=[scalar]))
    assert is_static(only) and trtexec_shape_args(only) == [] and shape_string(only, "min") == ""
    assert onnx_tensorrt_parameters(make_spec(max_batch_size=0, inputs=[scalar]), {"profiles": True}) == {}
    batched = derive_profiles(make_spec(max_batch_size=8, inputs=[scalar]))  # [batch]: dynamic, listed
    assert trtexec_shape_args(batched) == ["--minShapes=t:1", "--optShapes=t:4", "--maxShapes=t:8"]


# --------------------------------------------------------------------------------------------
# configs


SIGNATURE = {"logits": ("float32", [10])}


def test_tensorrt_plan_config_renders_and_parses_with_kind_gpu_and_cuda_graphs():
    config = config_for(make_spec(), "plan", "gpu", "m__tensorrt_fp16", SIGNATURE)
    parsed = parse_config(render_config(config))
    assert parsed.platform == "tensorrt_plan" and parsed.default_model_filename == "model.plan"
    assert [g.kind for g in parsed.instance_group] == [parsed.instance_group[0].KIND_GPU]
    assert parsed.optimization.cuda.graphs is True
    # with a dynamic dim besides the batch, a captured graph would fit one shape only: off
    dynamic = config_for(make_spec(inputs=[{"name": "x", "shape": [-1]}]), "plan", "gpu", "m", SIGNATURE)
    assert parse_config(render_config(dynamic)).optimization.cuda.graphs is False


def test_onnx_on_gpu_config_with_the_tensorrt_accelerator():
    spec = make_spec(inputs=[{"name": "x", "shape": [-1]}], deploy={"target": "gpu", "onnx_tensorrt": {
        "precision_mode": "FP16", "max_workspace_size_bytes": 1 << 30, "trt_engine_cache_enable": True,
        "profiles": True}})
    parsed = parse_config(render_config(config_for(spec, "onnx", "gpu", "m", SIGNATURE)))
    assert parsed.platform == "onnxruntime_onnx"
    assert parsed.instance_group[0].kind == parsed.instance_group[0].KIND_GPU
    accelerator = parsed.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accelerator.name == "tensorrt"
    assert dict(accelerator.parameters) == {
        "precision_mode": "FP16", "max_workspace_size_bytes": "1073741824", "trt_engine_cache_enable": "true",
        "trt_profile_min_shapes": "x:1x1", "trt_profile_opt_shapes": "x:32x16", "trt_profile_max_shapes": "x:64x64"}
    # the same spec built for the CPU: no GPU accelerator, KIND_CPU
    cpu = parse_config(render_config(config_for(spec, "onnx", "cpu", "m", SIGNATURE)))
    assert not cpu.optimization.execution_accelerators.gpu_execution_accelerator
    assert cpu.instance_group[0].kind == cpu.instance_group[0].KIND_CPU


@pytest.mark.parametrize("settings, message", [
    ({"precision_mode": "FP8"}, r"deploy\.onnx_tensorrt\.precision_mode'.*FP8"),
    ({"workspace": 1}, r"unknown key\(s\) 'workspace'"),
    ({"max_workspace_size_bytes": 0}, r"max_workspace_size_bytes'.*>= 1"),
    ({"trt_builder_optimization_level": 9}, r"0\.\.5"),
])
def test_onnx_tensorrt_settings_are_validated(settings, message):
    with pytest.raises(UserInputError, match=message):
        make_spec(deploy={"onnx_tensorrt": settings})


# --------------------------------------------------------------------------------------------
# GPU-only steps: skipped with a reason, never silently


def _context(tmp_path, target: str, variants: list[str], spec=None) -> BuildContext:
    spec = spec or make_spec()
    ctx = BuildContext(spec=spec, options=BuildOptions(repository=tmp_path / "repo", target=target),
                       workdir=tmp_path, progress=lambda m: None)
    ctx.requested_variants = variants
    return ctx


def test_tensorrt_stage_skips_with_a_reason_off_target_and_without_onnx(tmp_path):
    result = tensorrt_stage.run(_context(tmp_path, "cpu", ["onnx", "tensorrt_fp16"]))
    assert result.status is Status.SKIPPED and "target gpu only" in result.reason and "cpu" in result.reason
    result = tensorrt_stage.run(_context(tmp_path, "gpu", ["tensorrt_fp16"]))
    assert result.status is Status.SKIPPED and "no ONNX export" in result.reason
    result = tensorrt_stage.run(_context(tmp_path, "gpu", ["onnx"]))
    assert result.status is Status.SKIPPED and "no TensorRT variant requested" in result.reason


@pytest.mark.skipif(GPU_HERE, reason="TensorRT and a CUDA GPU are here: the stage builds instead of skipping")
def test_tensorrt_stage_defers_to_the_gpu_host_and_names_what_is_missing(tmp_path):
    ctx = _context(tmp_path, "gpu", ["onnx", "tensorrt_fp16", "tensorrt_int8"])
    (tmp_path / "model.onnx").write_bytes(b"onnx")
    # the base's verdict injected: plans are derived only from an ONNX export that passed verification
    ctx.add_variant(Variant("onnx", "onnx", "fp32", tmp_path / "model.onnx", verified=True))
    result = tensorrt_stage.run(ctx)
    assert result.status is Status.SKIPPED
    assert result.reason.startswith("GPU-only step not run here: ") and tensorrt_unavailable_reason() in result.reason
    assert "docker compose --profile plans run --rm build-plans" in result.reason
    assert "tensorrt_int8 is not built" in result.reason
    assert result.outputs["deferred"]["plan_model"] == "m__tensorrt_fp16"
    assert any(n.startswith("TensorRT: GPU-only step not run here") for n in ctx.notes)


@pytest.mark.skipif(GPU_HERE, reason="TensorRT and a CUDA GPU are here: plans run")
def test_a_plan_that_cannot_run_here_is_rejected_with_the_reason(tmp_path):
    ctx = _context(tmp_path, "gpu", ["tensorrt_fp16"])
    (tmp_path / "model.plan").write_bytes(b"plan")
    plan = ctx.add_variant(Variant("tensorrt_fp16", "plan", "fp16", tmp_path / "model.plan"))
    result = verify_stage.run(ctx)
    assert plan.verified is False and plan.rejected.startswith("cannot verify the TensorRT plan here: ")
    assert result.status is Status.FAIL  # it was the only variant: nothing passed
    with pytest.raises(UserInputError, match="cannot run the TensorRT plan model.plan here: .*CUDA"):
        open_runner("plan", tmp_path / "model.plan", ["logits"])


@pytest.fixture(scope="module")
def gpu_build(tmp_path_factory):
    """examples/digits built for target gpu, here (no GPU): the repository and the build result."""
    from builder.pipeline import build

    repo = tmp_path_factory.mktemp("gpu_build") / "repo"
    result = build(ROOT / "examples" / "digits" / "spec.yaml", repo, target="gpu", benchmark_seconds=0,
                   progress=lambda m: None)
    return repo, result


@pytest.mark.skipif(GPU_HERE, reason="TensorRT and a CUDA GPU are here: the stage builds instead of skipping")
def test_gpu_build_without_gpu_records_the_skip_and_writes_the_plan_recipe(gpu_build):
    repo, result = gpu_build
    stage = next(r for r in result.results if r.stage == "tensorrt")
    assert stage.status is Status.SKIPPED
    assert "no CUDA GPU here" in stage.reason or "tensorrt Python package is not installed" in stage.reason
    assert stage.outputs["deferred"]["recipe"] == "digits_cnn/1/plan_recipe.json"
    recipe = load_recipe(repo / "digits_cnn" / "1" / "plan_recipe.json")
    assert recipe["plan_model"] == PLAN_MODEL and recipe["precision"] == "fp16"
    assert recipe["trtexec_shape_args"] == ["--minShapes=image:1x1x8x8", "--optShapes=image:32x1x8x8",
                                            "--maxShapes=image:64x1x8x8"]
    assert parse_config(recipe["config_pbtxt"]).platform == "tensorrt_plan"
    published = parse_config((repo / "digits_cnn" / "config.pbtxt").read_text())
    assert published.instance_group[0].kind == published.instance_group[0].KIND_GPU
    report = json.loads((repo / "digits_cnn" / "1" / "build_report.json").read_text())
    assert any(s["stage"] == "tensorrt" and s["status"] == "SKIPPED" for s in report["stages"])
    assert not (repo / PLAN_MODEL).exists()  # nothing half-made: the plan model appears when built


# --------------------------------------------------------------------------------------------
# the plan-build step: compose service, script, and its Python part against FAKE tools


def test_compose_file_and_plans_profile_validate():
    compose = shutil.which("docker-compose")
    if compose is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose is missing on CI (scripts/install-system-deps.sh installs it)")
        pytest.skip("docker-compose not installed (CI installs it)")
    env = dict(os.environ, GRAFANA_ADMIN_PASSWORD="test-only")
    for extra in ([], ["--profile", "plans"]):
        done = subprocess.run([compose, "-f", "docker-compose.yml", *extra, "config", "-q"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    service = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["build-plans"]
    assert service["profiles"] == ["plans"] and service["entrypoint"][-1] == "/scripts/build-plans.sh"
    assert "./builder:/opt/triton-builder/builder:ro" in service["volumes"]
    assert service["environment"]["TRITON_BUILDER_SRC"] == "/opt/triton-builder"


def test_build_plans_script_is_valid_bash():
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_recipe_to_trtexec_command_line(tmp_path):
    recipe = {"precision": "fp16", "shapes": {"opt": "image:32x1x8x8"},
              "trtexec_shape_args": ["--minShapes=image:1x1x8x8", "--optShapes=image:32x1x8x8",
                                     "--maxShapes=image:64x1x8x8"]}
    command = trtexec_command(recipe, Path("/m/d/1/model.onnx"), Path("/s/model.plan"), "/usr/src/tensorrt/bin/trtexec")
    assert command == ["/usr/src/tensorrt/bin/trtexec", "--onnx=/m/d/1/model.onnx", "--saveEngine=/s/model.plan",
                       "--minShapes=image:1x1x8x8", "--optShapes=image:32x1x8x8", "--maxShapes=image:64x1x8x8",
                       "--fp16", "--device=0", "--shapes=image:32x1x8x8"]
    quiet = trtexec_command({**recipe, "precision": "fp32"}, Path("a.onnx"), Path("b.plan"), measure=False,
                            extra=["--memPoolSize=workspace:4096"])
    assert "--fp16" not in quiet and quiet[-2:] == ["--skipInference", "--memPoolSize=workspace:4096"]


def test_trtexec_output_parsing():
    assert tensorrt_version_from_log("&&&& RUNNING TensorRT.trtexec [TensorRT v100500] [b18] # trtexec") == "10.5.0"
    assert tensorrt_version_from_log("&&&& RUNNING TensorRT.trtexec [TensorRT v8601] # trtexec") == "8.6.1"
    assert tensorrt_version_from_log("[I] TensorRT version: 10.16.1\n&&&& RUNNING [TensorRT v101601]") == "10.16.1"
    assert tensorrt_version_from_log("no banner") is None
    perf = parse_performance("[I] === Performance summary ===\n[I] Throughput: 1234.5 qps\n"
                             "[I] H2D Latency: min = 9 ms, max = 9 ms\n"
                             "[I] Latency: min = 0.1 ms, max = 0.9 ms, mean = 0.2 ms, median = 0.19 ms, "
                             "percentile(90%) = 0.3 ms, percentile(99%) = 0.5 ms\n")
    assert perf == {"throughput_qps": 1234.5, "latency_ms": {"min": 0.1, "max": 0.9, "mean": 0.2, "median": 0.19,
                                                             "p90": 0.3, "p99": 0.5}}


FAKE_TRTEXEC = """\
#!/usr/bin/env bash
# FAKE trtexec: a test double (the real TensorRT cannot run without a GPU). It prints what trtexec
# prints, logs its arguments, notes whether the plan model is already visible, writes a placeholder.
echo "&&&& RUNNING TensorRT.trtexec [TensorRT v${FAKE_TRT_VERSION:-100500}] [b18] # trtexec $*"
[ "${1:-}" = "--help" ] && exit 0
echo "$*" >> "$FAKE_TRTEXEC_LOG"
if [ -e "$FAKE_WATCH" ]; then echo "PLAN MODEL VISIBLE DURING BUILD" >> "$FAKE_TRTEXEC_LOG"; fi
for arg in "$@"; do
  case "$arg" in --saveEngine=*) printf 'FAKE TensorRT engine written by a test double\\n' > "${arg#--saveEngine=}";; esac
done
if [ "${FAKE_TRTEXEC_FAIL:-0}" = 1 ]; then echo "[E] Error[4]: fake failure"; exit 1; fi
echo "[I] === Performance summary ==="
echo "[I] Throughput: 1000 qps"
echo "[I] Latency: min = 0.1 ms, max = 0.5 ms, mean = 0.2 ms, median = 0.2 ms, percentile(99%) = 0.4 ms"
echo "&&&& PASSED TensorRT.trtexec [TensorRT v${FAKE_TRT_VERSION:-100500}] [b18] # trtexec $*"
"""

FAKE_NVIDIA_SMI = """\
#!/usr/bin/env bash
# FAKE nvidia-smi: a test double answering --query-gpu=index,uuid,compute_cap,name --format=csv,noheader
echo "0, GPU-00000000-fake, ${FAKE_COMPUTE_CAP:-9.0}, NVIDIA H100 80GB HBM3 (fake)"
"""


@pytest.fixture
def fake_gpu_tools(tmp_path) -> Path:
    """A folder named as what it is: fake trtexec + nvidia-smi, and a python3 limited to the standard
    library (python -S), as in the NGC image where the builder's packages are not installed."""
    folder = tmp_path / "fake_gpu_tools"
    folder.mkdir()
    (folder / "trtexec").write_text(FAKE_TRTEXEC)
    (folder / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (folder / "python3").write_text(f'#!/usr/bin/env bash\nexec "{sys.executable}" -S "$@"\n')
    for tool in folder.iterdir():
        tool.chmod(0o755)
    return folder


def _tool_env(fake: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRTEXEC", "PYTHONPATH", "TENSORRT_VERSION")}
    env.update(PATH=f"{fake}:/usr/bin:/bin", FAKE_TRTEXEC_LOG=str(tmp_path / "trtexec_calls.log"), **extra)
    return env


def _run_script(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(repo), *args], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def gpu_repo(gpu_build, tmp_path) -> Path:
    if GPU_HERE:
        pytest.skip("TensorRT and a CUDA GPU are here: the build makes the plan itself, no recipe")
    repo = tmp_path / "repo"
    shutil.copytree(gpu_build[0], repo)
    return repo


def test_build_plans_script_writes_plan_record_and_config_atomically(gpu_repo, fake_gpu_tools, tmp_path):
    env = _tool_env(fake_gpu_tools, tmp_path, FAKE_WATCH=str(gpu_repo / PLAN_MODEL))
    done = _run_script(gpu_repo, env)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (tmp_path / "trtexec_calls.log").read_text()
    assert "PLAN MODEL VISIBLE DURING BUILD" not in calls  # nothing appears before it is complete
    assert f"--onnx={gpu_repo / 'digits_cnn' / '1' / 'model.onnx'}" in calls
    assert "--minShapes=image:1x1x8x8 --optShapes=image:32x1x8x8 --maxShapes=image:64x1x8x8 --fp16" in calls

    model = gpu_repo / PLAN_MODEL
    assert sorted(p.name for p in model.iterdir()) == ["1", "config.pbtxt"]
    assert sorted(p.name for p in (model / "1").iterdir()) == [
        "metadata.yaml", "model.plan", "plan_compatibility.json", "reference.npz", "trtexec.log"]
    assert (model / "1" / "model.plan").read_text().startswith("FAKE TensorRT engine")
    config = parse_config((model / "config.pbtxt").read_text())
    assert config.name == PLAN_MODEL and config.platform == "tensorrt_plan"
    assert config.instance_group[0].kind == config.instance_group[0].KIND_GPU and config.optimization.cuda.graphs
    record = json.loads((model / "1" / "plan_compatibility.json").read_text())
    assert (record["gpu_name"], record["compute_capability"], record["tensorrt_version"], record["precision"]) == (
        "NVIDIA H100 80GB HBM3 (fake)", "9.0", "10.5.0", "fp16")
    assert record["profiles"]["image"]["max"] == [64, 1, 8, 8]
    meta = yaml.safe_load((model / "1" / "metadata.yaml").read_text())  # JSON, read as YAML like the builder does
    assert meta["tensorrt"] == record and meta["artifact"]["format"] == "plan" and meta["version"] == 1
    assert meta["derived_from"]["model"] == "digits_cnn" and meta["benchmark"]["inferences_per_s"] == 32000
    assert [p.name for p in (gpu_repo / "digits_cnn").iterdir() if p.name.startswith(".")] == []  # no staging left

    # a second run: up to date, nothing new; --force: version 2 appears complete, config replaced
    again = _run_script(gpu_repo, env)
    assert again.returncode == 0 and "up to date" in again.stdout
    assert sorted(p.name for p in model.iterdir()) == ["1", "config.pbtxt"]
    forced = _run_script(gpu_repo, env, "--force")
    assert forced.returncode == 0, forced.stderr
    assert sorted(p.name for p in model.iterdir()) == ["1", "2", "config.pbtxt"]
    assert yaml.safe_load((model / "2" / "metadata.yaml").read_text())["version"] == 2


def test_a_failed_plan_build_publishes_nothing(gpu_repo, fake_gpu_tools, tmp_path):
    done = _run_script(gpu_repo, _tool_env(fake_gpu_tools, tmp_path, FAKE_TRTEXEC_FAIL="1"))
    assert done.returncode == 1
    assert "trtexec failed (exit 1); nothing was published" in done.stderr and "fake failure" in done.stderr
    assert not (gpu_repo / PLAN_MODEL).exists()
    assert [p.name for p in (gpu_repo / "digits_cnn").iterdir() if p.name.startswith(".")] == []


def test_build_plans_without_gpu_or_trtexec_says_so(gpu_repo, fake_gpu_tools, tmp_path):
    (fake_gpu_tools / "nvidia-smi").unlink()
    done = _run_script(gpu_repo, _tool_env(fake_gpu_tools, tmp_path))
    assert done.returncode == 2 and "no GPU: nvidia-smi not found" in done.stderr
    (fake_gpu_tools / "trtexec").unlink()
    done = _run_script(gpu_repo, _tool_env(fake_gpu_tools, tmp_path))
    assert done.returncode == 2 and "trtexec not found" in done.stderr
    assert not (gpu_repo / PLAN_MODEL).exists()


# --------------------------------------------------------------------------------------------
# the compatibility check


RECORD = {"artifact": {"file": "model.plan"},
          "tensorrt": {"gpu_name": "NVIDIA A10G", "compute_capability": "8.6", "tensorrt_version": "10.5.0.18"}}


@pytest.mark.parametrize("text, expected", [("9.0", (9, 0)), ("8.6", (8, 6)), ("sm_90", (9, 0)), ("sm86", (8, 6)),
                                            ("120", (12, 0)), (" 10.0 ", (10, 0))])
def test_compute_capability_forms(text, expected):
    assert parse_compute_capability(text) == expected


def test_bad_target_arguments_are_user_errors():
    with pytest.raises(UserInputError, match="--gpu 'H100'.*X.Y"):
        parse_compute_capability("H100")
    with pytest.raises(UserInputError, match="--tensorrt-version '10'"):
        parse_tensorrt_version("10")


def test_compatibility_rule_in_process():
    same = check_plan_compatibility(RECORD, gpu="8.6", tensorrt_version="10.5.3")
    assert same.ok and "compute capability 8.6 matches [--gpu 8.6]" in same.checked[0]
    failures = plan_compatibility_failures(RECORD, gpu="9.0", tensorrt_version="10.6.0")
    assert len(failures) == 2
    assert "built for compute capability 8.6 (NVIDIA A10G) but the target GPU has compute capability 9.0" in failures[0]
    assert "built with TensorRT 10.5.0.18 but the target has TensorRT 10.6.0" in failures[1]
    assert all(f.endswith("docker compose --profile plans run --rm build-plans") for f in failures)
    # nothing given, nothing here: said, never passed
    unknown = plan_compatibility_failures(RECORD, local_gpus=None, local_tensorrt=None)
    assert [f.split(":")[0] for f in unknown] == ["cannot check model.plan against the target GPU",
                                                  "cannot check model.plan against the target TensorRT"]
    # this machine's GPUs, all of them (Triton puts instances on every visible GPU)
    here = parse_nvidia_smi("0, GPU-a, 8.6, NVIDIA A10G\n1, GPU-b, 8.9, NVIDIA L4\n")
    mixed = plan_compatibility_failures(RECORD, local_gpus=here, local_tensorrt="10.5.0")
    assert len(mixed) == 1 and "compute capability 8.9 (NVIDIA L4) [this machine's GPU 1 (nvidia-smi)]" in mixed[0]
    missing = plan_compatibility_failures({"artifact": {"file": "model.plan"}}, gpu="8.6", tensorrt_version="10.5")
    assert "no TensorRT compatibility record" in missing[0]


@pytest.fixture
def plan_repo(gpu_repo, fake_gpu_tools, tmp_path) -> Path:
    """The digits repository with the plan model built by the script (fake tools: 9.0, TensorRT 10.5.0)."""
    done = _run_script(gpu_repo, _tool_env(fake_gpu_tools, tmp_path))
    assert done.returncode == 0, done.stderr
    return gpu_repo


def _validate(repo: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRTEXEC",)}
    env["PATH"] = path or f"{Path(sys.executable).parent}:/usr/bin:/bin"
    return subprocess.run([sys.executable, "-m", "builder", "validate", str(repo / PLAN_MODEL), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def test_validate_refuses_an_incompatible_plan_and_accepts_a_compatible_one(plan_repo):
    ok = _validate(plan_repo, "--gpu", "9.0", "--tensorrt-version", "10.5.2")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "OK" in ok.stdout.splitlines()[0] and "compatible: compute capability 9.0 matches" in ok.stdout

    other_gpu = _validate(plan_repo, "--gpu", "8.6", "--tensorrt-version", "10.5.0")
    assert other_gpu.returncode == 1
    assert ("model.plan was built for compute capability 9.0 (NVIDIA H100 80GB HBM3 (fake)) but the target GPU has "
            "compute capability 8.6 [--gpu 8.6]") in other_gpu.stdout
    assert "rebuild the plan on the target: docker compose --profile plans run --rm build-plans" in other_gpu.stdout

    other_trt = _validate(plan_repo, "--gpu", "9.0", "--tensorrt-version", "10.6.0")
    assert other_trt.returncode == 1
    assert "built with TensorRT 10.5.0 but the target has TensorRT 10.6.0" in other_trt.stdout

    bad = _validate(plan_repo, "--gpu", "hopper")
    assert bad.returncode == 2 and "--gpu 'hopper'" in bad.stderr


def test_validate_without_target_does_not_pass_silently(plan_repo):
    plain_path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    if shutil.which("nvidia-smi", path=plain_path) or shutil.which("trtexec", path=plain_path):
        pytest.skip("this machine has nvidia-smi/trtexec: validate checks against it")
    done = _validate(plan_repo, path=plain_path)
    assert done.returncode == 1
    assert "cannot check model.plan against the target GPU: no target GPU given (--gpu X.Y" in done.stdout
    assert "cannot check model.plan against the target TensorRT" in done.stdout


def test_validate_checks_against_this_machine_when_no_target_is_given(plan_repo, fake_gpu_tools):
    local = f"{fake_gpu_tools}:{Path(sys.executable).parent}:/usr/bin:/bin"
    done = _validate(plan_repo, path=local)  # fake nvidia-smi: 9.0; fake trtexec: TensorRT 10.5.0
    assert done.returncode == 0, done.stdout
    assert "[this machine's GPU 0 (nvidia-smi)]" in done.stdout and "this machine's trtexec" in done.stdout
    (fake_gpu_tools / "nvidia-smi").write_text(FAKE_NVIDIA_SMI.replace("${FAKE_COMPUTE_CAP:-9.0}", "8.9"))
    done = _validate(plan_repo, path=local)
    assert done.returncode == 1 and "target GPU has compute capability 8.9" in done.stdout
