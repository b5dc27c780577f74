"""config.pbtxt rendering: golden files per backend, and Triton's own schema parses each."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.core.errors import BuilderError, UserInputError
from builder.repository.config import (BACKENDS, DynamicBatching, InstanceGroup, ModelConfig, TensorConfig, Warmup,
                                       WarmupInput, backend_for, backend_info, config_as_dict, parse_config,
                                       render_config)

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
OPENVINO_PARAMETERS = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": "2"}


def sample_config(backend: str, **overrides) -> ModelConfig:
    fields = dict(
        name="digits_cnn", backend=backend, max_batch_size=64,
        inputs=[TensorConfig("image", "TYPE_FP32", [1, 8, 8]), TensorConfig("ids", "TYPE_INT64", [-1])],
        outputs=[TensorConfig("logits", "TYPE_FP32", [10])],
        dynamic_batching=DynamicBatching(100, [8, 16]),
        instance_groups=[InstanceGroup("KIND_GPU" if backend == "tensorrt_plan" else "KIND_CPU", 2)],
        warmups=[Warmup("warmup_batch1", 1, [WarmupInput("image", "TYPE_FP32", [1, 8, 8]),
                                             WarmupInput("ids", "TYPE_INT64", [16])])],
        parameters=OPENVINO_PARAMETERS if backend == "openvino" else
        {"model_file": "model.onnx", "runtime": "onnxruntime"} if backend == "python" else {},
    )
    fields.update(overrides)
    return ModelConfig(**fields)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_rendered_config_matches_golden_file(backend):
    text = render_config(sample_config(backend))
    golden = GOLDEN / f"config_{backend}.pbtxt"
    assert text == golden.read_text(), f"rendered config differs from {golden}"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_rendered_config_parses_with_triton_schema(backend):
    parsed = parse_config(render_config(sample_config(backend)))
    assert parsed.name == "digits_cnn"
    assert parsed.max_batch_size == 64
    assert [i.name for i in parsed.input] == ["image", "ids"]
    assert list(parsed.input[1].dims) == [-1]
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 100
    assert list(parsed.dynamic_batching.preferred_batch_size) == [8, 16]
    assert parsed.instance_group[0].count == 2
    # zeros for every input: Triton's random_data makes floats up to ~3e38 and NaN, which a dynamically
    # quantized model refuses in its warm-up, and then the server does not start
    assert all(i.zero_data and not i.random_data for i in parsed.model_warmup[0].inputs.values())
    assert parsed.version_policy.latest.num_versions == 1
    if backend == "python":
        assert parsed.backend == "python" and parsed.parameters["runtime"].string_value == "onnxruntime"
    elif backend == "openvino":  # Triton's openvino backend: a backend, not a platform; reads model.xml + model.bin
        assert parsed.backend == "openvino" and not parsed.platform
        assert parsed.default_model_filename == "model.xml"
        assert {k: v.string_value for k, v in parsed.parameters.items()} == OPENVINO_PARAMETERS
    else:
        assert parsed.platform == backend and parsed.default_model_filename == backend_info(backend).model_filename


def test_gpu_optimisations_render_and_parse():
    onnx = parse_config(render_config(sample_config(
        "onnxruntime_onnx", optimization={"trt_accelerator": {"precision_mode": "FP16"}})))
    accelerator = onnx.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP16"
    plan = parse_config(render_config(sample_config("tensorrt_plan", optimization={"cuda_graphs": True})))
    assert plan.optimization.cuda.graphs is True


def test_no_batching_config_has_no_dynamic_batching():
    config = sample_config("python", max_batch_size=0, dynamic_batching=None)
    assert "dynamic_batching" not in config_as_dict(render_config(config))


def test_quotes_in_parameter_values_are_escaped_not_injected():
    text = render_config(sample_config("python", parameters={"note": 'a" } name: "evil'}))
    parsed = parse_config(text)
    assert parsed.name == "digits_cnn"
    assert parsed.parameters["note"].string_value == 'a" } name: "evil'


@pytest.mark.parametrize("overrides, message", [
    ({"name": 'x"y'}, r"name 'x\"y'"),
    ({"dynamic_batching": DynamicBatching(0, [128])}, r"preferred_batch_size \[128\]"),
    ({"max_batch_size": 0}, r"dynamic_batching needs max_batch_size > 0"),
    ({"inputs": [TensorConfig("image", "TYPE_FP99", [1])]}, r"data_type TYPE_FP99"),
    ({"inputs": [TensorConfig("image", "TYPE_FP32", [])]}, r"dims \[\] must be non-empty"),
    ({"instance_groups": [InstanceGroup("KIND_TPU", 1)]}, r"instance_group"),
])
def test_invalid_configs_are_refused_before_rendering(overrides, message):
    with pytest.raises(BuilderError, match=message):
        sample_config("python", **overrides)


def test_unknown_backend_lists_supported_and_how_to_add():
    with pytest.raises(UserInputError, match=r"unknown backend 'tflite'; supported: onnxruntime_onnx, openvino, python, "
                                             r"pytorch_libtorch, tensorrt_plan. To add one: add a template"):
        backend_info("tflite")


def test_backend_choice_per_target():
    assert backend_for("python", "onnx") == "python"
    assert backend_for("python", "torchscript") == "python"
    assert backend_for("cpu", "onnx") == "onnxruntime_onnx"
    assert backend_for("gpu", "torchscript") == "pytorch_libtorch"
    assert backend_for("gpu", "plan") == "tensorrt_plan"
    assert backend_for("python", "openvino") == "python"  # model.py runs the IR
    assert backend_for("cpu", "openvino") == "openvino"
    with pytest.raises(UserInputError, match="target python serves ONNX, TorchScript and OpenVINO IR only"):
        backend_for("python", "plan")


PUBLISHED = [("onnx", "cpu", "onnxruntime_onnx"), ("torchscript", "cpu", "pytorch_libtorch"),
             ("openvino", "cpu", "openvino"), ("onnx", "python", "python")]


def _published(fmt: str, target: str) -> str:
    from builder.repository.publish import config_for
    from builder.spec.model import load_spec

    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "digits" / "spec.yaml")
    return render_config(config_for(spec, fmt, target, "digits_cnn", {"logits": ("float32", [10])}, sizing=(2, 3),
                                    queue_delay_us=100))


@pytest.mark.parametrize("fmt, target, backend", PUBLISHED)
def test_published_config_carries_the_backends_own_parameters(fmt, target, backend):
    """What a build publishes for each backend (sized 2 instances x 3 threads): the golden file, parsed with
    Triton's schema, with the thread count under the name that backend reads (THREAD_PARAMETERS)."""
    from builder.repository.config import THREAD_PARAMETERS

    text = _published(fmt, target)
    golden = GOLDEN / f"published_{backend}.pbtxt"
    assert text == golden.read_text(), f"published config differs from {golden}"
    parsed = parse_config(text)
    params = {k: v.string_value for k, v in parsed.parameters.items()}
    assert params[THREAD_PARAMETERS[backend]] == "3" and parsed.instance_group[0].count == 2
    assert [w.name for w in parsed.model_warmup] == ["warmup_batch1"]
    if backend == "onnxruntime_onnx":
        assert parsed.platform == "onnxruntime_onnx" and params == {"intra_op_thread_count": "3",
                                                                      "inter_op_thread_count": "1"}
    if backend == "pytorch_libtorch":
        assert parsed.platform == "pytorch_libtorch" and params == {"INFERENCE_MODE": "true",
                                                                      "INTRA_OP_THREAD_COUNT": "3"}
    if backend == "openvino":  # r24.10 reshapes the IR to max_batch_size: a smaller batch fails without padding
        assert params["ENABLE_BATCH_PADDING"] == "YES"
