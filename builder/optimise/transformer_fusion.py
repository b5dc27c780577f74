"""onnxruntime's transformer optimizer (Attention, SkipLayerNormalization, BiasGelu, EmbedLayerNormalization
fusions) for encoder models, as Hugging Face Optimum's ORTOptimizer applies it.

onnxruntime fuses LayerNorm and Gelu patterns itself when it loads a graph, but not multi-head attention:
that needs the model's head count and hidden size, and a graph whose attention subgraph it recognises -
the legacy (TorchScript-based) exporter's; the dynamo exporter's graph fails its pattern matcher. So the
``onnx_opt`` variant of a transformer is made from a legacy export of the same module, fused, then
verified and measured like every variant (nothing here is assumed to be faster).

The encoder's shape comes from the module: the first sub-module with a Hugging Face ``config`` holding
``num_attention_heads`` and ``hidden_size``; its ``model_type`` picks the optimizer's model type (the
encoder families Optimum maps to ``bert``; ``vit``). Anything else: None, and the variant is made the
usual way.

Usage::

    shape = encoder_shape(torch_module)       # ("bert", 12, 384) or None
    with eager_attention(torch_module):       # SDPA -> eager while the module is exported
        ...
    fused = fuse(Path("legacy.onnx"), Path("fused.onnx"), *shape)   # {"Attention": 6, ...} fused op counts
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any, Iterator

#: Hugging Face model_type -> onnxruntime.transformers optimizer model_type (Optimum's mapping for encoders)
OPTIMIZER_TYPES = {name: "bert" for name in ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra",
                                             "mpnet", "albert", "deberta", "deberta-v2", "ernie", "xlm")}
OPTIMIZER_TYPES["vit"] = "vit"
#: what counts as a transformer fusion (a graph with none of these fused gains nothing over the usual path)
KEY_FUSIONS = ("Attention", "MultiHeadAttention", "SkipLayerNormalization", "EmbedLayerNormalization")


def encoder_shape(module: Any) -> tuple[str, int, int] | None:
    """(optimizer model type, heads, hidden size) of the first Hugging Face encoder config in ``module``."""
    modules = module.modules() if callable(getattr(module, "modules", None)) else []
    for sub in modules:
        config = getattr(sub, "config", None)
        heads, hidden = getattr(config, "num_attention_heads", None), getattr(config, "hidden_size", None)
        kind = OPTIMIZER_TYPES.get(str(getattr(config, "model_type", "")))
        if kind and isinstance(heads, int) and isinstance(hidden, int) and heads > 0 and hidden % heads == 0:
            return kind, heads, hidden
    return None


@contextlib.contextmanager
def eager_attention(module: Any) -> Iterator[list[str]]:
    """Hugging Face models inside ``module`` switched to eager (matmul + softmax) attention for the duration,
    as the optimizer's attention patterns expect (SDPA exports as one opaque subgraph it does not fuse);
    yields what was switched, and restores each model's own implementation afterwards."""
    switched = []
    for sub in module.modules() if callable(getattr(module, "modules", None)) else []:
        config = getattr(sub, "config", None)
        current = getattr(config, "_attn_implementation", None)
        if current not in (None, "eager") and callable(getattr(sub, "set_attn_implementation", None)):
            sub.set_attn_implementation("eager")
            switched.append((sub, current))
    try:
        yield [f"{type(sub).__name__}: {current} -> eager" for sub, current in switched]
    finally:
        for sub, current in switched:
            sub.set_attn_implementation(current)


def fuse(source: Path, dest: Path, model_type: str, heads: int, hidden: int) -> dict[str, int]:
    """The optimizer's fusions (no onnxruntime graph pass: the caller runs that) from ``source`` into ``dest``;
    the fused operator counts (only those > 0)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    loggers = [logging.getLogger(name) for name in ("onnxruntime.transformers", "fusion", "onnx_model")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            optimized = optimize_model(str(source), model_type=model_type, num_heads=heads, hidden_size=hidden,
                                       opt_level=0, optimization_options=FusionOptions(model_type))
            counts = {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}
            optimized.save_model_to_file(str(dest))
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
    return counts
