"""Run a model file in-process, the same way for every stage: ``open_runner(fmt, path)`` returns
``run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]``.

Usage::

    run = open_runner("onnx", Path("model.onnx"), output_names=["logits"])
    outputs = run({"image": x})

Formats: onnx (onnxruntime, CPU provider), torchscript (torch; CPU, or ``device="cuda"``), openvino (an OpenVINO IR on the
CPU plugin, latency hint, FP32 inference precision, threads = usable cores: builder/optimise/openvino_tools.py),
plan (TensorRT on a CUDA GPU; ``tensorrt_unavailable_reason()`` says why not here). Heavy imports
happen inside the functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Callable

import numpy as np

from builder.core.errors import BuilderError, UserInputError
from builder.optimise.openvino_tools import openvino_runner

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def open_runner(fmt: str, path: Path, output_names: list[str], input_names: list[str] | None = None,
                threads: int | None = None, device: str = "cpu") -> Runner:
    """``device``: where a TorchScript model runs ("cpu", "cuda", "cuda:N"); the other formats have one."""
    if fmt == "onnx":
        return _onnx_runner(path, output_names, threads)
    if fmt == "torchscript":
        import torch
        if device != "cpu":  # FP32 as served (model.py): no TF32 convolutions, which miss the fp32 tolerance
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        module = torch.jit.load(str(path), map_location=device).eval()
        return torch_runner(module, output_names, input_names, threads, device)
    if fmt == "plan":
        return plan_runner(path, output_names)
    if fmt == "openvino":
        return openvino_runner(path, output_names, threads)
    raise UserInputError(f"cannot run a '{fmt}' model in-process on this machine ({path.name})")


def tensorrt_unavailable_reason() -> str:
    """Why TensorRT plans cannot be built or run here ("" when they can): needs the ``tensorrt``
    Python package (extra [gpu]) and a CUDA GPU that torch can see (its tensors are the buffers)."""
    import importlib.util

    missing = []
    if importlib.util.find_spec("tensorrt") is None:
        missing.append("the tensorrt Python package is not installed (pip install 'triton-builder[gpu]' on a GPU host)")
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if not cuda:
        missing.append("no CUDA GPU here (torch.cuda.is_available() is False)")
    return "; ".join(missing)


def plan_runner(path: Path, output_names: list[str]) -> Runner:
    """Run a TensorRT plan on the first CUDA GPU (TensorRT 10 tensor API; torch CUDA tensors as the
    I/O buffers). Raises UserInputError when TensorRT or the GPU is missing, BuilderError when the
    plan does not deserialize (typically: built for another GPU architecture or TensorRT version)."""
    why = tensorrt_unavailable_reason()
    if why:
        raise UserInputError(f"cannot run the TensorRT plan {path.name} here: {why}")
    import tensorrt as trt
    import torch


    logger = trt.Logger(trt.Logger.WARNING)
    engine = trt.Runtime(logger).deserialize_cuda_engine(Path(path).read_bytes())
    if engine is None:
        raise BuilderError(f"{path.name}: TensorRT {trt.__version__} could not deserialize the plan (built for another "
                           "GPU architecture or TensorRT version?); rebuild it on this machine")
    context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    input_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    torch_dtypes = {}
    for name in names:
        np_type = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
        torch_dtypes[name] = (np_type, torch.from_numpy(np.zeros(1, dtype=np_type)).dtype)
    stream = torch.cuda.Stream()

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        held = []
        for name in input_names:
            array = np.ascontiguousarray(inputs[name], dtype=torch_dtypes[name][0])
            tensor = torch.from_numpy(array).cuda()
            held.append(tensor)
            context.set_input_shape(name, tuple(array.shape))
            context.set_tensor_address(name, tensor.data_ptr())
        outputs = {}
        for name in names:  # every output needs a buffer, also those not asked for
            if name in input_names:
                continue
            shape = tuple(context.get_tensor_shape(name))
            tensor = torch.empty(shape, dtype=torch_dtypes[name][1], device="cuda")
            outputs[name] = tensor
            context.set_tensor_address(name, tensor.data_ptr())
        torch.cuda.current_stream().synchronize()  # the input copies are done before TensorRT reads them
        if not context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError(f"TensorRT execution of {path.name} failed")
        stream.synchronize()
        return {name: outputs[name].cpu().numpy() for name in output_names}

    run.engine = engine  # type: ignore[attr-defined]
    return run


#: the batch input of a graph that takes ragged batches (builder/huggingface/ragged.py): each row's width
RAGGED_ITEM_SHAPE = "ragged_item_shape"


def ragged_feeds(requests: list[dict[str, np.ndarray]], names: list[str]) -> dict[str, np.ndarray]:
    """What Triton's onnxruntime backend hands a ragged graph for these requests ([rows, width] each): every
    ragged input flattened across the batch, and each row's width (BATCH_ITEM_SHAPE, [rows, 1] INT32). A runner
    of such a graph takes the usual [rows, width] inputs and feeds them so."""
    feeds = {name: np.concatenate([r[name].reshape(-1) for r in requests]) for name in names}
    widths = [r[names[0]].shape[1] for r in requests for _ in range(r[names[0]].shape[0])]
    feeds[RAGGED_ITEM_SHAPE] = np.asarray(widths, dtype=np.int32).reshape(-1, 1)
    return feeds


def _onnx_runner(path: Path, output_names: list[str], threads: int | None) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # fatal only: a failing run raises with the node's error, which verify reports per variant; the
    # [E:onnxruntime ...] lines ORT prints besides at level 3 only sprayed the build's stderr
    options.log_severity_level = 4
    if threads:
        options.intra_op_num_threads = threads
    # threads that do not spin, as served (model.py's intra_op_spinning off): spinning pools of the sessions
    # measured in turns took the cores from the next one's window - 20 ms windows read digits at 66-81k/s
    # at batch 64 spinning, 152-155k not (and 150k in 0.3 s windows either way), so onnx_opt read 0.6x onnx
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = [i.name for i in session.get_inputs()]
    ragged = [n for n in feeds if n != RAGGED_ITEM_SHAPE] if RAGGED_ITEM_SHAPE in feeds else None
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = ragged_feeds([{k: inputs[k] for k in ragged}], ragged) if ragged else {k: inputs[k] for k in feeds}
        values = session.run(output_names, feed, quiet)
        return dict(zip(output_names, values))

    run.session = session  # type: ignore[attr-defined]
    return run


def torch_runner(module, output_names: list[str], input_names: list[str] | None = None,
                 threads: int | None = None, device: str = "cpu") -> Runner:
    """Call a torch module (eager or TorchScript) with keyword-free positional inputs in spec order.
    ``threads``: torch's intra-op threads for each call (None: torch's own setting), set per call and
    restored, as torch's count is process-wide - so a TorchScript version and an ONNX one opened with
    the same count are timed on the same cores. ``device``: where the inputs go (the module must be
    there); outputs always come back to the host, so a timed call counts both copies, as serving does."""
    import torch

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = input_names or list(inputs)
        # copies: a forward() that works on its input in place (x.mul_(2)) would change the caller's arrays,
        # the stored reference cases among them (the next run then reads other inputs)
        args = [torch.from_numpy(np.array(inputs[n], order="C", copy=True)).to(device) for n in names]
        before = torch.get_num_threads()
        switch = bool(threads) and threads != before  # no cost per call where the pool is already sized
        if switch:
            torch.set_num_threads(threads)
        try:
            with torch.inference_mode():
                result = module(*args)
        finally:
            if switch:
                torch.set_num_threads(before)
        return name_outputs(result, output_names)

    return run


def name_outputs(result, output_names: list[str]) -> dict[str, np.ndarray]:
    """The model's return value as {spec output name: array}, in spec order. Outputs are taken by
    position (exporters number a graph's outputs the same way); a dict, a mapping (HF ModelOutput) or a
    namedtuple whose names the spec also uses must be listed in the model's order, or each name would
    label another field's values. A count that differs is the spec's mistake, never truncated."""
    named = _named_fields(result)
    if named is not None:
        kind, keys = named
        if set(keys) & set(output_names) and keys != list(output_names):
            raise UserInputError(
                f"field 'outputs': the model returns {kind} {', '.join(keys)} (in this order), the spec "
                f"lists {', '.join(output_names)}; outputs are taken in the model's order, so list them as "
                f"outputs: [{', '.join('{name: ' + k + '}' for k in keys)}]")
    arrays = flatten_outputs(result)
    if len(arrays) != len(output_names):
        raise UserInputError(
            f"field 'outputs': the spec lists {len(output_names)} output(s) ({', '.join(output_names)}) but the "
            f"model returns {len(arrays)} tensor(s) (nested tuples and dicts count each tensor); list one name per "
            "tensor, in the order the model returns them")
    return dict(zip(output_names, arrays))


def _named_fields(result) -> tuple[str, list[str]] | None:
    """(what the model returns, its field names in order) for a flat dict, mapping or namedtuple whose
    fields are one tensor each (None values dropped, as flattening does); None otherwise - nested
    values flatten to more tensors than names, so the names cannot be matched one to one."""
    if isinstance(result, Mapping):
        kind, items = f"a {type(result).__name__} with keys", list(result.items())
    elif isinstance(result, tuple) and isinstance(getattr(type(result), "_fields", None), tuple):
        kind, items = f"a namedtuple {type(result).__name__} with fields", list(zip(type(result)._fields, result))
    else:
        return None
    if any(isinstance(v, (Mapping, list, tuple)) for _, v in items):
        return None
    return kind, [str(k) for k, v in items if v is not None]


def flatten_outputs(result) -> list[np.ndarray]:
    """A model's return value (tensor, tuple/list, dict, HF ModelOutput) as a list of arrays."""
    import torch

    if isinstance(result, torch.Tensor):
        return [result.detach().cpu().numpy()]
    if isinstance(result, Mapping):
        items = list(result.values())
    elif isinstance(result, (list, tuple)):
        items = list(result)
    else:
        raise UserInputError(f"the model returned {type(result).__name__}; return a tensor, a tuple or a dict of tensors")
    arrays = []
    for item in items:
        arrays.extend(flatten_outputs(item))
    return arrays
