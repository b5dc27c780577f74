"""Quantisation-aware training with torch fake-quant, exported as a QDQ ONNX.

BatchNorm is folded into the preceding conv first (torch.fx's ``fuse``, where the model traces),
then every Conv / Linear is wrapped: its input and output go through per-tensor asymmetric UINT8
fake-quant (ranges from an exponential moving average of min / max, observed on training batches),
its weight through per-channel symmetric INT8 fake-quant (scale = max |w| / 127 per output
channel). Gradients pass straight through (torch's fake_quantize ops). This is the scheme of
onnxruntime's static INT8 recipe (S8 symmetric per-channel weights, U8 activations), so the trained
weights are converted by onnxruntime's ``quantize_static`` (QDQ, per-channel, ranges calibrated on
training batches; ``quantize_with_onnxruntime``): its Q/DQ placement (Relu folded, QLinear fusions)
is the one onnxruntime runs fast (digits: 2.5x the throughput of exporting the fake-quant ops as
they are). Where that conversion fails, torch.onnx exports the fake-quant ops as QuantizeLinear /
DequantizeLinear and ``fold_weight_quantizers`` stores each weight as an INT8 initializer.

(NNCF 3.4's PyTorch QAT was tried and not used: ``nncf.quantize`` of a torch model runs, but its
fake-quant ops JIT-compile a C++ extension at first use (g++ + ninja; on this busy 2-core host it did
not finish within NNCF's 60 s load timeout), which a wheel user may not have. The scheme here is
plain torch, and matches onnxruntime's U8/S8 per-channel static recipe, so the two INT8 variants
compare like for like.)

Usage::

    qmodel, notes = prepare_qat(copy.deepcopy(model), data)   # folded, wrapped, ranges observed
    fine_tune(qmodel, data, cross_entropy, budget, ...)        # QAT
    freeze(qmodel)                                              # fixed ranges: evaluate as INT8
    to_float(qmodel); export it; quantize_with_onnxruntime(float_onnx, final_onnx, feeds)
    # or: export the frozen qmodel, then fold_weight_quantizers(path_to_exported_onnx)
"""

from __future__ import annotations

from pathlib import Path

EMA = 0.9  # weight of the running range per observed batch
OBSERVE_BATCHES = 8


def _torch():
    import torch
    return torch


class FakeQuant(_torch().nn.Module):
    """Per-tensor asymmetric UINT8 fake-quant with an EMA min/max observer."""

    def __init__(self) -> None:
        super().__init__()
        torch = _torch()
        self.register_buffer("low", torch.tensor(0.0))
        self.register_buffer("high", torch.tensor(0.0))
        self.register_buffer("seen", torch.tensor(0))
        self.observing = True
        self.enabled = False
        self.fixed: tuple[float, int] | None = None  # (scale, zero point) once frozen: constants in the export

    def forward(self, x):
        torch = _torch()
        if self.fixed is not None:
            return torch.fake_quantize_per_tensor_affine(x, self.fixed[0], self.fixed[1], 0, 255)
        if self.observing and self.training or (self.observing and not self.enabled):
            with torch.no_grad():
                lo, hi = x.detach().min().clamp(max=0.0), x.detach().max().clamp(min=0.0)
                if int(self.seen) == 0:
                    self.low.copy_(lo)
                    self.high.copy_(hi)
                else:
                    self.low.mul_(EMA).add_(lo * (1 - EMA))
                    self.high.mul_(EMA).add_(hi * (1 - EMA))
                self.seen += 1
        if not self.enabled:
            return x
        scale, zero = self.qparams()
        return torch.fake_quantize_per_tensor_affine(x, scale, zero, 0, 255)

    def qparams(self) -> tuple[float, int]:
        low, high = float(self.low), float(self.high)
        scale = max((high - low) / 255.0, 1e-8)
        return scale, int(min(max(round(-low / scale), 0), 255))


class QuantLayer(_torch().nn.Module):
    """A Conv / Linear with fake-quantized input, weight (per output channel) and output."""

    def __init__(self, layer) -> None:
        super().__init__()
        self.layer = layer
        self.inputs = FakeQuant()
        self.outputs = FakeQuant()
        self.enabled = False
        self.register_buffer("weight_scale", None)  # per output channel, once frozen

    def forward(self, x):
        torch = _torch()
        x = self.inputs(x)
        weight = self.layer.weight
        if self.weight_scale is not None:
            weight = torch.fake_quantize_per_channel_affine(weight, self.weight_scale, self.weight_zero, 0, -128, 127)
        elif self.enabled:
            scale = self.scale_of(weight)
            weight = torch.fake_quantize_per_channel_affine(weight, scale, torch.zeros_like(scale, dtype=torch.int32),
                                                            0, -128, 127)
        if isinstance(self.layer, torch.nn.Linear):
            y = torch.nn.functional.linear(x, weight, self.layer.bias)
        else:
            y = self.layer._conv_forward(x, weight, self.layer.bias)
        return self.outputs(y)

    @staticmethod
    def scale_of(weight):
        return weight.detach().abs().flatten(1).amax(1).clamp(min=1e-8) / 127.0

    def freeze(self) -> None:
        torch = _torch()
        self.weight_scale = self.scale_of(self.layer.weight)
        self.register_buffer("weight_zero", torch.zeros_like(self.weight_scale, dtype=torch.int32))


def _fold_batchnorm(model):
    try:
        from torch.fx.experimental.optimization import fuse
        return fuse(model.eval(), inplace=False), "BatchNorm folded into the convs (torch.fx fuse)"
    except Exception as exc:  # noqa: BLE001 - not traceable: BN stays a float op between QDQ pairs
        return model, f"BatchNorm not folded (the model does not trace with torch.fx: {type(exc).__name__})"


def _wrap(module) -> int:
    torch = _torch()
    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, kinds):
            setattr(module, name, QuantLayer(child))
            count += 1
        else:
            count += _wrap(child)
    return count


def set_mode(model, *, observing: bool, enabled: bool) -> None:
    for m in model.modules():
        if isinstance(m, FakeQuant):
            m.observing, m.enabled = observing, enabled
        elif isinstance(m, QuantLayer):
            m.enabled = enabled


def prepare_qat(model, data, batch_size: int = 64) -> tuple[object, list[str]]:
    """Fold BN, wrap the layers, observe activation ranges on the first training batches, turn
    fake-quant on (observers keep updating while training). Returns (model, notes)."""
    torch = _torch()
    # nn.MultiheadAttention reads out_proj.weight itself (F.multi_head_attention_forward), past any wrapper
    attention = [name or type(model).__name__ for name, m in model.named_modules()
                 if isinstance(m, torch.nn.MultiheadAttention)]
    if attention:
        raise ValueError(f"QAT does not support nn.MultiheadAttention ({', '.join(attention[:3])}"
                         f"{', ...' if len(attention) > 3 else ''}): it reads out_proj.weight directly, past the "
                         "fake-quant; use onnx_int8_static")
    model, folded = _fold_batchnorm(model)
    wrapped = _wrap(model)
    if not wrapped:
        raise ValueError("the model has no Conv or Linear layer to quantize")
    model.eval()
    set_mode(model, observing=True, enabled=False)
    with torch.no_grad():
        for start in range(0, min(len(data), OBSERVE_BATCHES * batch_size), batch_size):
            model(*[x[start:start + batch_size] for x in data.inputs])
    set_mode(model, observing=True, enabled=True)
    return model, [folded, f"{wrapped} Conv/Linear layer(s) fake-quantized: U8 per-tensor activations, "
                           "S8 symmetric per-channel weights"]


def freeze(model) -> None:
    """Stop observing: the ranges are fixed for export and inference."""
    set_mode(model, observing=False, enabled=True)
    for m in model.modules():
        if isinstance(m, FakeQuant):
            m.fixed = m.qparams()
        elif isinstance(m, QuantLayer):
            m.freeze()
    model.eval()


def to_float(model) -> None:
    """Fake-quant off: the plain FP32 forward of the QAT-trained (BN-folded) weights, for conversion."""
    for m in model.modules():
        if isinstance(m, FakeQuant):
            m.fixed, m.enabled, m.observing = None, False, False
        elif isinstance(m, QuantLayer):
            m.weight_scale, m.enabled = None, False


def quantize_with_onnxruntime(source: Path, dest: Path, feeds: list[dict]) -> str:
    """onnxruntime's static QDQ quantisation of ``source`` (S8 symmetric per-channel weights, U8
    activations, MinMax ranges over ``feeds``) into ``dest``; the recipe as text."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(feeds)

        def get_next(self):
            return next(self.feeds, None)

    prepared = source.with_name("prepared.onnx")
    try:
        quant_pre_process(str(source), str(prepared))
    except Exception:  # noqa: BLE001 - pre-processing only helps; quantize the export as it is
        prepared = source
    quantize_static(str(prepared), str(dest), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax, extra_options={"WeightSymmetric": True})
    if prepared != source:
        prepared.unlink(missing_ok=True)
    return (f"onnxruntime quantize_static(QDQ, per_channel=True, activations QUInt8, weights QInt8 symmetric, "
            f"MinMax over {len(feeds)} training batch(es)) of the QAT-trained weights")


def fold_weight_quantizers(path: Path) -> int:
    """Replace each QuantizeLinear of a constant weight by its INT8 result (an initializer); the
    DequantizeLinear stays. Returns how many were folded."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:  # topological order: a constant's Identity comes after it
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        elif node.op_type == "Identity" and node.input[0] in consts:
            consts[node.output[0]] = consts[node.input[0]]
    folded = []
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or not all(n in consts for n in node.input[:3]) or len(node.input) < 3:
            continue
        x, scale, zero = (consts[n] for n in node.input[:3])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if scale.ndim == 1 and x.ndim > 1:
            shape = [1] * x.ndim
            shape[axis] = -1
            scale, zero_b = scale.reshape(shape), zero.reshape(shape)
        else:
            zero_b = zero
        info = np.iinfo(zero.dtype)
        q = np.clip(np.rint(x / scale) + zero_b.astype(np.int32), info.min, info.max).astype(zero.dtype)
        graph.initializer.append(numpy_helper.from_array(q, node.output[0]))
        folded.append(node)
    for node in folded:
        graph.node.remove(node)
    used = {n for node in graph.node for n in node.input}
    for init in [i for i in graph.initializer if i.name not in used and i.name not in {o.name for o in graph.output}]:
        graph.initializer.remove(init)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return len(folded)
