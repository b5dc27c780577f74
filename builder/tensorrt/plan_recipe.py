"""The builder's half of the TensorRT plan path: what a published version carries for TensorRT.

Stage publish calls ``tensorrt_parts(ctx, variant, name, version, record)`` for every
version it describes, after the metadata record is made; what it returns goes into the version's
description (builder/repository/description.py). It reads stage tensorrt's typed hand-off
``ctx.tensorrt`` (never another stage's result):

- a plan built here by stage tensorrt (GPU + TensorRT present): its compatibility record (GPU name,
  compute capability, TensorRT version, profiles, precision) becomes metadata key ``tensorrt``;
- a build where stage tensorrt deferred ``tensorrt_fp16`` to the GPU host (no GPU or no TensorRT
  here): the first published ONNX version that TensorRT can parse (precision fp32/fp16, standard
  ONNX ops only) gets ``plan_recipe.json``. Everything the GPU host needs is in it, so the host needs
  only python3 and trtexec: the ONNX file and its sha256, the precision, the profiles and trtexec's
  --minShapes/--optShapes/--maxShapes strings, the plan model's config.pbtxt (rendered and checked
  with Triton's schema here) and the base of its metadata. builder/tensorrt/plan_build.py turns
  it into the model ``<name>__tensorrt_fp16`` (README: TensorRT plans).

Triton ignores the extra file in the ONNX version folder; the ONNX model serves unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from builder.core.files import sha256_file
from builder.repository.config import render_config
from builder.repository.metadata import _plain
from builder.repository.publish import config_for
from builder.tensorrt.plan_build import BUILD_PLANS, RECIPE_FILE, RECIPE_SCHEMA
from builder.tensorrt.profiles import (LEVELS, derive_profiles, is_static, profiles_as_dict, shape_string,
                                       trtexec_shape_args)


@dataclass(frozen=True)
class TensorRTParts:
    """What a published version carries for TensorRT: a metadata key and/or plan_recipe.json."""

    metadata: dict[str, Any] | None = None  # metadata key "tensorrt": the plan's compatibility record
    recipe: bytes | None = None  # the text of plan_recipe.json
    recipe_location: str | None = None  # <model>/<version>/plan_recipe.json
    note: str | None = None  # for metadata.yaml's notes


def tensorrt_parts(ctx, variant, name: str, version: int, record: dict[str, Any]) -> TensorRTParts:
    """The TensorRT parts of version ``version`` of model ``name`` (``record``: its metadata so far),
    from stage tensorrt's hand-off ``ctx.tensorrt`` (a :class:`builder.stages.base.TensorRTOutput`)."""
    handoff = ctx.tensorrt
    if handoff is None:
        return TensorRTParts()
    if variant.format == "plan":
        return TensorRTParts(metadata=handoff.plans.get(variant.name) or None)
    deferred = handoff.deferred
    if not deferred or deferred.get("recipe") or not recipe_source_ok(variant):
        return TensorRTParts()
    recipe = make_recipe(ctx, variant, name, version, record, deferred, sha256_file(variant.path))
    return TensorRTParts(
        recipe=(json.dumps(recipe, indent=2) + "\n").encode(),
        recipe_location=f"{name}/{version}/{RECIPE_FILE}",
        note=f"{RECIPE_FILE}: the recipe for TensorRT model {deferred['plan_model']} ({deferred['precision']}); "
             f"build it on the GPU host that serves it: {BUILD_PLANS}")


def recipe_source_ok(variant) -> bool:
    """An ONNX variant trtexec can take: fp32/fp16, only standard ONNX ops (no onnxruntime-only fusions)."""
    if variant.format != "onnx" or variant.precision not in ("fp32", "fp16"):
        return False
    import onnx

    model = onnx.load(str(variant.path), load_external_data=False)
    return all(node.domain in ("", "ai.onnx") for node in model.graph.node) and not model.functions


def make_recipe(ctx, variant, name: str, version: int, record: dict[str, Any], deferred: dict[str, Any],
                onnx_sha256: str) -> dict[str, Any]:
    spec = ctx.spec
    plan_model = deferred["plan_model"]
    profiles = derive_profiles(spec)
    signature = ctx.reference.output_signature()
    config_text = render_config(config_for(spec, "plan", "gpu", plan_model, signature))
    onnx_file = record["artifact"]["file"]
    source = {"model": name, "version": version, "variant": variant.name, "file": onnx_file,
              "sha256": onnx_sha256, "opset": variant.opset}
    precision = deferred["precision"]
    metadata = {
        "model_name": plan_model,
        "version": None,  # the rest of the None values are filled on the GPU host
        "build_date": None,
        "source": record["source"],
        "spec": record["spec"],
        "artifact": {"variant": deferred["variant"], "format": "plan", "precision": precision, "file": "model.plan",
                     "exporter": "trtexec (build-plans)", "opset": variant.opset,
                     "passes": [f"TensorRT {precision.upper()} build with trtexec"], "backend": "tensorrt_plan",
                     "target": "gpu"},
        "tensorrt": None,
        "derived_from": source,
        "files_sha256": None,
        "versions": record["versions"],
        "verification": {"status": "pending: plans are not compared with the reference when they are built",
                         "reference": f"reference.npz, copied from {name} version {version}",
                         "tolerance": spec.verify.tolerance(precision),
                         "how": f"serve it, then: triton-builder check {plan_model}"},
        "accuracy": None,
        "benchmark": None,
        "selection": {"objective": spec.objective, "selected": False,
                      "why": f"built on the GPU host by build-plans from {name} version {version}; clients choose "
                             f"it by calling {plan_model}", "candidates": {}},
        "notes": [n for n in record.get("notes", []) if not n.startswith("TensorRT: GPU-only step")],
    }
    return {
        "schema": RECIPE_SCHEMA,
        "kind": "triton-builder TensorRT plan recipe",
        "build_with": BUILD_PLANS,
        "source": source,
        "plan_model": plan_model,
        "variant": deferred["variant"],
        "precision": precision,
        "profiles": profiles_as_dict(profiles),
        "shapes": {} if is_static(profiles) else {level: shape_string(profiles, level) for level in LEVELS},
        "trtexec_shape_args": trtexec_shape_args(profiles),
        "config_pbtxt": config_text,
        "metadata": _plain(metadata),
    }
