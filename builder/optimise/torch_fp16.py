"""An FP16 TorchScript from an FP32 one: half weights and compute, the spec's dtypes at the boundary.

``half_torchscript(module, example_args)`` wraps the loaded FP32 TorchScript (a trace or a script:
a scripted module keeps its control flow inside the wrapper) so that floating inputs are cast to
float16 on the way in and float16 outputs back to float32 on the way out - a client sends and gets
what the spec says, as with ``onnx_fp16``. Integer inputs (token ids, masks) pass unchanged. Where
an input is 4-D the weights and that input go channels_last: on the GPU that is what lets cuDNN pick
its tensor-core kernels (convnet64 on an H100: 1.7x the FP16 throughput of the default layout;
benchmarks/results/gpu_fp16_h100.md).

The wrapper is traced on this machine's CPU (PyTorch's CPU kernels cover FP16) and saved without a
device, so the file serves on a GPU (libtorch backend, or the python backend on a KIND_GPU instance)
and verifies here.

Usage::

    half = half_torchscript(torch.jit.load("model.pt"), example_args)
    half.save("fp16/model.pt")
"""

from __future__ import annotations


def half_torchscript(module, example_args: tuple):
    import torch

    channels_last = any(a.dim() == 4 and a.is_floating_point() for a in example_args)

    class HalfPrecision(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            cast = []
            for a in args:
                if a.is_floating_point():
                    a = a.half()
                    if channels_last and a.dim() == 4:
                        a = a.contiguous(memory_format=torch.channels_last)
                cast.append(a)
            return _to_float32(self.inner(*cast))

    inner = module.half()
    if channels_last:
        inner = inner.to(memory_format=torch.channels_last)
    with torch.inference_mode():
        return torch.jit.trace(HalfPrecision(inner).eval(), example_args, check_trace=False, strict=False)


def _to_float32(result):
    import torch

    if isinstance(result, torch.Tensor):
        return result.float() if result.dtype == torch.float16 else result
    if isinstance(result, dict):
        return {k: _to_float32(v) for k, v in result.items()}
    if isinstance(result, (list, tuple)):
        return type(result)(_to_float32(v) for v in result) if not hasattr(result, "_fields") else \
            type(result)(*(_to_float32(v) for v in result))
    return result
