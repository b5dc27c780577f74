"""The GPU-only parts of a model config, decided from the spec (templates only render them):

- ``tensorrt_plan`` on target gpu: CUDA graphs (``optimization { cuda { graphs: true } }``) when no
  input has a dynamic dimension besides the batch; with dynamic dims a graph would be captured for
  one shape only, so they stay off.
- ``onnxruntime_onnx`` on target gpu with ``deploy.onnx_tensorrt`` in the spec: onnxruntime's
  TensorRT execution accelerator, with the spec's parameters (Triton's names: precision_mode,
  max_workspace_size_bytes, trt_engine_cache_enable, ...). ``profiles: true`` adds
  trt_profile_min/opt/max_shapes from builder/tensorrt/profiles.py (the same shapes as the plans).
- anything else: no optimization block.

Usage::

    ModelConfig(..., optimization=gpu_optimization(spec, backend="onnxruntime_onnx", target="gpu"))
"""

from __future__ import annotations

from typing import Any

from builder.spec.model import ModelSpec
from builder.tensorrt.profiles import LEVELS, derive_profiles, is_static, shape_string


def gpu_optimization(spec: ModelSpec, backend: str, target: str) -> dict[str, Any]:
    if target != "gpu":
        return {}
    if backend == "tensorrt_plan":
        return {"cuda_graphs": True} if not spec.has_dynamic_dims else {}
    settings = getattr(spec.deploy, "onnx_tensorrt", None)
    if backend == "onnxruntime_onnx" and settings is not None:
        return {"trt_accelerator": onnx_tensorrt_parameters(spec, settings)}
    return {}


def onnx_tensorrt_parameters(spec: ModelSpec, settings: dict[str, Any]) -> dict[str, str]:
    """The accelerator's parameters as Triton wants them: strings, booleans as "true"/"false"."""

    parameters: dict[str, str] = {}
    for key, value in settings.items():
        if key == "profiles":
            continue
        parameters[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    if settings.get("profiles"):
        profiles = derive_profiles(spec)
        if not is_static(profiles):
            for level in LEVELS:
                parameters[f"trt_profile_{level}_shapes"] = shape_string(profiles, level)
    return parameters
