"""Replay a version's Triton warm-up (config.pbtxt's model_warmup: a reference sample or zeros) in-process before it
is published: Triton runs it while loading the model, and a model failing it is not loaded - in
``serve``, the whole repository then fails to start. Every published model is replayed, the
``NAME__variant`` companions of ``--publish-variants`` too (the build's checks ran only on reference data).

A python-backend version then has its served code path replayed too (served_replay.py: its own
model.py, on the reference cases and the warm-ups); a failure there raises VerificationError, naming
the model, the version and what failed, before anything is written.

Usage::

    why = warmup_failure(description)   # None, or why Triton would fail this model's warm-up
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from builder.core.errors import VerificationError
from builder.model.runtime import open_runner
from builder.repository.config import config_as_dict, render_config
from builder.repository.served_replay import model_shapes, served_path_failures
from builder.repository.warmup_data import WARMUP_FOLDER, warmup_array
from builder.spec.model import TRITON_DTYPES

if TYPE_CHECKING:
    from builder.repository.description import VersionDescription

NUMPY_DTYPES = {triton: numpy for numpy, triton in TRITON_DTYPES.items()}
REPLAYED_FORMATS = ("onnx", "torchscript", "openvino")  # a TensorRT plan is built on the GPU host, later


def warmup_inputs(description: "VersionDescription") -> list[dict[str, np.ndarray]]:
    """One feed per warm-up: each input's warm-up sample (its data file's, else zeros), reshaped as Triton reshapes them for the
    model (a scalar per sample: dims [1], reshape []), with the batch dimension when batched."""
    config = description.config
    # from the text Triton reads (a republished version's description holds no reshape of its own)
    reshapes = model_shapes(config_as_dict(description.config_text or render_config(config)))
    feeds = []
    for warmup in config.warmups:
        feed = {}
        for i in warmup.inputs:
            if i.data_type not in NUMPY_DTYPES:  # strings: Triton's zero_data is empty bytes, nothing to replay
                return []
            sample = (warmup_array(description.warmup_files[f"{WARMUP_FOLDER}/{i.data_file}"], i.data_type, i.dims)
                      if i.data_file else np.zeros(i.dims, dtype=NUMPY_DTYPES[i.data_type]))
            if reshapes.get(i.name) is not None:
                sample = sample.reshape(reshapes[i.name])
            feed[i.name] = (np.stack([sample] * warmup.batch_size) if config.max_batch_size > 0 else sample)
        feeds.append(feed)
    return feeds


def warmup_failure(description: "VersionDescription") -> str | None:
    """Why Triton would fail this version's warm-up (the runtime's error), or None when it runs. Then the
    served code path (served_replay.py): raises VerificationError when it fails."""
    failure = _runner_warmup_failure(description)
    if failure is None:
        _check_served_path(description)
    return failure


def _check_served_path(description: "VersionDescription") -> None:
    failures = served_path_failures(description)
    if failures:
        version = f"version {description.version}" if description.version is not None else "its new version"
        served = ("its model.py, run in-process as Triton's python backend runs it" if
                  description.config.backend == "python" else "its model file, as Triton's backend loads it")
        raise VerificationError(
            f"'{description.name}' {version} was not published: {served}, fails where the build's verification "
            f"(the builder's own runner on the same {description.model_format} file) passed, so Triton would not "
            "serve it as verified; nothing of it was written and models published before it in this run stay. "
            "A build: build it without this variant (--variants); select or tune --publish: the served version "
            "stays as it is. Report this (a triton-builder bug)", failures)


def _runner_warmup_failure(description: "VersionDescription") -> str | None:
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
