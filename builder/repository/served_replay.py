"""Replay the served code path of a version before it is published. Verification runs each variant with
the builder's own runners (builder/model/runtime.py); Triton's python backend runs the version's model.py
instead, which feeds, reshapes and names tensors its own way. So for a python-backend version, its real
model.py is imported here with a stand-in ``triton_python_backend_utils`` (pb_utils_stand_in.py),
initialized with the config as Triton passes it, and executed on one request per reference case
(reference.npz, sent in the wire shape, as ``check`` sends them) and on the warm-ups; the answers must
have the config's dims and match the reference at the variant's tolerance. No server: it takes about as
long as loading the model once more.

It runs in a temp copy of the version folder (model files, model.py and drift.py linked, the drift
profile written), with the drift window's shared file in that folder too: nothing is written into the
repository or /dev/shm. A Triton backend other than python gets its static part: an ONNX file must
declare every input and output the config lists (Triton's onnxruntime backend refuses the model
otherwise).

Usage::

    failures = served_path_failures(description)   # [] or one line per failed case / warm-up
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from builder.accuracy.tensors import compare_outputs, from_wire, merge_case_metrics, to_wire, tolerance_failures
from builder.core.scratch import work_folder
from builder.model.runtime import open_runner
from builder.repository import pb_utils_stand_in
from builder.repository.config import SCALAR_TENSORS, config_as_dict, render_config
from builder.repository.layout import MODEL_FILES, companion_name
from builder.repository.metadata import read_reference
from builder.repository.warmup_data import WARMUP_FOLDER, warmup_array

if TYPE_CHECKING:
    from builder.repository.description import VersionDescription

_MODULE_NUMBERS = itertools.count()
REPLAY_PREFIX = "triton-builder-served-replay-"  # the replay's temp folder, owned (builder/core/scratch.py)


def served_path_failures(description: "VersionDescription") -> list[str]:
    """Why the version, served as published, would not load or not answer like its reference ([] when it
    does). Python backend: its model.py replayed in-process; onnxruntime backend: the file's interface."""
    config = config_as_dict(description.config_text or render_config(description.config))
    backend = config.get("backend") or config.get("platform")
    if backend == "onnxruntime_onnx" and description.model_format == "onnx" and description.model_files:
        return _onnx_interface_failures(description.model_files[0], config)
    if backend != "python" or "model.py" not in description.runtime_files or not description.model_files:
        return []

    with work_folder(prefix=REPLAY_PREFIX) as work:  # those a killed build left are swept first
        return _replay(description, config, work)


def model_shapes(config: dict[str, Any]) -> dict[str, list[int]]:
    """Input name -> the per-sample shape model.py hands the model where it differs from the wire dims (a
    scalar: reshape [] when batching, parameter scalar_tensors without), as templates/python_backend/model.py
    reads them from the same config."""
    shapes = {i["name"]: [int(d) for d in i["reshape"].get("shape", [])] for i in config.get("input", [])
              if "reshape" in i}
    scalars = ((config.get("parameters") or {}).get(SCALAR_TENSORS) or {}).get("string_value", "").split(",")
    shapes.update({i["name"]: [] for i in config.get("input", []) if i["name"] in scalars})
    return shapes


def _onnx_interface_failures(path: Path, config: dict[str, Any]) -> list[str]:
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - whether the file loads is verify's question (and validate's), not this one
        return []
    weights = {t.name for t in graph.initializer}
    declared = {"input": [i.name for i in graph.input if i.name not in weights],
                "output": [o.name for o in graph.output]}
    return [f"config {kind} '{t['name']}' is not an {kind} of {path.name} (its {kind}s: {', '.join(declared[kind])}): "
            "Triton's onnxruntime backend would refuse to load the model"
            for kind in ("input", "output") for t in config.get(kind, []) if t["name"] not in declared[kind]]


def _replay(description: "VersionDescription", config: dict[str, Any], tmp: Path) -> list[str]:
    version = str(description.version or 1)
    folder = tmp / description.name / version
    folder.mkdir(parents=True)
    main = MODEL_FILES[description.model_format]
    for source in description.model_files:  # linked, not copied: weights may be large
        os.symlink(Path(source).resolve(), folder / companion_name(main, description.model_files[0], Path(source)))
    for name, source in description.runtime_files.items():  # model.py, drift.py
        os.symlink(Path(source).resolve(), folder / name)
    extras = {name: description.extra_files[name] for name in ("reference.npz", "drift_profile.json")
              if name in description.extra_files}
    for name, content in extras.items():
        (folder / name).write_bytes(content() if callable(content) else content)
    pb_utils_stand_in.LOGGED.clear()  # what the previous replay logged
    module = import_model_py(folder / "model.py")
    # the drift window every instance of the version shares: in the temp folder, not /dev/shm (a model.py
    # published by an older triton-builder, which select and tune --publish copy, may keep it otherwise)
    if hasattr(module, "_SharedWindow"):
        module._SharedWindow.folder = classmethod(lambda cls: str(tmp))
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None  # model.py sets the process-wide count
    instance = module.TritonPythonModel()
    try:
        instance.initialize({"model_config": json.dumps(config), "model_name": description.name,
                             "model_version": version, "model_repository": str(folder.parent),
                             "model_instance_kind": _instance_kind(config, torch),
                             "model_instance_name": f"{description.name}_0_0",
                             "model_instance_device_id": "0"})
    except Exception as exc:  # noqa: BLE001 - what Triton's load would report
        _set_threads(torch, threads)
        # unless the builder's runner cannot load the file either: whether it loads is verify's question
        return [f"model.py initialize() fails: {_short(exc)}"] if _runner_opens(description) else []
    try:
        failures = _warmup_failures(instance, config, description.warmup_files)
        if not failures and (folder / "reference.npz").is_file():
            failures = _reference_failures(instance, config, folder / "reference.npz", description.metadata or {})
        return failures
    finally:
        try:
            instance.finalize()  # the last user of the drift window removes its file
        finally:
            _set_threads(torch, threads)


def _set_threads(torch, threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(threads)


def _runner_opens(description: "VersionDescription") -> bool:
    try:
        open_runner(description.model_format, description.model_files[0], [o.name for o in description.config.outputs])
    except Exception:  # noqa: BLE001
        return False
    return True


def _instance_kind(config: dict, torch) -> str:
    """GPU where the config asks for GPU instances and this machine has a CUDA GPU; else the CPU path
    (the same model.py lines but the device)."""
    kinds = {str(g.get("kind", "KIND_CPU")) for g in config.get("instance_group") or []}
    gpu = torch is not None and torch.cuda.is_available()
    return "GPU" if "KIND_GPU" in kinds and gpu else "CPU"


def import_model_py(path: Path, stand_in=pb_utils_stand_in, module_name: str | None = None):
    """A python-backend model.py as a fresh module bound to ``stand_in`` as its triton_python_backend_utils
    (never registered in sys.modules; the previous binding of that name is restored)."""
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = stand_in
    try:
        spec = importlib.util.spec_from_file_location(module_name or f"triton_builder_served_{next(_MODULE_NUMBERS)}",
                                                      path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        if saved is None:
            sys.modules.pop("triton_python_backend_utils", None)
        else:
            sys.modules["triton_python_backend_utils"] = saved


def _execute(instance, inputs: dict[str, np.ndarray], config: dict[str, Any]) -> dict[str, np.ndarray]:
    """One request through execute(); its outputs, checked against the config's dims. Raises with the
    model's error or the shape Triton would refuse."""
    response, = instance.execute([pb_utils_stand_in.StandInRequest(inputs)])
    if response.has_error():
        raise RuntimeError(f"model.py answered an error: {_short(response.error())}")
    outputs = {t.name(): np.asarray(t.as_numpy()) for t in response.output_tensors()}
    batch = int(config.get("max_batch_size", 0)) > 0
    for o in config.get("output", []):
        dims = [int(d) for d in o["dims"]]
        got = outputs.get(o["name"])
        if got is None:
            raise RuntimeError(f"output '{o['name']}' is missing from model.py's response")
        per_sample = list(got.shape[1:] if batch else got.shape)
        if len(per_sample) != len(dims) or any(d not in (-1, g) for d, g in zip(dims, per_sample)):
            raise RuntimeError(f"output '{o['name']}' has shape {list(got.shape)}, the config says dims {dims}"
                               f"{' after the batch dimension' if batch else ''}")
    return outputs


def _warmup_failures(instance, config: dict[str, Any], files: dict[str, bytes]) -> list[str]:
    batching = int(config.get("max_batch_size", 0)) > 0
    failures = []
    for warmup in config.get("model_warmup", []):
        count = int(warmup.get("batch_size", 1))
        feeds = {}
        for name, value in (warmup.get("inputs") or {}).items():
            dtype = pb_utils_stand_in.NUMPY_TYPES.get(value.get("data_type", ""))
            if dtype is None or dtype is np.object_:
                break  # strings: Triton's zero_data is empty bytes, nothing to replay in this warm-up
            dims = [int(d) for d in value.get("dims", [])]
            sample = (warmup_array(files[f"{WARMUP_FOLDER}/{value['input_data_file']}"], value["data_type"], dims)
                      if value.get("input_data_file") else np.zeros(dims, dtype))
            feeds[name] = np.stack([sample] * count) if batching else sample
        if not feeds or len(feeds) != len(warmup.get("inputs") or {}):
            continue
        try:
            _execute(instance, feeds, config)
        except Exception as exc:  # noqa: BLE001
            failures.append(f"warm-up {warmup.get('name', '?')}: {_short(exc)}")
    return failures


def _reference_failures(instance, config: dict[str, Any], path: Path, meta: dict[str, Any]) -> list[str]:
    cases, outputs = read_reference(path)
    batching = int(config.get("max_batch_size", 0)) > 0
    wire_dims = {t["name"]: [int(d) for d in t.get("dims", [])] for t in config.get("input", [])}
    per_case = []
    for case, reference in zip(cases, outputs):
        sent = {k: to_wire(v, wire_dims.get(k, []), batching) for k, v in case["inputs"].items()}
        try:
            got = _execute(instance, sent, config)
        except Exception as exc:  # noqa: BLE001
            return [f"case {case['id']}: {_short(exc)}"]
        per_case.append(compare_outputs(reference, {k: from_wire(v, reference[k]) if k in reference else v
                                                    for k, v in got.items()}))
    tolerance = (meta.get("verification") or {}).get("tolerance") or {"rel_l2": 1e-5}
    return [f"reference cases: {line}" for line in tolerance_failures(merge_case_metrics(per_case), tolerance)]


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:400] or type(exc).__name__
