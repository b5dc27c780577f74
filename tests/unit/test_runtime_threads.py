"""Variants are measured with onnxruntime threads that do not spin, as model.py serves them: in the
benchmark's turns, spinning pools of the sessions alive together took the cores from the next one's window
(convnet64 at batch 1 read 380/s spinning against 743/s not, and onnx_opt read 0.6x the same graph as onnx)."""

from __future__ import annotations

import numpy as np


def test_onnx_runners_do_not_spin_whatever_their_thread_count(tmp_path):
    import torch

    from builder.model.runtime import open_runner

    torch.onnx.export(torch.nn.Linear(4, 2), (torch.zeros(1, 4),), str(tmp_path / "m.onnx"), input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch"}}, dynamo=False)
    for threads in (None, 1, 2):
        run = open_runner("onnx", tmp_path / "m.onnx", ["y"], threads=threads)
        options = run.session.get_session_options()
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert run({"x": np.ones((3, 4), np.float32)})["y"].shape == (3, 2)


def test_the_served_model_py_does_not_spin_by_default():
    """The measured and the served settings agree: model.py's intra_op_spinning defaults to off."""
    from builder.core.assets import python_backend_model

    text = python_backend_model().read_text()
    assert 'params.get("intra_op_spinning", "off")' in text
