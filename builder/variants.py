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

from builder.errors import UserInputError, unknown_choice

ALL_TARGETS = ("embedded", "cpu", "gpu")
# CPU INT8 is measured and served on the CPU: a gpu target serves on the GPU, where it is opt-in (--variants)
CPU_TARGETS = ("embedded", "cpu")


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
    """Every variant registered so far: import ``builder.stages`` first (it imports every stage module,
    which registers its variants; builder/pipeline.py does)."""
    return dict(_REGISTRY)


def info(name: str) -> VariantInfo:
    return registered()[name]


def variants_of_stage(stage: str) -> list[VariantInfo]:
    return [v for v in registered().values() if v.stage == stage]


def resolve_variants(requested: list[str] | None, target: str) -> list[str]:
    """The variant names to try: the ones asked for (validated), or the target's defaults."""
    known = registered()
    if requested is None:
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
    return list(dict.fromkeys(requested))


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
