"""Turn a verified variant into a published model version: its config (decided here from the spec
and the variant), its files, its metadata and reference cases, all in one atomic publish.

Usage::

    config = config_for(spec, variant_format="onnx", target="cpu", name="digits_cnn",
                        output_signature={"logits": ("float32", [10])})
    published = publish_model(repository, VersionDescription(name=..., config=config, ...))

builder/repository/description.py says what a description holds and how it is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import shutil
from pathlib import Path
from typing import Any, Iterator

from builder.core import assets
from builder.core.errors import UserInputError, VerificationError
from builder.core.files import sha256_file
from builder.repository.config import (DynamicBatching, InstanceGroup, ModelConfig, TensorConfig, Warmup, WarmupInput,
                                       backend_for, backend_info, render_config)
from builder.repository.description import FileContent, VersionDescription
from builder.repository.interface import interface_change
from builder.repository.layout import MODEL_FILES, Reservation, companion_name, publish_version
from builder.repository.metadata import write_metadata
from builder.repository.signing import SIGNED_CONFIG, sign_version
from builder.repository.warmup import warmup_failure
from builder.repository.warmup_data import with_reference_warmup
from builder.spec.model import TRITON_DTYPES, ModelSpec
from builder.tensorrt.gpu_config import gpu_optimization

RUNTIME_FOR_FORMAT = {"onnx": "onnxruntime", "torchscript": "torchscript", "openvino": "openvino"}


def config_for(spec: ModelSpec, variant_format: str, target: str, name: str,
               output_signature: dict[str, tuple[str, list[int]]], backend: str | None = None,
               sizing: tuple[int, int] | None = None, queue_delay_us: int | None = None) -> ModelConfig:
    """``sizing`` (instances, intra_op_threads), from builder/core/host.py serving_size, applies on a CPU
    target unless the spec sets deploy.instances itself; ``queue_delay_us`` (host.size_queue_delay) on
    a CPU target unless the spec sets deploy.max_queue_delay_microseconds."""
    backend = backend or backend_for(target, variant_format)
    kind = spec.deploy.kind_for(target)
    instances, threads = spec.deploy.instances, 1
    if sizing is not None and kind == "KIND_CPU" and spec.deploy.instances_auto:
        instances, threads = sizing
    inputs = [TensorConfig.per_sample(t.name, t.triton_dtype, list(t.shape), spec.batching) for t in spec.inputs]
    outputs = [TensorConfig.per_sample(o.name, TRITON_DTYPES[output_signature[o.name][0]],
                                       list(output_signature[o.name][1]), spec.batching) for o in spec.outputs]
    batching = None
    if spec.batching and spec.deploy.dynamic_batching:
        delay = spec.deploy.max_queue_delay_microseconds
        if queue_delay_us is not None and kind == "KIND_CPU" and spec.deploy.max_queue_delay_auto:
            delay = queue_delay_us
        batching = DynamicBatching(delay, list(spec.deploy.preferred_batch_sizes))
    warmups = []
    if spec.deploy.warmup:
        warmups.append(Warmup("warmup_batch1", 1, [
            WarmupInput(t.name, t.triton_dtype, t.profile_shapes()["opt"] or [1]) for t in spec.inputs]))
    parameters = {}
    if backend == "python":
        parameters = {"model_file": _model_file_for(variant_format), "runtime": RUNTIME_FOR_FORMAT[variant_format],
                      "intra_op_threads": str(threads), "non_finite_inputs": spec.deploy.non_finite_inputs,
                      **({"drift": "off"} if spec.deploy.monitor is False else {})}
    elif backend == "openvino":  # Triton's openvino backend: one synchronous request per instance
        parameters = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": str(threads)}
        if spec.max_batch_size:  # r24.10 reshapes the model to max_batch_size: without padding a smaller batch fails
            parameters["ENABLE_BATCH_PADDING"] = "YES"
    elif backend == "onnxruntime_onnx":  # the C++ onnxruntime backend's keys (sequential execution: one pool)
        parameters = {"intra_op_thread_count": str(threads), "inter_op_thread_count": "1"}
    elif backend == "pytorch_libtorch":  # libtorch: inference mode, intra-op threads (inter-op is process-wide)
        parameters = {"INFERENCE_MODE": "true", "INTRA_OP_THREAD_COUNT": str(threads)}
    return ModelConfig(name=name, backend=backend, max_batch_size=spec.max_batch_size, inputs=inputs,
                       outputs=outputs, dynamic_batching=batching,
                       instance_groups=[InstanceGroup(kind, instances)],
                       version_policy=spec.deploy.version_policy, warmups=warmups, parameters=parameters,
                       optimization=gpu_optimization(spec, backend, target))


def _model_file_for(variant_format: str) -> str:
    return MODEL_FILES[variant_format]




def python_backend_files(config: ModelConfig) -> dict[str, Path]:
    """The files a python-backend version carries beside its model: model.py and drift.py (drift.py is
    self-contained, numpy only: it travels with the python-backend model.py)."""
    if config.backend != "python":
        return {}
    return {"model.py": assets.python_backend_model(), "drift.py": assets.drift_module()}


def publish_model(repository: Path, description: VersionDescription,
                  reservation: Reservation | None = None) -> dict[str, Any]:
    """Publish one described version atomically: model files, runtime files, metadata.yaml (version
    and file hashes filled in here), the extra files and config.pbtxt; nothing is visible until all
    of them are written. A failed write (a full disk) names the file and leaves earlier versions as
    they were. With ``description.signing_key`` the version is signed while staged (signing.py).
    A config whose interface differs from the model folder's, served with older versions built for the
    old one (version_policy all), is refused before anything is written (interface.py)."""
    if description.config_text is None and not description.warmup_files:  # warmed up with its reference data
        reference = description.extra_files.get("reference.npz")
        config, files = with_reference_warmup(description.config, reference() if callable(reference) else reference)
        description = dataclasses.replace(description, config=config, warmup_files=files)
    config = description.config
    config_text = description.config_text or render_config(config)
    interface_change(repository, description.name, config_text)  # raises UserInputError; a warning is the caller's
    failure = warmup_failure(description)
    if failure is not None:  # Triton would not load it, and serve of the whole repository would fail
        data = "a reference sample" if any(i.data_file for w in config.warmups for i in w.inputs) else "zeros"
        raise VerificationError(f"'{description.name}' was not published: its warm-up ({data}, config.pbtxt's "
                                f"model_warmup) fails in {description.model_format}, so Triton would not load it: "
                                f"{failure}; models published before it in this run stay; build it without this "
                                "variant (--variants) or set deploy.warmup: false")
    with publish_version(repository, description.name, description.version, reservation) as draft:
        model_files = description.model_files
        model_name = _model_file_for(description.model_format)
        for source in model_files:
            # the main file takes the backend's default name; companions keep their suffix (.data, .bin)
            target = draft.folder / companion_name(model_name, model_files[0], source)
            with _writing(target, description.name):
                shutil.copyfile(source, target)
        for name, source in description.runtime_files.items():
            with _writing(draft.folder / name, description.name):
                shutil.copyfile(source, draft.folder / name)
        for name, content in description.extra_files.items():
            with _writing(draft.folder / name, description.name):
                _write_extra(draft.folder, name, content)
        # every file published so far, extras too (reference.npz, drift_profile.json, the reports): validate
        # detects a change to any of them; metadata.yaml (it holds the hashes) and the signature come after
        hashes = {p.name: sha256_file(p) for p in sorted(draft.folder.iterdir()) if p.is_file()}
        if description.metadata is not None:
            record = dict(description.metadata)
            record["version"] = draft.version
            record["files_sha256"] = hashes
            with _writing(draft.folder / "metadata.yaml", description.name):
                write_metadata(draft.folder / "metadata.yaml", record)
        draft.config_text = config_text
        draft.model_files = dict(description.warmup_files)
        if description.signing_key is not None:  # signed while staged: the version appears signed or not at all
            with _writing(draft.folder / SIGNED_CONFIG, description.name):
                (draft.folder / SIGNED_CONFIG).write_text(draft.config_text)
            sign_version(draft.folder, description.signing_key)
    return {"name": config.name, "version": draft.version, "path": str(draft.path), "backend": config.backend,
            "platform": backend_info(config.backend).name, **({"note": draft.note} if draft.note else {})}


@contextlib.contextmanager
def _writing(path: Path, model: str) -> Iterator[None]:
    """An OSError while writing ``path`` into the staging folder, said with the file and the fix; exit 2
    (UserInputError): a full, read-only or forbidden file system is the environment, not a failed check."""
    try:
        yield
    except OSError as err:
        hint = ("free space on that file system and build again" if err.errno == errno.ENOSPC
                else "check that folder's permissions and free space, then build again")
        raise UserInputError(f"publishing '{model}' failed writing {path.name} ({path.parent}): "
                           f"{err.strerror or err}; nothing was published and earlier versions are intact; "
                           f"{hint}") from None


def _write_extra(folder: Path, name: str, content: FileContent) -> None:
    path = (folder / name).resolve()
    if path.parent != folder.resolve():
        raise ValueError(f"extra file {name!r} must be a plain name inside the version folder")
    path.write_bytes(content if isinstance(content, bytes) else content())
