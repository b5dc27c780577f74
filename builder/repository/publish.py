"""Turn a verified variant into a published model version: its config (decided here from the spec
and the variant), its files, its metadata and reference cases, all in one atomic publish.

Usage::

    config = config_for(spec, variant_format="onnx", target="embedded", name="digits_cnn",
                        output_signature={"logits": ("float32", [10])})
    published = publish_model(repository, config, files=[...], extra={...}, version=None)
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

from builder import assets
from builder.repository.config import (DynamicBatching, InstanceGroup, ModelConfig, TensorConfig, Warmup,
                                       WarmupInput, backend_for, backend_info, render_config)
from builder.tensorrt.gpu_config import gpu_optimization
from builder.repository.layout import publish_version
from builder.files import sha256_file
from builder.spec import TRITON_DTYPES, ModelSpec

RUNTIME_FOR_FORMAT = {"onnx": "onnxruntime", "torchscript": "torchscript"}


def config_for(spec: ModelSpec, variant_format: str, target: str, name: str,
               output_signature: dict[str, tuple[str, list[int]]], backend: str | None = None) -> ModelConfig:
    backend = backend or backend_for(target, variant_format)
    inputs = [TensorConfig(t.name, t.triton_dtype, list(t.shape)) for t in spec.inputs]
    outputs = [TensorConfig(o.name, TRITON_DTYPES[output_signature[o.name][0]], list(output_signature[o.name][1]))
               for o in spec.outputs]
    batching = None
    if spec.batching and spec.deploy.dynamic_batching:
        batching = DynamicBatching(spec.deploy.max_queue_delay_microseconds, list(spec.deploy.preferred_batch_sizes))
    kind = "KIND_GPU" if target == "gpu" else "KIND_CPU"
    warmups = []
    if spec.deploy.warmup:
        warmups.append(Warmup("warmup_batch1", 1, [
            WarmupInput(t.name, t.triton_dtype, t.profile_shapes()["opt"],
                        zero=not t.dtype.startswith("float")) for t in spec.inputs]))
    parameters = {}
    if backend == "python":
        parameters = {"model_file": _model_file_for(variant_format), "runtime": RUNTIME_FOR_FORMAT[variant_format],
                      "intra_op_threads": "1"}
    return ModelConfig(name=name, backend=backend, max_batch_size=spec.max_batch_size, inputs=inputs,
                       outputs=outputs, dynamic_batching=batching,
                       instance_groups=[InstanceGroup(kind, spec.deploy.instances)],
                       version_policy=spec.deploy.version_policy, warmups=warmups, parameters=parameters,
                       optimization=gpu_optimization(spec, backend, target))


def _model_file_for(variant_format: str) -> str:
    return {"onnx": "model.onnx", "torchscript": "model.pt", "plan": "model.plan"}[variant_format]


def publish_model(repository: Path, config: ModelConfig, model_files: list[Path], variant_format: str,
                  fill: Callable[[Path, int, dict[str, str]], None], version: int | None = None) -> dict[str, Any]:
    """Publish one version. ``fill(folder, version, file_hashes)`` writes metadata/reference/report
    into the staging folder after the model files are in place (``file_hashes``: name -> sha256)."""
    with publish_version(repository, config.name, version) as draft:
        model_name = _model_file_for(variant_format)
        for source in model_files:
            # the main file takes the backend's default name; companions keep their suffix (.data)
            suffix = source.name[len(model_files[0].name):]
            shutil.copyfile(source, draft.folder / (model_name + suffix))
        if config.backend == "python":
            shutil.copyfile(assets.python_backend_model(), draft.folder / "model.py")
            # drift.py is self-contained (numpy only): it travels with the python-backend model.py
            shutil.copyfile(assets.drift_module(), draft.folder / "drift.py")
        hashes = {p.name: sha256_file(p) for p in sorted(draft.folder.iterdir()) if p.is_file()}
        fill(draft.folder, draft.version, hashes)
        draft.config_text = render_config(config)
    return {"name": config.name, "version": draft.version, "path": str(draft.path), "backend": config.backend,
            "platform": backend_info(config.backend).name}
