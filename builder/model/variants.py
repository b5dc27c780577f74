"""The variant registry: every model variant the builder can make, registered by the stage that
makes it.

A stage module registers what it makes with a decorator::

    @register_variant("onnx_int8_static", format="onnx", precision="int8", stage="quantize",
                      description="static INT8 (QDQ, per-channel) calibrated on the spec's data")
    def make_int8_static(ctx, base): ...

This module holds only the registry and imports no stage: importing ``builder.stages`` (as
builder/pipeline.py does) imports every stage module, and so registers every variant.

``resolve_variants(["onnx", "nope"], "cpu")`` raises a UserInputError that names 'nope', lists the
supported variants and says how to add one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from builder.core.errors import UserInputError, unknown_choice

ALL_TARGETS = ("cpu", "gpu", "python")
# CPU INT8 is measured and served on the CPU: a gpu target serves on the GPU, where it is opt-in (--variants)
CPU_TARGETS = ("cpu", "python")


@dataclass(frozen=True)
class VariantInfo:
    name: str
    format: str
    precision: str
    stage: str
    description: str
    targets: tuple[str, ...] = ALL_TARGETS  # where it is tried by default
    needs_gpu: bool = False
    maker: Callable[..., Any] | None = None
    base: str | None = None  # the export it is derived from (built and verified whenever it is asked for)


_REGISTRY: dict[str, VariantInfo] = {}


def register_variant(name: str, *, format: str, precision: str, stage: str, description: str,
                     targets: tuple[str, ...] = ALL_TARGETS, needs_gpu: bool = False, base: str | None = None):
    def decorate(maker):
        _REGISTRY[name] = VariantInfo(name, format, precision, stage, description, targets, needs_gpu, maker, base)
        return maker
    return decorate


def registered() -> dict[str, VariantInfo]:
    """Every variant registered so far: import ``builder.pipeline`` first (it imports every stage module,
    which registers its variants; builder/pipeline.py does)."""
    return dict(_REGISTRY)


def info(name: str) -> VariantInfo:
    return registered()[name]


def variants_of_stage(stage: str) -> list[VariantInfo]:
    return [v for v in registered().values() if v.stage == stage]


def resolve_variants(requested: list[str] | None, target: str, instance_kind: str = "auto") -> list[str]:
    """The variant names to try: the ones asked for (validated), or the target's defaults.
    ``instance_kind`` (spec deploy.instance_kind) gpu serves TorchScript variants only, on target python."""
    known = registered()
    gpu_python = _check_instance_kind(instance_kind, target)
    if requested is None:
        if gpu_python:
            return [name for name, v in known.items() if v.format == "torchscript" and v.precision != "int8"]
        return [name for name, v in known.items() if target in v.targets]
    for name in requested:
        if name not in known:
            raise unknown_choice(
                "variant", name, list(known),
                "register a maker with @register_variant(...) in the stage module under builder/stages/ "
                "that produces it",
            )
    gpu_only = [name for name in requested if known[name].needs_gpu and target != "gpu"]
    if gpu_only:
        raise UserInputError(
            f"variants {', '.join(gpu_only)} (--variants or the spec's variants): TensorRT plans are built for a GPU and served by Triton's "
            f"tensorrt backend, not on target '{target}'; build with --target gpu (on a host without a GPU it "
            "writes the recipe that builds the plan on the GPU host), or drop them from --variants")
    if gpu_python:
        others = [name for name in requested if known[name].format != "torchscript"]
        if others:
            raise UserInputError(
                f"variants {', '.join(others)} (--variants or the spec's variants) with deploy.instance_kind gpu: the "
                "python backend runs only TorchScript on a GPU instance (onnxruntime and OpenVINO run on the CPU "
                "there); ask for torchscript and/or torchscript_fp16, or set deploy.instance_kind: cpu")
    return list(dict.fromkeys(requested))


def _check_instance_kind(instance_kind: str, target: str) -> bool:
    """True for the python backend on a GPU instance (target python, deploy.instance_kind gpu)."""
    if instance_kind == "gpu" and target == "cpu":
        raise UserInputError("deploy.instance_kind gpu with target cpu: target cpu serves on the CPU; use --target gpu "
                             "(native backends, KIND_GPU) or target python (the python backend on a GPU instance)")
    if instance_kind == "cpu" and target == "gpu":
        raise UserInputError("deploy.instance_kind cpu with target gpu: target gpu serves KIND_GPU instances; use "
                             "--target cpu for CPU serving, or drop deploy.instance_kind")
    return instance_kind == "gpu" and target == "python"


def add_bases(names: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """The variants to build: ``names`` plus the base export of every derived one that was not asked
    for, and {base: [derived, ...]} for those added bases (verified and measured, never published)."""
    known = registered()
    added: dict[str, list[str]] = {}
    for name in names:
        base = known[name].base
        if base and base not in names:
            added.setdefault(base, []).append(name)
    return [*added, *names], added
