"""Run a model file in-process, the same way for every stage: ``open_runner(fmt, path)`` returns
``run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]``.

Usage::

    run = open_runner("onnx", Path("model.onnx"), output_names=["logits"])
    outputs = run({"image": x})
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from builder.errors import UserInputError

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def open_runner(fmt: str, path: Path, output_names: list[str], input_names: list[str] | None = None,
                threads: int | None = None) -> Runner:
    if fmt == "onnx":
        return _onnx_runner(path, output_names, threads)
    if fmt == "torchscript":
        import torch
        module = torch.jit.load(str(path), map_location="cpu").eval()
        return torch_runner(module, output_names, input_names)
    raise UserInputError(f"cannot run a '{fmt}' model in-process on this machine ({path.name})")


def _onnx_runner(path: Path, output_names: list[str], threads: int | None) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = [i.name for i in session.get_inputs()]

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = session.run(output_names, {k: inputs[k] for k in feeds})
        return dict(zip(output_names, values))

    run.session = session  # type: ignore[attr-defined]
    return run


def torch_runner(module, output_names: list[str], input_names: list[str] | None = None) -> Runner:
    """Call a torch module (eager or TorchScript) with keyword-free positional inputs in spec order."""
    import torch

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = input_names or list(inputs)
        args = [torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in names]
        with torch.inference_mode():
            result = module(*args)
        return dict(zip(output_names, flatten_outputs(result)))

    return run


def flatten_outputs(result) -> list[np.ndarray]:
    """A model's return value (tensor, tuple/list, dict, HF ModelOutput) as a list of arrays."""
    import torch

    if isinstance(result, torch.Tensor):
        return [result.detach().cpu().numpy()]
    if isinstance(result, dict):
        items = list(result.values())
    elif isinstance(result, (list, tuple)):
        items = list(result)
    else:
        raise UserInputError(f"the model returned {type(result).__name__}; return a tensor, a tuple or a dict of tensors")
    arrays = []
    for item in items:
        arrays.extend(flatten_outputs(item))
    return arrays
