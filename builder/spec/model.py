"""The model spec: the YAML contract users write, as validated dataclasses.

Every error names the file and the field, and says how to fix it::

    >>> spec = load_spec("examples/digits/spec.yaml")
    >>> spec.name, spec.inputs[0].shape, spec.max_batch_size
    ('digits_cnn', [1, 8, 8], 64)

Relative paths resolve against the spec file's folder; that folder is importable for
``source.module``. See README.md "Spec reference" for every key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.core.errors import UserInputError
from builder.spec.checks import check_dynamic_sizes, check_input_ranges, parse_input_rule
from builder.spec.compression import CompressionSpec, parse_compression, parse_training
from builder.spec.fields import Fields as _Fields, collect_unknown_keys, is_number, read_yaml, validate_tensor_name
from builder.spec.huggingface import (DEFAULT_MAX_BATCH_SIZE as HF_MAX_BATCH_SIZE, HF_KEYS, derived_tensors,
                                      parse_huggingface, refuse_tensor_lists)
from builder.spec.steps import StepSpec, check_steps, parse_step
from builder.spec.verify import DEFAULT_TOLERANCES, VerifySpec, parse_verify

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}\Z")
MODULE_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")

# numpy dtype name -> Triton data type. The single place dtypes are defined.
TRITON_DTYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "float64": "TYPE_FP64",
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
    "int16": "TYPE_INT16",
    "int8": "TYPE_INT8",
    "uint8": "TYPE_UINT8",
    "bool": "TYPE_BOOL",
}
TARGETS = ("cpu", "gpu", "python")
#: old target names that still work, with what they now mean (said once per build: target_note)
TARGET_ALIASES = {"embedded": "cpu"}


def canonical_target(target: str) -> str:
    """``target`` with an old name replaced by the target it now is (TARGET_ALIASES)."""
    return TARGET_ALIASES.get(target, target)


def target_note(target: str | None) -> str | None:
    """What an old target name now means, or None."""
    if target not in TARGET_ALIASES:
        return None
    return (f"target '{target}' is now '{TARGET_ALIASES[target]}': the standard Triton folders (onnxruntime_onnx, "
            "pytorch_libtorch, openvino), which the embedded server and the stock NGC image both serve; "
            "--target python publishes the python-backend model of earlier releases")
OBJECTIVES = ("throughput", "latency", "tradeoff")
# objective tradeoff: J = alpha * accuracy (points) - beta * p50 latency at batch 1 (ms) - gamma * memory (MB)
TRADEOFF_DEFAULTS = {"alpha": 1.0, "beta": 1.0, "gamma": 0.0}

def validate_model_name(name: Any, where: str = "name") -> str:
    """A Triton model name: letters, digits, '_' and '-' only (no paths, quotes or spaces)."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise UserInputError(
            f"{where}: {name!r} is not a valid model name; use 1-128 letters, digits, '_' and '-' "
            "only (no '/', '..', quotes or spaces), e.g. digits_cnn"
        )
    return name


@dataclass
class TensorSpec:
    name: str
    dtype: str = "float32"
    shape: list[int] = field(default_factory=list)
    value_range: tuple[float, float] | None = None
    min_shape: list[int] | None = None
    opt_shape: list[int] | None = None
    max_shape: list[int] | None = None
    values: tuple | None = None  # generated values only from these (builder/accuracy/input_rules.py)
    kind: str | None = None  # padding_mask | segments | positions (builder/accuracy/input_rules.py KINDS)
    rule_source: str | None = None  # who set values/kind/value_range when not the spec (data, probe)

    @property
    def triton_dtype(self) -> str:
        return TRITON_DTYPES[self.dtype]

    @property
    def dynamic(self) -> bool:
        return any(d == -1 for d in self.shape)

    def concrete_shape(self, dynamic_size: int) -> list[int]:
        """The per-sample shape with every -1 replaced by ``dynamic_size``."""
        return [dynamic_size if d == -1 else d for d in self.shape]

    def profile_shapes(self) -> dict[str, list[int]]:
        """min/opt/max per-sample shapes (TensorRT profiles, warm-up, generated inputs); one left out
        defaults to 1 / 16 / 64 on the dynamic dims, within the ones given (max_shape [8] alone: opt 8)."""
        low = self.min_shape or self.concrete_shape(1)
        high = self.max_shape or [max(64, lo) if d == -1 else d for d, lo in zip(self.shape, low)]
        opt = self.opt_shape or [min(max(16, lo), hi) if d == -1 else d for d, lo, hi in zip(self.shape, low, high)]
        return {"min": low, "opt": opt, "max": high}


@dataclass
class OutputSpec:
    name: str
    dtype: str | None = None
    shape: list[int] | None = None


@dataclass
class SourceSpec:
    kind: str  # module | torchscript | onnx | huggingface
    value: str  # "pkg.mod:callable" or a resolved file (huggingface: folder) path
    weights: Path | None = None
    folder: Any = None  # huggingface: builder/huggingface/folder.py Folder (its task, labels, limits)

    @property
    def path(self) -> Path | None:
        return Path(self.value) if self.kind in ("torchscript", "onnx") else None

    @property
    def eager(self) -> bool:
        """The build holds a PyTorch module (source.module, or a Hugging Face folder transformers loaded)."""
        return self.kind in ("module", "huggingface")


@dataclass
class DataSpec:
    calibration: Path | None = None
    validation: Path | None = None
    training: Path | str | None = None  # .npz (inputs + labels) or 'module:function' (builder/spec/compression.py)


@dataclass
class DeploySpec:
    target: str = "cpu"
    target_given: str | None = None  # as the spec wrote it (an old name: spec.target_note says what it now is)
    instances: int = 1
    instances_auto: bool = True  # instances not set in the spec: the build sizes serving to the host
    dynamic_batching: bool = True
    max_queue_delay_microseconds: int = 0
    max_queue_delay_auto: bool = True  # not set in the spec: sized from the benchmark (host.size_queue_delay)
    preferred_batch_sizes: list[int] = field(default_factory=list)
    warmup: bool = True
    publish_variants: bool = False
    ragged_batching: bool = True  # a text pipeline's ONNX model step batches texts of any length (huggingface/ragged.py)
    version_policy: str = "latest"  # latest | all
    # NaN/Inf in a float input (python backend): count them on Triton's metrics endpoint and serve
    # (count), or refuse the request with an error naming the input (reject)
    non_finite_inputs: str = "count"
    onnx_tensorrt: dict[str, Any] | None = None  # target gpu: onnxruntime's TensorRT accelerator (see below)
    instance_kind: str = "auto"  # gpu on target python: the python backend runs TorchScript on a GPU
    # drift and NaN/Inf monitoring: None = the python backend's model.py monitors itself, a standard folder is
    # served as it is; True = a standard folder is served behind an ensemble with a python monitor step
    # (builder/repository/monitored.py); False = no drift gauges (the python backend's drift off)
    monitor: bool | None = None

    def kind_for(self, target: str) -> str:  # the pairing is checked by variants.resolve_variants
        return "KIND_GPU" if target == "gpu" or self.instance_kind == "gpu" else "KIND_CPU"


@dataclass
class OnnxSpec:
    exporter: str = "auto"  # auto (dynamo, legacy on failure) | dynamo | legacy
    opset: int | None = None


CALIBRATION_METHODS = ("minmax", "entropy", "percentile")


@dataclass
class QuantizationSpec:
    calibration_method: str = "minmax"  # minmax | entropy | percentile (static INT8)
    calibration_samples: int = 128  # samples fed to the calibrator (fewer if the data has fewer)
    search: str = "auto"  # auto (search when the default recipe fails or is stably slower than FP32) | on | off
    search_seconds: float = 120.0  # time budget of the recipe search (builder/optimise/quant_search.py)


@dataclass
class ModelSpec:
    name: str
    source: SourceSpec
    inputs: list[TensorSpec]
    outputs: list[OutputSpec]
    max_batch_size: int = 0
    version: int | None = None
    data: DataSpec = field(default_factory=DataSpec)
    variants: list[str] | None = None
    objective: str = "throughput"
    tradeoff: dict[str, float] = field(default_factory=lambda: dict(TRADEOFF_DEFAULTS))  # objective tradeoff
    verify: VerifySpec = field(default_factory=VerifySpec)
    deploy: DeploySpec = field(default_factory=DeploySpec)
    onnx: OnnxSpec = field(default_factory=OnnxSpec)
    quantization: QuantizationSpec = field(default_factory=QuantizationSpec)
    compression: CompressionSpec = field(default_factory=CompressionSpec)
    spec_path: Path | None = None
    preprocess: StepSpec | None = None  # your own steps around the model (builder/spec/steps.py)
    postprocess: StepSpec | None = None

    @property
    def spec_dir(self) -> Path:
        return self.spec_path.parent if self.spec_path else Path.cwd()

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    @property
    def has_dynamic_dims(self) -> bool:
        return any(t.dynamic for t in self.inputs)


# --------------------------------------------------------------------------------------------
# parsing


_TOP_KEYS = (
    "name", "version", "source", "inputs", "outputs", "max_batch_size", "data", "variants",
    "objective", "verify", "deploy", "onnx", "quantization", "compression", "preprocess", "postprocess",
)
_SOURCE_KEYS = ("module", "torchscript", "onnx", "weights") + HF_KEYS[1:] + HF_KEYS[:1]
_INPUT_KEYS = ("name", "dtype", "shape", "value_range", "values", "kind", "min_shape", "opt_shape", "max_shape")
_OUTPUT_KEYS = ("name", "dtype", "shape")
_DATA_KEYS = ("calibration", "validation", "training")
_DEPLOY_KEYS = (
    "target", "instances", "dynamic_batching", "max_queue_delay_microseconds",
    "preferred_batch_sizes", "warmup", "publish_variants", "ragged_batching", "version_policy", "onnx_tensorrt", "non_finite_inputs",
    "instance_kind", "monitor",
)
NON_FINITE_POLICIES = ("count", "reject")
INSTANCE_KINDS = ("auto", "cpu", "gpu")
_ONNX_KEYS = ("exporter", "opset")
_QUANTIZATION_KEYS = ("calibration_method", "calibration_samples", "search", "search_seconds")


def load_spec(path: str | Path) -> ModelSpec:
    """Read and validate a spec file. Raises UserInputError naming the field on any problem."""
    spec_path = Path(path).resolve()
    if not spec_path.is_file():
        raise UserInputError(f"spec file not found: {path}; pass the path of a YAML model spec")
    return parse_spec(read_yaml(spec_path), spec_path)


def parse_spec(data: Any, spec_path: Path | None = None) -> ModelSpec:
    """The spec from its YAML data; every unknown key of every section is reported together."""
    with collect_unknown_keys(spec_path.name if spec_path else "spec"):
        return _parse_spec(data, spec_path)


def _parse_spec(data: Any, spec_path: Path | None) -> ModelSpec:
    origin = spec_path.name if spec_path else "spec"
    base = spec_path.parent if spec_path else Path.cwd()
    top = _Fields(data, "", _TOP_KEYS, origin)

    name = validate_model_name(top.require("name", "give the Triton model name, e.g. name: digits_cnn"),
                               f"{origin}: field 'name'")
    version = top.integer("version", None, minimum=1)
    source = _parse_source(top.require("source", "give exactly one of module / torchscript / onnx / huggingface"),
                           origin, base)
    max_batch_size = top.integer("max_batch_size", HF_MAX_BATCH_SIZE if source.folder else 0, minimum=0)
    if source.folder is not None:
        refuse_tensor_lists(top, source.folder)
        derived_inputs, derived_outputs = derived_tensors(source.folder)
        inputs = _parse_inputs(derived_inputs, origin)
        outputs = _parse_outputs([{"name": o["name"]} for o in derived_outputs], origin)
    else:
        inputs = _parse_inputs(top.require("inputs", "list the model inputs, e.g. - {name: x, dtype: float32, "
                                           "shape: [3]}"), origin)
        outputs = _parse_outputs(top.require("outputs", "list the model outputs, e.g. - {name: logits}"), origin)
    names = [t.name for t in inputs] + [o.name for o in outputs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise top.error(f"tensor name(s) used more than once across inputs/outputs: {', '.join(duplicates)}",
                        "outputs")

    data_spec = DataSpec()
    if top.get("data") is not None:
        d = _Fields(top.get("data"), "data", _DATA_KEYS, origin)
        data_spec = DataSpec(calibration=d.path("calibration", base), validation=d.path("validation", base),
                             training=parse_training(d, base))

    variants = top.get("variants")
    if variants is not None and (not isinstance(variants, list) or not all(isinstance(v, str) for v in variants)
                                 or not variants):
        raise top.error(f"must be a non-empty list of variant names, got {variants!r}", "variants")

    objective, tradeoff = _parse_objective(top, origin)
    spec = ModelSpec(
        name=name,
        version=version,
        source=source,
        inputs=inputs,
        outputs=outputs,
        max_batch_size=max_batch_size,
        data=data_spec,
        variants=variants,
        objective=objective,
        tradeoff=tradeoff,
        verify=parse_verify(top.get("verify"), origin, max_batch_size),
        deploy=_parse_deploy(top.get("deploy"), origin, max_batch_size),
        onnx=_parse_onnx(top.get("onnx"), origin),
        quantization=_parse_quantization(top.get("quantization"), origin),
        compression=parse_compression(top.get("compression"), origin),
        spec_path=spec_path,
        preprocess=parse_step(top.get("preprocess"), "preprocess", origin, base, _Fields),
        postprocess=parse_step(top.get("postprocess"), "postprocess", origin, base, _Fields),
    )
    check_steps(spec, top)
    check_dynamic_sizes(spec, origin)
    return spec


def _parse_source(raw: Any, origin: str, base: Path) -> SourceSpec:
    f = _Fields(raw, "source", _SOURCE_KEYS, origin)
    given = [k for k in ("module", "torchscript", "onnx", "huggingface") if f.get(k) is not None]
    if len(given) != 1:
        raise f.error(f"give exactly one of module / torchscript / onnx / huggingface (got {', '.join(given) or 'none'})")
    kind = given[0]
    if kind == "huggingface":
        folder = parse_huggingface(f, origin, base)
        return SourceSpec(kind="huggingface", value=str(folder.path), folder=folder)
    for key in HF_KEYS[1:]:
        if f.get(key) is not None:
            raise f.error(f"only applies to source.huggingface; remove it for a {kind} source", key)
    weights = f.path("weights", base)
    if kind == "module":
        ref = f.get("module")
        if not isinstance(ref, str) or not MODULE_PATTERN.match(ref):
            raise f.error(f"{ref!r} is not 'python.module:callable', e.g. model:build", "module")
        return SourceSpec(kind="module", value=ref, weights=weights)
    if weights is not None:
        raise f.error(f"weights only apply to source.module; a {kind} file carries its own weights", "weights")
    return SourceSpec(kind=kind, value=str(f.path(kind, base)))


def _parse_shape(f: _Fields, key: str, allow_dynamic: bool, required: bool) -> list[int] | None:
    value = f.get(key)
    if value is None:
        if required:
            raise f.error("missing; give the per-sample shape WITHOUT the batch dimension, e.g. [1, 8, 8]", key)
        return None
    shape = f.int_list(key, minimum=1, allow_dynamic=allow_dynamic)
    return shape


def _parse_inputs(raw: Any, origin: str) -> list[TensorSpec]:
    if not isinstance(raw, list) or not raw:
        raise UserInputError(f"{origin}: field 'inputs': must be a non-empty list of tensors")
    result = []
    for i, item in enumerate(raw):
        f = _Fields(item, f"inputs[{i}]", _INPUT_KEYS, origin)
        name = f.require("name", "give the input's name as the model's forward() calls it")
        validate_tensor_name(name, f"{origin}: field 'inputs[{i}].name'")
        dtype = f.choice("dtype", "float32", tuple(TRITON_DTYPES))
        shape = _parse_shape(f, "shape", allow_dynamic=True, required=True)
        tensor = TensorSpec(name=name, dtype=dtype, shape=shape)
        for key in ("min_shape", "opt_shape", "max_shape"):
            concrete = _parse_shape(f, key, allow_dynamic=False, required=False)
            if concrete is not None:
                mismatch = len(concrete) != len(shape) or any(
                    s != -1 and c != s for c, s in zip(concrete, shape))
                if mismatch:
                    raise f.error(f"{concrete} does not fit shape {shape}: same rank, fixed dims equal", key)
            setattr(tensor, key, concrete)
        if f.get("value_range") is not None:
            vr = f.get("value_range")
            if (not isinstance(vr, list) or len(vr) != 2 or not all(is_number(v) for v in vr)
                    or vr[0] >= vr[1]):
                raise f.error(f"must be [low, high], finite numbers with low < high, got {vr!r}", "value_range")
            tensor.value_range = (vr[0], vr[1])
        parse_input_rule(f, tensor)
        check_input_ranges(f, tensor)
        result.append(tensor)
    return result


def _parse_outputs(raw: Any, origin: str) -> list[OutputSpec]:
    if not isinstance(raw, list) or not raw:
        raise UserInputError(f"{origin}: field 'outputs': must be a non-empty list, e.g. - {{name: logits}}")
    result = []
    for i, item in enumerate(raw):
        f = _Fields(item, f"outputs[{i}]", _OUTPUT_KEYS, origin)
        name = f.require("name", "give the output's name")
        validate_tensor_name(name, f"{origin}: field 'outputs[{i}].name'")
        dtype = f.choice("dtype", None, (None, *TRITON_DTYPES)) if f.get("dtype") is not None else None
        result.append(OutputSpec(name=name, dtype=dtype, shape=_parse_shape(f, "shape", True, False)))
    return result


def _parse_deploy(raw: Any, origin: str, max_batch_size: int) -> DeploySpec:
    if raw is None:
        return DeploySpec(dynamic_batching=max_batch_size > 0)
    f = _Fields(raw, "deploy", _DEPLOY_KEYS, origin)
    preferred = f.int_list("preferred_batch_sizes") or []
    if preferred and (max_batch_size == 0 or max(preferred) > max_batch_size):
        raise f.error(f"{preferred} must be <= max_batch_size ({max_batch_size})", "preferred_batch_sizes")
    dynamic_batching = f.boolean("dynamic_batching", max_batch_size > 0)
    if dynamic_batching and max_batch_size == 0:
        raise f.error("needs max_batch_size > 0 (the model must have a batch dimension)", "dynamic_batching")
    return DeploySpec(
        target=canonical_target(f.choice("target", "cpu", (*TARGETS, *TARGET_ALIASES))),
        target_given=f.get("target"),
        instances=f.integer("instances", 1, minimum=1),
        instances_auto=f.get("instances") is None,
        dynamic_batching=dynamic_batching,
        max_queue_delay_microseconds=f.integer("max_queue_delay_microseconds", 0, minimum=0),
        max_queue_delay_auto=f.get("max_queue_delay_microseconds") is None,
        preferred_batch_sizes=preferred,
        warmup=f.boolean("warmup", True),
        publish_variants=f.boolean("publish_variants", False),
        ragged_batching=f.boolean("ragged_batching", True),
        version_policy=f.choice("version_policy", "latest", ("latest", "all")),
        non_finite_inputs=f.choice("non_finite_inputs", "count", NON_FINITE_POLICIES),
        onnx_tensorrt=_parse_onnx_tensorrt(f.get("onnx_tensorrt"), origin),
        instance_kind=f.choice("instance_kind", "auto", INSTANCE_KINDS),
        monitor=f.boolean("monitor", False) if f.get("monitor") is not None else None,
    )


# deploy.onnx_tensorrt: Triton's onnxruntime TensorRT accelerator parameters (their Triton names),
# plus `profiles` (ours): render trt_profile_*_shapes from the same profiles as the TensorRT plans.
_ONNX_TENSORRT_KEYS = ("precision_mode", "max_workspace_size_bytes", "trt_engine_cache_enable",
                       "trt_engine_cache_path", "trt_timing_cache_enable", "trt_builder_optimization_level",
                       "trt_cuda_graph_enable", "profiles")


def _parse_onnx_tensorrt(raw: Any, origin: str) -> dict[str, Any] | None:
    if raw is None:
        return None
    f = _Fields(raw, "deploy.onnx_tensorrt", _ONNX_TENSORRT_KEYS, origin)
    settings: dict[str, Any] = {"precision_mode": f.choice("precision_mode", "FP16", ("FP32", "FP16", "INT8"))}
    for key in ("max_workspace_size_bytes", "trt_builder_optimization_level"):
        value = f.integer(key, None, minimum=1 if key == "max_workspace_size_bytes" else 0)
        if value is not None:
            settings[key] = value
    if settings.get("trt_builder_optimization_level", 0) > 5:
        raise f.error("must be 0..5", "trt_builder_optimization_level")
    for key in ("trt_engine_cache_enable", "trt_timing_cache_enable", "trt_cuda_graph_enable", "profiles"):
        if f.get(key) is not None:
            settings[key] = f.boolean(key, False)
    path = f.get("trt_engine_cache_path")
    if path is not None:
        if not isinstance(path, str) or not path.strip():
            raise f.error(f"must be a folder path on the Triton host, got {path!r}", "trt_engine_cache_path")
        settings["trt_engine_cache_path"] = path
    return settings


def _parse_onnx(raw: Any, origin: str) -> OnnxSpec:
    if raw is None:
        return OnnxSpec()
    f = _Fields(raw, "onnx", _ONNX_KEYS, origin)
    return OnnxSpec(exporter=f.choice("exporter", "auto", ("auto", "dynamo", "legacy")),
                    opset=f.integer("opset", None, minimum=7))


def _parse_quantization(raw: Any, origin: str) -> QuantizationSpec:
    if raw is None:
        return QuantizationSpec()
    f = _Fields(raw, "quantization", _QUANTIZATION_KEYS, origin)
    search = f.get("search", "auto")
    search = {True: "on", False: "off"}.get(search, search) if isinstance(search, bool) else search
    if search not in ("auto", "on", "off"):
        raise f.error(f"{search!r} is not supported; use auto (search only when the default recipe fails "
                      "verification or is stably slower than FP32), true (always search) or false (default recipe "
                      "only)", "search")
    seconds = f.get("search_seconds", 120)
    if not is_number(seconds) or seconds <= 0:
        raise f.error(f"must be a finite number of seconds > 0 (the search's time budget, e.g. 120), got {seconds!r}",
                      "search_seconds")
    return QuantizationSpec(calibration_method=f.choice("calibration_method", "minmax", CALIBRATION_METHODS),
                            calibration_samples=f.integer("calibration_samples", 128, minimum=1),
                            search=search, search_seconds=float(seconds))


def _parse_objective(top: _Fields, origin: str) -> tuple[str, dict[str, float]]:
    """``objective: throughput | latency | tradeoff`` or the weights of J as a mapping
    e.g. ``{alpha: 1.0, beta: 0.5}`` (objective tradeoff; a missing weight takes TRADEOFF_DEFAULTS')."""
    raw = top.get("objective", "throughput")
    if not isinstance(raw, dict):
        return top.choice("objective", "throughput", OBJECTIVES), dict(TRADEOFF_DEFAULTS)
    f = _Fields(raw, "objective", tuple(TRADEOFF_DEFAULTS), origin)
    weights = {}
    for key, default in TRADEOFF_DEFAULTS.items():
        value = f.get(key, default)
        if not is_number(value) or value < 0:
            raise f.error(f"must be a finite number >= 0 (J = alpha*accuracy - beta*latency_ms - gamma*memory_mb), "
                          f"got {value!r}", key)
        weights[key] = float(value)
    return "tradeoff", weights
