"""Types every stage shares: the build context it reads and writes, and the result it returns.

A stage is a function ``run(ctx: BuildContext) -> StageResult``. Stages never import each other;
what one produces for the next goes into the context (``ctx.variants``, ``ctx.reference``...).

Usage::

    def run(ctx):
        if not ctx.wants("onnx"):
            return StageResult.skipped("export_onnx", "variant onnx not requested")
        ...
        return StageResult.ok("export_onnx", outputs={"opset": 20})
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from builder.accuracy.tensors import run_batched
from builder.repository.triton_releases import COMPOSE_RELEASE
from builder.spec.model import ModelSpec


class Status(str, enum.Enum):
    OK = "OK"
    FAIL = "FAIL"
    SKIPPED = "SKIPPED"


@dataclass
class StageResult:
    stage: str
    status: Status
    reason: str = ""
    outputs: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @classmethod
    def ok(cls, stage: str, reason: str = "", **outputs: Any) -> "StageResult":
        return cls(stage, Status.OK, reason, outputs)

    @classmethod
    def fail(cls, stage: str, reason: str, **outputs: Any) -> "StageResult":
        return cls(stage, Status.FAIL, reason, outputs)

    @classmethod
    def skipped(cls, stage: str, reason: str, **outputs: Any) -> "StageResult":
        return cls(stage, Status.SKIPPED, reason, outputs)

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "status": self.status.value, "reason": self.reason,
                "seconds": round(self.seconds, 3), "outputs": self.outputs}


@dataclass
class Variant:
    """One candidate model file (or files) the build may publish."""

    name: str  # registry name: onnx, torchscript, onnx_int8_static, ...
    format: str  # onnx | torchscript | openvino | plan
    precision: str  # fp32 | fp16 | int8
    path: Path  # the main model file, inside the build's work folder
    exporter: str = ""
    opset: int | None = None
    passes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # where the serving runtime computes below the variant's precision on this host (an FP32 OpenVINO IR on a
    # bf16 CPU under Triton's openvino backend: "bf16"): judged at that precision's tolerance (judged_precision)
    computes_in: str | None = None
    base: str | None = None  # the variant it was derived from (INT8, FP16): verification["vs_base"] compares them
    # filled by verify / benchmark / select
    verification: dict[str, Any] | None = None
    verified: bool | None = None
    accuracy: dict[str, Any] | None = None
    benchmark: dict[str, Any] | None = None
    rejected: str = ""  # why it may not be published ("" = eligible)
    selected: bool = False
    selection_reason: str = ""
    published_as: str = ""
    search: list[dict[str, Any]] | None = None  # the quantisation search table (builder/optimise/quant_search.py)
    # stage compress: variants that change the function by design are verified by task accuracy, not by
    # closeness; reference.npz of their published version holds their OWN outputs (what check compares)
    verified_by: str = "reference"  # reference | task_accuracy
    own_outputs: list[dict[str, Any]] | None = None  # per reference case, set by verify for task_accuracy
    # its outputs on the reference cases (verify; FP32 variants only, the bases of derived ones): vs_base
    case_outputs: list[dict[str, Any]] | None = None
    own_validation_outputs: dict[str, Any] | None = None  # on the validation set: the drift profile's outputs
    stats: dict[str, Any] | None = None  # parameters, MACs, FLOPs of the torch model it came from
    compression: dict[str, Any] | None = None  # what training made it: ratio, steps, budget, history

    @property
    def files(self) -> list[Path]:
        """The model file and its companions that travel together (ONNX external data ``model.onnx.*``,
        an OpenVINO IR's weights ``model.bin`` beside ``model.xml``)."""
        extra = sorted(p for p in self.path.parent.glob(self.path.name + ".*") if p != self.path)
        if self.format == "openvino" and self.path.with_suffix(".bin").exists():
            extra.append(self.path.with_suffix(".bin"))
        return [self.path, *extra]

    @property
    def size_mb(self) -> float:
        return sum(p.stat().st_size for p in self.files if p.exists()) / 1e6

    @property
    def eligible(self) -> bool:
        return self.verified is True and not self.rejected


@dataclass
class Reference:
    """The cases every variant is checked on, and what the eager reference returned for them."""

    cases: list[dict[str, Any]]  # [{"id": "b1_s16", "inputs": {name: array}}]
    outputs: list[dict[str, Any]]  # per case {name: array}
    validation_inputs: dict[str, Any] | None = None  # full validation set (for the task metric)
    validation_outputs: dict[str, Any] | None = None
    labels: Any = None  # checked by builder.accuracy.data_checks.check_labels
    top1_output: str | None = None  # the output the labels score (tensors.top1_output); set with labels
    output_dtypes: dict[str, str] = field(default_factory=dict)
    output_shapes: dict[str, list[int]] = field(default_factory=dict)  # per sample, -1 dynamic

    def validation_samples(self, batching: bool) -> int:
        """How many samples data.validation holds (unbatched: one set, 1)."""
        return len(next(iter(self.validation_inputs.values()))) if batching else 1

    def run_validation(self, run: Callable, max_batch_size: int) -> dict[str, Any]:
        """``run``'s outputs on all of data.validation, in batches of ``max_batch_size`` (0: one call)."""

        inputs = self.validation_inputs
        return run_batched(run, inputs, max_batch_size) if max_batch_size else run(inputs)

    def output_signature(self) -> dict[str, tuple[str, list[int]]]:
        """{output: (dtype, per-sample shape)}, what a config's outputs are made from (config_for)."""
        return {name: (dtype, self.output_shapes[name]) for name, dtype in self.output_dtypes.items()}


@dataclass
class TensorRTOutput:
    """Stage tensorrt's hand-off to stage publish (its result's outputs show the same records)."""

    plans: dict[str, dict[str, Any]] = field(default_factory=dict)  # plan variant -> compatibility record
    deferred: dict[str, Any] | None = None  # the plan deferred to the GPU host (plan_recipe.json), if any

    def recipe_published(self, location: str) -> None:
        """Record where the deferred plan's recipe was published (``<model>/<version>/plan_recipe.json``)."""
        if self.deferred is not None:
            self.deferred["recipe"] = location


@dataclass
class BuildOptions:
    repository: Path
    variants: list[str] | None = None  # overrides spec.variants
    target: str | None = None  # overrides spec.deploy.target
    strict: bool = False  # any variant failing verification fails the build
    benchmark_seconds: float | None = None  # cap per variant
    publish_variants: bool | None = None
    signing_key: Any = None  # builder.repository.signing.SigningKey: sign every published version
    registry: str | None = None  # MLflow server URL: register every published version there
    registry_alias: str | None = None  # alias set on the main model's registered version
    triton_release: str = COMPOSE_RELEASE  # the NGC release the versions must load on (IR/opset limits)


@dataclass
class BuildContext:
    spec: ModelSpec
    options: BuildOptions
    workdir: Path
    progress: Callable[[str], None] = print
    model: Any = None  # eager torch module (or a TorchScript module / ORT session for file sources)
    reference_kind: str = ""  # "pytorch eager" | "torchscript" | "onnxruntime (source ONNX)"
    reference: Reference | None = None
    variants: list[Variant] = field(default_factory=list)
    requested_variants: list[str] = field(default_factory=list)
    base_only: dict[str, list[str]] = field(default_factory=dict)  # base export -> derived variants it serves
    selected: Variant | None = None
    tensorrt: TensorRTOutput | None = None  # set by stage tensorrt when it built or deferred plans
    published: list[dict[str, Any]] = field(default_factory=list)  # set by stage publish: name, version, path...
    notes: list[str] = field(default_factory=list)
    # requested variants a stage could not make: name -> ("failed" | "skipped", why); the summary
    # table lists them and --strict fails on the failed ones (stages.common.not_made records them)
    not_made: dict[str, tuple[str, str]] = field(default_factory=dict)
    source_hashes: dict[str, str] = field(default_factory=dict)
    pipeline: Any = None  # a Hugging Face source: builder/repository/pipeline.py HuggingFacePipeline (stage load)
    user_steps: Any = None  # spec preprocess/postprocess: builder/model/user_steps.py UserSteps (stage load)
    # a pipeline's steps timed in-process (stage benchmark: builder/huggingface/step_timing.py); stage publish adds
    # labels_in_graph where it folded a classifier's post-processing into the model (builder/huggingface/label_head.py)
    step_timings: dict[str, Any] = field(default_factory=dict)
    # seconds each variant took to make, within the stage that made it (the build report's "where the time goes")
    variant_seconds: dict[str, float] = field(default_factory=dict)
    results: list[StageResult] = field(default_factory=list)

    @property
    def target(self) -> str:
        return self.options.target or self.spec.deploy.target

    def wants(self, variant_name: str) -> bool:
        return variant_name in self.requested_variants

    def variant(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)

    def add_variant(self, variant: Variant) -> Variant:
        self.variants = [v for v in self.variants if v.name != variant.name] + [variant]
        return variant


def timed(fn: Callable[[BuildContext], StageResult], ctx: BuildContext, name: str) -> StageResult:
    start = time.perf_counter()
    result = fn(ctx)
    result.seconds = time.perf_counter() - start
    result.stage = result.stage or name
    return result
