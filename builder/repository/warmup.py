"""Replay a version's Triton warm-up (config.pbtxt's model_warmup: zero_data inputs) in-process before it
is published: Triton runs it while loading the model, and a model failing it is not loaded - in
``serve``, the whole repository then fails to start. Every published model is replayed, the
``NAME__variant`` companions of ``--publish-variants`` too (the build's checks ran only on reference data).

Usage::

    why = warmup_failure(description)   # None, or why Triton would fail this model's warm-up
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from builder.spec import TRITON_DTYPES

if TYPE_CHECKING:
    from builder.repository.description import VersionDescription

NUMPY_DTYPES = {triton: numpy for numpy, triton in TRITON_DTYPES.items()}
REPLAYED_FORMATS = ("onnx", "torchscript", "openvino")  # a TensorRT plan is built on the GPU host, later


def warmup_inputs(description: "VersionDescription") -> list[dict[str, np.ndarray]]:
    """One feed per warm-up: zeros of each input's warm-up dims, reshaped as Triton reshapes them for the
    model (a scalar per sample: dims [1], reshape []), with the batch dimension when batched."""
    config = description.config
    reshapes = {t.name: t.reshape for t in config.inputs}
    feeds = []
    for warmup in config.warmups:
        feed = {}
        for i in warmup.inputs:
            if i.data_type not in NUMPY_DTYPES:  # strings: Triton's zero_data is empty bytes, nothing to replay
                return []
            sample = np.zeros(i.dims, dtype=NUMPY_DTYPES[i.data_type])
            if reshapes.get(i.name) is not None:
                sample = sample.reshape(reshapes[i.name])
            feed[i.name] = (np.stack([sample] * warmup.batch_size) if config.max_batch_size > 0 else sample)
        feeds.append(feed)
    return feeds


def warmup_failure(description: "VersionDescription") -> str | None:
    """Why Triton would fail this version's warm-up (the runtime's error), or None when it runs."""
    from builder.runtime import open_runner

    feeds = warmup_inputs(description)
    if not feeds or description.model_format not in REPLAYED_FORMATS or not description.model_files:
        return None
    outputs = [o.name for o in description.config.outputs]
    try:
        run = open_runner(description.model_format, description.model_files[0], outputs, list(feeds[0]))
    except Exception:  # noqa: BLE001 - whether the file loads is verify's question (and validate's), not this one
        return None
    try:
        for feed in feeds:
            run(feed)
    except Exception as exc:  # noqa: BLE001 - any runtime error is what Triton's warm-up would hit
        return " ".join(str(exc).split())[:400] or type(exc).__name__
    return None
