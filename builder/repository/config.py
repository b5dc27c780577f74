"""The Triton model config as a validated object, rendered to text from templates/config/ and
checked with Triton's own protobuf schema before anything is written.

Usage::

    config = ModelConfig(name="digits_cnn", backend="python", max_batch_size=64,
                         inputs=[TensorConfig("image", "TYPE_FP32", [1, 8, 8])],
                         outputs=[TensorConfig("logits", "TYPE_FP32", [10])])
    text = render_config(config)          # raises BuilderError if Triton's schema rejects it
    parsed = parse_config(text)           # a tritonclient model_config_pb2.ModelConfig
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from builder.core import assets
from builder.core.errors import BuilderError, InternalError, UserInputError, unknown_choice
from builder.spec.fields import TENSOR_NAME_PATTERN
from builder.spec.model import NAME_PATTERN, TRITON_DTYPES

INSTANCE_KINDS = ("KIND_CPU", "KIND_GPU", "KIND_AUTO")
# python backend parameter: the scalars of a model without a batch dimension (names, comma-separated)
SCALAR_TENSORS = "scalar_tensors"


@dataclass(frozen=True)
class BackendInfo:
    name: str  # the key users and metadata use
    template: str
    model_filename: str
    formats: tuple[str, ...]
    embedded: bool  # the embedded (nvidia-pytriton) tritonserver has this backend itself
    triton_backend: str  # the backend library Triton needs
    standin: bool = False  # the embedded server serves it through a Python-based stand-in (builder/serving/install.py)


BACKENDS: dict[str, BackendInfo] = {}


def register_backend(info: BackendInfo) -> BackendInfo:
    BACKENDS[info.name] = info
    return info


register_backend(BackendInfo("onnxruntime_onnx", "onnxruntime_onnx.pbtxt.j2", "model.onnx", ("onnx",), False, "onnxruntime",
                             standin=True))
register_backend(BackendInfo("pytorch_libtorch", "pytorch_libtorch.pbtxt.j2", "model.pt", ("torchscript",), False, "pytorch",
                             standin=True))
register_backend(BackendInfo("tensorrt_plan", "tensorrt_plan.pbtxt.j2", "model.plan", ("plan",), False, "tensorrt"))
register_backend(BackendInfo("openvino", "openvino.pbtxt.j2", "model.xml", ("openvino",), False, "openvino",
                             standin=True))
register_backend(BackendInfo("python", "python.pbtxt.j2", "model.py", ("onnx", "torchscript", "openvino"), True, "python"))


#: the parameter that sets intra-op threads per instance, as each backend reads it (the python backend's
#: model.py and the stand-ins: intra_op_threads; Triton's C++ backends: their own names)
THREAD_PARAMETERS = {"python": "intra_op_threads", "onnxruntime_onnx": "intra_op_thread_count",
                     "pytorch_libtorch": "INTRA_OP_THREAD_COUNT", "openvino": "INFERENCE_NUM_THREADS"}


def thread_parameter(parameters) -> str | None:
    """Which of THREAD_PARAMETERS a config's ``parameters`` (a dict or a protobuf map) sets, or None."""
    return next((key for key in THREAD_PARAMETERS.values() if key in parameters), None)


def backend_info(name: str) -> BackendInfo:
    if name not in BACKENDS:
        raise unknown_choice("backend", name, list(BACKENDS),
                             "add a template under templates/config/ and register_backend(BackendInfo(...)) "
                             "in builder/repository/config.py")
    return BACKENDS[name]


def backend_for(target: str, fmt: str) -> str:
    """Which backend serves a variant of this format on this target."""
    if target == "python":
        if fmt not in BACKENDS["python"].formats:
            raise UserInputError(f"target python serves ONNX, TorchScript and OpenVINO IR only, not '{fmt}'; "
                                 "use target gpu for TensorRT plans")
        return "python"
    native = [b.name for b in BACKENDS.values() if fmt in b.formats and not b.embedded]
    if not native:
        raise UserInputError(f"no Triton backend serves format '{fmt}'")
    return native[0]


@dataclass
class TensorConfig:
    name: str
    data_type: str
    dims: list[int]
    reshape: list[int] | None = None  # what the model sees; [] = a scalar per sample (dims [1])
    scalar: bool = False  # the model's tensor is one scalar per sample (spec shape [])
    ragged: bool = False  # allow_ragged_batch: requests of different lengths batch (builder/huggingface/ragged.py)

    @classmethod
    def per_sample(cls, name: str, data_type: str, shape: list[int], batching: bool = True) -> "TensorConfig":
        """Triton's dims cannot be empty: a scalar per sample is dims [1] with reshape [] (Triton's
        convention), so clients send and receive [batch, 1] while the model sees [batch]. Without a batch
        dimension Triton refuses an empty reshape ("scalar tensors are not supported"): the scalar is
        dims [1] with no reshape, and the python backend's model.py hands the model a 0-d array
        (parameter scalar_tensors, set by ModelConfig); no other backend can serve it (ModelConfig refuses)."""
        if not shape:
            return cls(name, data_type, [1], reshape=[] if batching else None, scalar=True)
        return cls(name, data_type, list(shape))


@dataclass
class BatchInput:
    """A tensor Triton's backend makes for each batch (config ``batch_input``), e.g. BATCH_ITEM_SHAPE: each
    batched row's shape without the batch dimension, which a graph taking ragged inputs needs to undo them."""
    kind: str
    target_name: str
    data_type: str
    source_input: str


@dataclass
class DynamicBatching:
    max_queue_delay_microseconds: int = 0
    preferred_batch_size: list[int] = field(default_factory=list)


@dataclass
class InstanceGroup:
    kind: str = "KIND_CPU"
    count: int = 1
    gpus: list[int] = field(default_factory=list)


@dataclass
class WarmupInput:
    """Warmed up with one reference sample (``data_file``: Triton's input_data_file in the model folder's
    warmup/, written by publish: warmup_data.py), else zeros (zero_data); never Triton's random_data: random
    bytes make floats up to ~3e38, NaN and inf, which a dynamically quantized model refuses (min > max) and the
    server then fails to start; random integer ids may be out of range."""
    name: str
    data_type: str
    dims: list[int]
    data_file: str | None = None  # a file name under <model>/warmup/


@dataclass
class Warmup:
    name: str
    batch_size: int
    inputs: list[WarmupInput]


@dataclass
class ModelConfig:
    name: str
    backend: str
    max_batch_size: int
    inputs: list[TensorConfig]
    outputs: list[TensorConfig]
    dynamic_batching: DynamicBatching | None = None
    instance_groups: list[InstanceGroup] = field(default_factory=lambda: [InstanceGroup()])
    version_policy: str = "latest"
    warmups: list[Warmup] = field(default_factory=list)
    parameters: dict[str, str] = field(default_factory=dict)
    optimization: dict[str, Any] = field(default_factory=dict)
    batch_inputs: list[BatchInput] = field(default_factory=list)

    def __post_init__(self) -> None:
        problems = []
        if not NAME_PATTERN.match(self.name or ""):
            problems.append(f"name {self.name!r}: use letters, digits, '_' and '-' only")
        backend_info(self.backend)
        if self.max_batch_size < 0:
            problems.append("max_batch_size must be >= 0")
        if not self.inputs or not self.outputs:
            problems.append("at least one input and one output are needed")
        valid_types = set(TRITON_DTYPES.values()) | {"TYPE_STRING"}  # strings: the pipelines' text (BYTES)
        for t in (*self.inputs, *self.outputs):
            if not TENSOR_NAME_PATTERN.match(t.name):
                problems.append(f"tensor name {t.name!r}: use letters, digits, '_', '-', '.' and ':' only")
            if t.data_type not in valid_types:
                problems.append(f"tensor {t.name}: data_type {t.data_type} is not one of {sorted(valid_types)}")
            if not t.dims or any(d == 0 or d < -1 for d in t.dims):
                problems.append(f"tensor {t.name}: dims {t.dims} must be non-empty, each > 0 or -1")
            if self.max_batch_size == 0 and t.reshape is not None and not t.reshape:
                problems.append(f"tensor {t.name}: reshape [] without a batch dimension (max_batch_size 0) is "
                                "refused by Triton; make it with TensorConfig.per_sample(..., batching=False)")
        self._serve_unbatched_scalars()
        if self.dynamic_batching is not None:
            if self.max_batch_size == 0:
                problems.append("dynamic_batching needs max_batch_size > 0")
            too_big = [s for s in self.dynamic_batching.preferred_batch_size if s > self.max_batch_size or s < 1]
            if too_big:
                problems.append(f"preferred_batch_size {too_big} must be within 1..max_batch_size")
            if self.dynamic_batching.max_queue_delay_microseconds < 0:
                problems.append("max_queue_delay_microseconds must be >= 0")
        for g in self.instance_groups:
            if g.kind not in INSTANCE_KINDS or g.count < 1:
                problems.append(f"instance_group {g}: kind in {INSTANCE_KINDS}, count >= 1")
        if self.version_policy not in ("latest", "all"):
            problems.append("version_policy must be latest or all")
        ragged = [t.name for t in self.inputs if t.ragged]
        if ragged and (self.dynamic_batching is None or self.max_batch_size == 0):
            problems.append(f"ragged inputs {ragged} need dynamic_batching and max_batch_size > 0")
        names = {t.name for t in self.inputs}
        for b in self.batch_inputs:
            if b.source_input not in names or b.target_name in names:
                problems.append(f"batch_input {b.target_name}: source_input must be an input and target_name not one")
        for w in self.warmups:
            if any(d < 1 for i in w.inputs for d in i.dims):
                problems.append(f"warmup {w.name}: dims must be concrete (no -1)")
        if problems:
            raise InternalError(f"invalid model config for '{self.name}': " + "; ".join(problems))

    def _serve_unbatched_scalars(self) -> None:
        """A scalar of a model without a batch dimension travels as dims [1] with no reshape (Triton's rule):
        the python backend's model.py reads their names from the parameter scalar_tensors and gives the
        model a 0-d array (and its 0-d answer back as [1]). Triton's onnxruntime, libtorch, openvino and
        tensorrt backends pass dims [1] to the model as they are, which it refuses: refused here, before
        anything is written, naming the tensor and the fixes."""
        if self.max_batch_size > 0:
            return
        scalars = [(kind, t.name) for kind, tensors in (("inputs", self.inputs), ("outputs", self.outputs))
                   for t in tensors if t.scalar and t.reshape is None]
        if not scalars:
            return
        if self.backend == "python":
            self.parameters = {**self.parameters, SCALAR_TENSORS: ",".join(name for _, name in scalars)}
            return
        kind, name = scalars[0]
        listed = ", ".join(f"{k[:-1]} '{n}'" for k, n in scalars)
        raise UserInputError(
            f"field '{kind}': {listed} {'is a scalar' if len(scalars) == 1 else 'are scalars'} (shape []) and "
            f"max_batch_size is 0: Triton's {backend_info(self.backend).triton_backend} backend cannot serve a "
            "scalar without a batch dimension (its dims cannot be empty, and Triton refuses reshape [] for a model "
            "that does not batch). Fix: deploy.target python (the python backend serves it as dims [1]), or "
            f"max_batch_size > 0, or make the model take/return '{name}' as shape [1]")

    @property
    def default_model_filename(self) -> str:
        return backend_info(self.backend).model_filename


def _pbstr(value: Any) -> str:
    """Escape a value for a protobuf text string literal."""
    text = str(value)
    if re.search(r"[\x00-\x1f]", text):
        raise BuilderError(f"control characters are not allowed in config values: {text!r}")
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _environment():
    import jinja2

    loader = jinja2.FileSystemLoader(str(assets.templates_dir()))
    env = jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=False, autoescape=False)
    env.filters["pbstr"] = _pbstr
    return env


def render_config(config: ModelConfig) -> str:
    return render_template(backend_info(config.backend).template, config)


def render_template(template_name: str, config: Any) -> str:
    """templates/config/``template_name`` rendered with ``config`` as ``c``, checked with Triton's schema."""
    template = _environment().get_template(f"config/{template_name}")
    text = template.render(c=config, template_name=template_name)
    text = "\n".join(line.rstrip() for line in text.splitlines() if line.strip()) + "\n"
    parsed = parse_config(text)
    if parsed.name != config.name:
        raise BuilderError(f"rendered config name {parsed.name!r} != {config.name!r}")
    return text


def parse_config(text: str, where: str | None = None):
    """Parse config text with Triton's own schema (tritonclient's model_config_pb2).

    ``where`` names a file the user supplied: its failure is then a UserInputError naming it; without
    it the text is ours (just rendered) and a failure is a BuilderError."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    message = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        if where is not None:
            raise UserInputError(f"{where} does not parse with Triton's schema: {exc}") from None
        raise BuilderError(f"config does not parse with Triton's schema: {exc}") from None
    return message


def config_as_dict(text: str, where: str | None = None) -> dict[str, Any]:
    """The config as JSON-like dict; ``where`` as parse_config's (a user's file is named when it fails)."""
    from google.protobuf import json_format
    return json_format.MessageToDict(parse_config(text, where), preserving_proto_field_name=True)
