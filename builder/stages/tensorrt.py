"""Stage `tensorrt`: TensorRT plans built from the ONNX export, where they will run.

- ``tensorrt_fp16``: FP16 builder flag.
- ``tensorrt_int8``: INT8 (FP16 where INT8 has no kernel), calibrated by an IInt8EntropyCalibrator2
  fed with ``data.calibration``; the calibration cache travels with the plan
  (``model.plan.calibration.cache``).

With the ``tensorrt`` Python package (extra ``[gpu]``) and a CUDA GPU, the plan is built here with
the TensorRT Python API, on one optimisation profile (min/opt/max from builder/tensorrt/profiles.py),
then verified and measured like every other variant (builder.model.runtime's plan runner) and published
with ``platform: "tensorrt_plan"``. Its metadata.yaml records, under ``tensorrt``: the GPU name and
compute capability, the TensorRT version, the profiles and the precision; ``triton-builder validate
--gpu X.Y --tensorrt-version A.B.C`` refuses it for any other target (builder/tensorrt/compatibility.py).

Without a GPU or without TensorRT (the usual case on a build machine) the stage is SKIPPED and says
which is missing. For target gpu the published ONNX version then carries ``plan_recipe.json``
(builder/tensorrt/plan_recipe.py), from which ``docker compose --profile plans run --rm
build-plans`` builds ``<name>__tensorrt_fp16`` on the GPU host with the TensorRT of the serving
image (scripts/build-plans.sh -> builder/tensorrt/plan_build.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from builder.model.runtime import tensorrt_unavailable_reason
from builder.model.variants import register_variant, variants_of_stage
from builder.spec.model import NAME_PATTERN
from builder.stages.base import BuildContext, StageResult, TensorRTOutput, Variant
from builder.stages.common import BaseFailed, check_base, not_made, skipped_for_base
from builder.tensorrt.profiles import (InputProfile, derive_profiles, is_static, opt_batch_size, profiles_as_dict,
                                       tensorrt_api_shapes)

STAGE = "tensorrt"
RECIPE_VARIANT = "tensorrt_fp16"  # what build-plans makes on the GPU host
WORKSPACE_BYTES = 4 << 30
BUILD_PLANS = "docker compose --profile plans run --rm build-plans"


def plan_model_name(spec_name: str, variant: str = RECIPE_VARIANT) -> str:
    """The model a plan is published as when it is not the selected one: ``<name>__<variant>``."""
    return f"{spec_name}__{variant}"


@register_variant("tensorrt_fp16", format="plan", precision="fp16", stage=STAGE, base="onnx",
                  targets=("gpu",), needs_gpu=True,
                  description="TensorRT plan, FP16 (built on a CUDA GPU; else deferred to the GPU host: build-plans)")
def make_fp16(ctx: BuildContext, onnx: Variant, profiles: list[InputProfile]) -> tuple[Variant, dict[str, Any]]:
    return _make_plan(ctx, "tensorrt_fp16", "fp16", onnx, profiles)


@register_variant("tensorrt_int8", format="plan", precision="int8", stage=STAGE, base="onnx",
                  targets=("gpu",), needs_gpu=True,
                  description="TensorRT plan, INT8 calibrated (entropy calibrator 2) on the spec's calibration data")
def make_int8(ctx: BuildContext, onnx: Variant, profiles: list[InputProfile]) -> tuple[Variant, dict[str, Any]]:
    if ctx.spec.data.calibration is None:
        raise ValueError("INT8 needs calibration data: add data.calibration (an .npz keyed by input name) to the spec")
    return _make_plan(ctx, "tensorrt_int8", "int8", onnx, profiles)


MAKERS = {"tensorrt_fp16": make_fp16, "tensorrt_int8": make_int8}


def run(ctx: BuildContext) -> StageResult:
    wanted = [info.name for info in variants_of_stage(STAGE) if ctx.wants(info.name)]
    if not wanted:
        return StageResult.skipped(STAGE, "no TensorRT variant requested (tensorrt_fp16 and tensorrt_int8 are "
                                          "tried by default on target gpu)")
    if ctx.target != "gpu":
        return StageResult.skipped(STAGE, f"TensorRT plans are served on target gpu only; this build's target is "
                                          f"{ctx.target} ({', '.join(wanted)} not built)")
    onnx = ctx.variant("onnx")
    if onnx is None or not onnx.path.exists():
        return StageResult.skipped(STAGE, f"no ONNX export to build {', '.join(wanted)} from (see stage export_onnx)")
    try:  # a plan compiled from a wrong graph inherits its error, within FP16's or INT8's looser tolerance
        check_base(ctx, [onnx])
    except BaseFailed as exc:
        skipped = {name: skipped_for_base(ctx, name, exc) for name in wanted}
        return StageResult.skipped(STAGE, f"{', '.join(wanted)}: {exc}", skipped=skipped)
    profiles = derive_profiles(ctx.spec)
    missing = tensorrt_unavailable_reason()
    if missing:
        return _defer(ctx, wanted, profiles, missing)

    built, failed, records = [], {}, {}
    for name in wanted:
        ctx.progress(f"  building {name} with TensorRT ...")
        try:
            variant, record = MAKERS[name](ctx, onnx, profiles)
        except Exception as exc:  # noqa: BLE001 - one plan failing does not stop the others
            failed[name] = " ".join(str(exc).split())[:500] or type(exc).__name__
            ctx.progress(f"  {name} FAILED: {failed[name]}")
            not_made(ctx, name, failed[name])
            continue
        ctx.add_variant(variant)
        built.append(name)
        records[name] = record
    # the compatibility records stage publish puts into each plan's metadata.yaml
    ctx.tensorrt = TensorRTOutput(plans=records)
    outputs: dict[str, Any] = {"plans": records, "failed": failed, "profiles": profiles_as_dict(profiles)}
    if not built:
        return StageResult.fail(STAGE, "; ".join(f"{k}: {v}" for k, v in failed.items()), **outputs)
    first = records[built[0]]
    reason = (f"built {', '.join(built)} on {first['gpu_name']} (compute capability {first['compute_capability']}, "
              f"TensorRT {first['tensorrt_version']})")
    if failed:
        reason += "; failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items())
    return StageResult.ok(STAGE, reason, **outputs)


def _defer(ctx: BuildContext, wanted: list[str], profiles: list[InputProfile], missing: str) -> StageResult:
    parts = [f"GPU-only step not run here: {missing}."]
    deferred = None
    if RECIPE_VARIANT in wanted:
        plan_model = plan_model_name(ctx.spec.name)
        if NAME_PATTERN.match(plan_model):
            deferred = {"variant": RECIPE_VARIANT, "precision": "fp16", "plan_model": plan_model,
                        "profiles": profiles_as_dict(profiles), "recipe": None}
            parts.append(f"{RECIPE_VARIANT} is deferred to the GPU host: the first published ONNX version "
                         f"(fp32/fp16, standard ops) gets plan_recipe.json, and `{BUILD_PLANS}` builds it there as "
                         f"model {plan_model} (README: TensorRT plans).")
        else:
            parts.append(f"{RECIPE_VARIANT} cannot be deferred: model name {plan_model!r} would be too long (128 max).")
    if "tensorrt_int8" in wanted:
        parts.append("tensorrt_int8 is not built: its calibration needs the TensorRT Python API on a CUDA GPU "
                     "(pip install 'triton-builder[gpu]' there and build again).")
    ctx.notes.append("TensorRT: " + " ".join(parts))
    ctx.tensorrt = TensorRTOutput(deferred=deferred)
    return StageResult.skipped(STAGE, " ".join(parts), missing=missing, deferred=deferred,
                               profiles=profiles_as_dict(profiles))


# --------------------------------------------------------------------------------------------
# building with the TensorRT Python API (only reached with tensorrt + a CUDA GPU)


def _make_plan(ctx: BuildContext, name: str, precision: str, onnx: Variant,
               profiles: list[InputProfile]) -> tuple[Variant, dict[str, Any]]:
    """Build, write model.plan into the work folder, return the variant and its compatibility record."""
    import tensorrt as trt
    import torch

    out_dir = ctx.workdir / name
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = out_dir / "model.plan"
    start = time.perf_counter()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    flags = 0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx.path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT's ONNX parser refused {onnx.path.name}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    config.set_flag(trt.BuilderFlag.FP16)
    if not is_static(profiles):
        profile = builder.create_optimization_profile()
        for input_name, low, opt, high in tensorrt_api_shapes(profiles):
            profile.set_shape(input_name, low, opt, high)
        config.add_optimization_profile(profile)
    calibration = None
    if precision == "int8":
        if not hasattr(trt, "IInt8EntropyCalibrator2"):
            raise RuntimeError(f"TensorRT {trt.__version__} has no calibrated (implicit) INT8: use a Q/DQ ONNX "
                               "variant (onnx_int8_static) instead")
        cache = out_dir / "model.plan.calibration.cache"
        batches, batch_shapes = _calibration_batches(ctx)
        calibrator = _entropy_calibrator(trt, torch, batches, cache)
        config.set_flag(trt.BuilderFlag.INT8)
        config.int8_calibrator = calibrator
        if not is_static(profiles):
            calib_profile = builder.create_optimization_profile()
            for input_name, shape in batch_shapes.items():
                calib_profile.set_shape(input_name, shape, shape, shape)
            config.set_calibration_profile(calib_profile)
        calibration = {"method": "IInt8EntropyCalibrator2", "data": ctx.spec.data.calibration.name,
                       "batches": len(batches), "batch_shapes": {k: list(v) for k, v in batch_shapes.items()},
                       "cache": cache.name}
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT could not build the engine (see the TensorRT log above)")
    plan.write_bytes(bytes(serialized))
    major_cc, minor_cc = torch.cuda.get_device_capability(0)
    record = {"gpu_name": torch.cuda.get_device_name(0), "compute_capability": f"{major_cc}.{minor_cc}",
              "tensorrt_version": trt.__version__, "profiles": profiles_as_dict(profiles), "precision": precision,
              "built_by": "TensorRT Python API (triton-builder stage tensorrt)",
              "build_seconds": round(time.perf_counter() - start, 2)}
    if calibration:
        record["calibration"] = calibration
    variant = Variant(name, "plan", precision, plan, exporter=f"tensorrt {trt.__version__}", opset=onnx.opset,
                      passes=[f"TensorRT {precision.upper()} build, workspace {WORKSPACE_BYTES >> 20} MiB"])
    variant.notes.append(f"built on {record['gpu_name']} (compute capability {record['compute_capability']}) "
                         f"with TensorRT {record['tensorrt_version']}: serve it on the same GPU architecture and "
                         "TensorRT major.minor only")
    return variant, record


def _calibration_batches(ctx: BuildContext) -> tuple[list[dict[str, np.ndarray]], dict[str, tuple[int, ...]]]:
    """Calibration data cut into equal batches (TensorRT calibrates at one shape per input)."""
    spec = ctx.spec
    with np.load(spec.data.calibration, allow_pickle=False) as archive:
        data = {t.name: np.asarray(archive[t.name]).astype(t.dtype, copy=False) for t in spec.inputs}
    count = min(len(a) for a in data.values())
    limit = getattr(getattr(spec, "quantization", None), "calibration_samples", None) or count
    count = min(count, limit)
    if spec.batching:
        batch = max(1, min(opt_batch_size(spec), count))
        batches = [{k: v[i:i + batch] for k, v in data.items()} for i in range(0, count - batch + 1, batch)]
    else:  # no batch dimension: one sample (the full input) per calibration step
        batches = [{k: v[i] for k, v in data.items()} for i in range(count)]
    if not batches:
        raise ValueError(f"{spec.data.calibration.name} holds no sample to calibrate with")
    return batches, {k: tuple(v.shape) for k, v in batches[0].items()}


def _entropy_calibrator(trt, torch, batches: list[dict[str, np.ndarray]], cache: Path):
    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self._pending = iter(batches)
            self._held: list = []

        def get_batch_size(self) -> int:
            first = next(iter(batches[0].values()))
            return int(first.shape[0]) if first.ndim else 1

        def get_batch(self, names):
            feed = next(self._pending, None)
            if feed is None:
                return None
            self._held = [torch.from_numpy(np.ascontiguousarray(feed[n])).cuda() for n in names]
            return [int(t.data_ptr()) for t in self._held]

        def read_calibration_cache(self):
            return cache.read_bytes() if cache.exists() else None

        def write_calibration_cache(self, data) -> None:
            cache.write_bytes(bytes(data))

    return EntropyCalibrator()
