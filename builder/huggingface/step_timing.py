"""Where a request's time goes in a Hugging Face pipeline, timed in-process at build time for the build report.

The served ensemble runs the tokenizer (or image) step, the model and, for a classifier whose labels are not in
its graph, the post-processing step - each a call Triton makes. Here the steps' own code (the files they are
published with) runs on the reference inputs one at a time, as a request at concurrency 1 meets them; the model's
figure is the selected variant's measured batch-1 latency. What the server adds on top (a python-backend call per
python step, the ensemble's hand-offs) shows in `triton-builder sweep <name>`'s per-step table, from Triton's own
statistics of each step.

Usage::

    timings = time_steps(pipeline, seconds=0.5)   # {"preprocess_us": 85.1, "postprocess_us": 9.8, "inputs": 58}
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any, Callable

import numpy as np

from builder.huggingface.images import processor_for
from builder.huggingface.texts import encoder_for, text_steps


def _per_call_us(call: Callable[[Any], object], items: list, seconds: float) -> float:
    """The median of per-item means over passes through ``items`` (at least three passes, about ``seconds``)."""
    call(items[0])  # warm: first-call caches
    passes: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(passes) < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        for item in items:
            call(item)
        passes.append((time.perf_counter() - start) / len(items) * 1e6)
        if len(passes) >= 50:
            break
    return float(np.median(passes))


def time_steps(pipeline, seconds: float = 0.5) -> dict[str, Any]:
    """``pipeline``: builder/repository/pipeline.py HuggingFacePipeline with its reference. The pre-processing
    step's and (classification) the post-processing arithmetic's in-process time per request, in microseconds."""
    reference = json.loads(pipeline.reference or b"{}")
    timings: dict[str, Any] = {}
    if pipeline.images:
        processor = processor_for(pipeline.processor_file)
        images = [base64.b64decode(item) for item in reference.get("images") or []]
        if images:
            timings["preprocess_us"] = _per_call_us(lambda image: processor.process([image]), images, seconds)
            timings["inputs"] = len(images)
    else:
        encoder = encoder_for(pipeline.tokenizer_file, pipeline.max_length, pipeline.truncation, pipeline.length_buckets)
        texts = list(reference.get("texts") or [])
        if texts:
            timings["preprocess_us"] = _per_call_us(lambda text: encoder.encode([text]), texts, seconds)
            timings["inputs"] = len(texts)
    if pipeline.classifies and not pipeline.tags_tokens:
        steps = text_steps()
        logits = [np.random.default_rng(row).normal(size=(1, len(pipeline.labels))).astype(np.float32)
                  for row in range(16)]
        timings["postprocess_us"] = _per_call_us(
            lambda row: steps.classify(row, pipeline.labels, pipeline.activation), logits, seconds / 5)
    return timings
