"""A variant that fails to run raises with onnxruntime's reason, which verify reports per variant,
and onnxruntime prints nothing of its own (its [E:onnxruntime ...] lines sprayed the build's stderr)."""

from __future__ import annotations

import numpy as np
import pytest


def test_a_failing_onnx_run_raises_and_prints_nothing(tmp_path, capfd):
    import torch

    from builder.model.runtime import open_runner

    class FixedRows(torch.nn.Module):
        def forward(self, x):
            return x.reshape(2, -1)  # only an even number of values fits

    torch.onnx.export(FixedRows(), (torch.zeros(2, 6),), str(tmp_path / "m.onnx"), input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch", 1: "n"}}, dynamo=False)
    run = open_runner("onnx", tmp_path / "m.onnx", ["y"])
    assert run({"x": np.ones((2, 3), np.float32)})["y"].shape == (2, 3)
    capfd.readouterr()
    with pytest.raises(Exception, match=r"(?i)reshape"):
        run({"x": np.ones((3, 5), np.float32)})
    captured = capfd.readouterr()
    assert "[E:onnxruntime" not in captured.err + captured.out
