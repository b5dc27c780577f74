"""TensorRT optimisation profiles derived from the spec: per input, the min/opt/max FULL shapes
(batch dimension included when the model batches), in the two forms the builder needs.

- batch: 1 / the opt batch / max_batch_size. The opt batch is the largest of
  ``deploy.preferred_batch_sizes`` (what the dynamic batcher is asked to form), else
  ``max_batch_size // 2`` (at least 1). With ``max_batch_size: 0`` there is no batch dimension.
- every other dimension: ``TensorSpec.profile_shapes()`` (the spec's min/opt/max_shape, else each
  -1 dim at 1 / 16 / 64). A scalar input (``shape: []``) is ``[batch]`` when the model batches and a
  0-d tensor ``()`` when it does not; the shape strings leave static inputs (the 0-d one included) out.

Usage::

    profiles = derive_profiles(spec)
    trtexec_shape_args(profiles)     # ['--minShapes=image:1x1x8x8', '--optShapes=image:32x1x8x8', ...]
    tensorrt_api_shapes(profiles)    # [('image', (1, 1, 8, 8), (32, 1, 8, 8), (64, 1, 8, 8))]
    profiles_as_dict(profiles)       # {'image': {'min': [...], 'opt': [...], 'max': [...]}} (metadata)

The same strings feed onnxruntime's TensorRT execution provider (``trt_profile_min_shapes`` ...).
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.spec.model import ModelSpec

LEVELS = ("min", "opt", "max")


@dataclass(frozen=True)
class InputProfile:
    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    @property
    def static(self) -> bool:
        return self.min == self.opt == self.max

    def shape(self, level: str) -> tuple[int, ...]:
        return {"min": self.min, "opt": self.opt, "max": self.max}[level]


def opt_batch_size(spec: ModelSpec) -> int:
    """The batch size TensorRT tunes for (0 when the model has no batch dimension)."""
    if not spec.batching:
        return 0
    preferred = [b for b in spec.deploy.preferred_batch_sizes if 1 <= b <= spec.max_batch_size]
    if preferred:
        return max(preferred)
    return max(1, spec.max_batch_size // 2)


def derive_profiles(spec: ModelSpec) -> list[InputProfile]:
    """One profile entry per input, in the spec's input order."""
    batches = {"min": 1, "opt": opt_batch_size(spec), "max": spec.max_batch_size} if spec.batching else None
    profiles = []
    for tensor in spec.inputs:
        per_sample = tensor.profile_shapes()
        full = {}
        for level in LEVELS:
            dims = [int(d) for d in per_sample[level]]
            full[level] = tuple([batches[level], *dims] if batches else dims)
        profiles.append(InputProfile(tensor.name, full["min"], full["opt"], full["max"]))
    return profiles


def is_static(profiles: list[InputProfile]) -> bool:
    """True when no input has a dynamic dimension: TensorRT then needs no profile at all."""
    return all(p.static for p in profiles)


def shape_string(profiles: list[InputProfile], level: str) -> str:
    """trtexec / onnxruntime form: ``image:32x1x8x8,mask:32x16`` (our tensor names never contain ':' or ',').

    Only the inputs with a dynamic dimension are listed: a static input takes its shape from the ONNX
    file in both consumers, and an unbatched scalar input (``shape: []``, ``max_batch_size: 0``: a 0-d
    tensor, always static) cannot be written at all - ``t:`` is an empty shape, which onnxruntime's
    trt_profile_*_shapes parser rejects as a wrong format and trtexec cannot parse (it spells a 0-d
    shape ``scalar``)."""
    return ",".join(f"{p.name}:{'x'.join(str(d) for d in p.shape(level))}" for p in profiles if not p.static)


def trtexec_shape_args(profiles: list[InputProfile]) -> list[str]:
    """``--minShapes=... --optShapes=... --maxShapes=...``; none for a fully static model (trtexec
    takes its shapes from the ONNX file then)."""
    if is_static(profiles):
        return []
    return [f"--{level}Shapes={shape_string(profiles, level)}" for level in LEVELS]


def tensorrt_api_shapes(profiles: list[InputProfile]) -> list[tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """Arguments for ``IOptimizationProfile.set_shape(name, min, opt, max)``, one per input."""
    return [(p.name, p.min, p.opt, p.max) for p in profiles]


def profiles_as_dict(profiles: list[InputProfile]) -> dict[str, dict[str, list[int]]]:
    """Plain lists, for metadata.yaml and the plan recipe."""
    return {p.name: {level: list(p.shape(level)) for level in LEVELS} for p in profiles}
