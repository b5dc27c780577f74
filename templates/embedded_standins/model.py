"""A stand-in for one of Triton's C++ backends, for triton-builder's EMBEDDED tritonserver only.

The embedded tritonserver (nvidia-pytriton's Triton 2.51 = NGC 24.10) ships only the python backend. Triton
loads a *Python-based backend* from ``<backend-directory>/<name>/model.py``, so `triton-builder serve`
lays this file out as ``backends/onnxruntime/model.py``, ``backends/pytorch/model.py`` and
``backends/openvino/model.py`` (with ``served_model.py``, the python-backend model of
templates/python_backend/, beside it). A STANDARD model folder - ``platform: "onnxruntime_onnx"`` +
``1/model.onnx``, ``pytorch_libtorch`` + ``model.pt``, ``backend: "openvino"`` + ``model.xml``/``.bin``,
nothing else - then loads here byte for byte as the NGC image's C++ backend loads it. Never published.

What it honours: the version's file (``default_model_filename``, else the backend's default name),
batching and instance counts (Triton's core does both), reshape, ragged inputs with a BATCH_ITEM_SHAPE batch
input (each request is run on its own: builder/huggingface/ragged.py), and the thread count the C++ backend
reads (onnxruntime ``intra_op_thread_count``, libtorch ``INTRA_OP_THREAD_COUNT``, openvino
``INFERENCE_NUM_THREADS``; 1 when unset). What it refuses, with one line in the load error: an execution
accelerator (TensorRT, OpenVINO-in-onnxruntime: the stand-in runs onnxruntime's CPU provider), a GPU
instance for onnxruntime or openvino. It runs this environment's onnxruntime / torch / openvino, not the
release's (``validate --triton-release R`` replays under R's own).
"""

import json
import os
import sys

import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import served_model  # noqa: E402
from served_model import TritonPythonModel as _ServedModel  # noqa: E402


class _Uncounted:
    """The C++ backends count no NaN/Inf inputs (a monitored model's monitor step does): the stand-in's
    served_model.py guard is replaced by this, which counts nothing. Its error counter stays: a C++ backend's
    failed request is counted by Triton (nv_inference_request_failure), a python model's is not, and the
    failure-ratio rule reads triton_builder_request_errors_total for it."""

    def __init__(self, *args, **kwargs):
        pass

    def check(self, feeds):
        return None


served_model._NonFiniteGuard = _Uncounted

#: backend -> (runtime of served_model.py, default file, the C++ backend's thread-count parameter)
STANDINS = {"onnxruntime": ("onnxruntime", "model.onnx", "intra_op_thread_count"),
            "pytorch": ("torchscript", "model.pt", "INTRA_OP_THREAD_COUNT"),
            "openvino": ("openvino", "model.xml", "INFERENCE_NUM_THREADS")}
PLATFORMS = {"onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "pytorch"}
#: parameters of served_model.py a standard config must not smuggle in
OWN_PARAMETERS = ("model_file", "runtime", "intra_op_threads", "scalar_tensors")


def refusal(config, backend, instance_kind):
    """Why this stand-in cannot serve ``config`` as the C++ backend would, or None."""
    accelerators = (config.get("optimization") or {}).get("execution_accelerators") or {}
    named = [a.get("name", "?") for kind in ("gpu_execution_accelerator", "cpu_execution_accelerator")
             for a in accelerators.get(kind) or []]
    if named:
        return (f"execution accelerator {', '.join(named)} in config.pbtxt: the stand-in runs {backend} on the CPU "
                "only; serve this folder on the NGC image (docker compose), or build it without the accelerator")
    if instance_kind == "GPU" and backend != "pytorch":
        return (f"a KIND_GPU instance: the stand-in runs {backend} on the CPU only; serve it on the NGC image on a "
                "GPU host, or publish it with deploy.instance_kind: cpu")
    return None


class TritonPythonModel(_ServedModel):
    def initialize(self, args):
        config = json.loads(args["model_config"])
        backend = config.get("backend") or PLATFORMS.get(config.get("platform", ""), "")
        if backend not in STANDINS:
            raise pb_utils.TritonModelException(f"stand-in backend: '{backend}' is not one of {', '.join(STANDINS)}")
        why = refusal(config, backend, args.get("model_instance_kind"))
        if why:
            message = f"stand-in {backend} backend (triton-builder's embedded server) refuses '{args['model_name']}': {why}"
            pb_utils.Logger.log_error(message)
            raise pb_utils.TritonModelException(message)
        runtime, default_file, thread_key = STANDINS[backend]
        params = {k: v for k, v in (config.get("parameters") or {}).items() if k not in OWN_PARAMETERS}
        params["model_file"] = {"string_value": config.get("default_model_filename") or default_file}
        params["runtime"] = {"string_value": runtime}
        threads = (params.get(thread_key) or {}).get("string_value", "")
        params["intra_op_threads"] = {"string_value": threads if threads.isdigit() and int(threads) > 0 else "1"}
        config["parameters"] = params
        super().initialize({**args, "model_config": json.dumps(config)})
        ragged = [i["name"] for i in config.get("input", []) if i.get("allow_ragged_batch")]
        shapes = [b for b in config.get("batch_input") or [] if b.get("kind") == "BATCH_ITEM_SHAPE"]
        if ragged and shapes:  # requests reach _run one by one or stacked, each [rows, width]: ragged as Triton's
            self._run = _ragged(self._run, ragged, shapes[0]["target_name"][0])


def _ragged(run, names, item_shape):
    """``run`` fed as Triton's onnxruntime backend feeds a ragged graph: the ragged inputs flat, each row's width."""
    import numpy as np

    def ragged_run(feeds):
        rows, width = feeds[names[0]].shape[:2]
        flat = {name: feeds[name].reshape(-1) for name in names}
        return run({**feeds, **flat, item_shape: np.full((rows, 1), width, dtype=np.int32)})

    return ragged_run
