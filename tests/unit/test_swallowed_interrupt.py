"""A stop signal whose KeyboardInterrupt some library swallowed (code that catches BaseException, such as an
import machinery's): the build stops at the next step boundary and publishes nothing. Seen once: a build
killed by `timeout` (SIGTERM) ran on for a minute and published its version."""

from __future__ import annotations

import os
import signal

import pytest
import yaml

from builder.core.interrupts import raise_if_stopped, terminate_as_interrupt
from builder.pipeline import build


def test_a_swallowed_stop_signal_is_raised_again_between_steps():
    with terminate_as_interrupt():
        raise_if_stopped()  # nothing received yet
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except BaseException:  # noqa: BLE001 - what the library did
            pass
        with pytest.raises(KeyboardInterrupt, match="signal 15 .received during the previous step"):
            raise_if_stopped()
    raise_if_stopped()  # a new command starts clean


def test_a_build_whose_stage_swallowed_sigterm_publishes_nothing(tmp_path, monkeypatch):
    from builder.stages import load

    (tmp_path / "model.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(4, 2).eval()\n")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({
        "name": "m", "source": {"module": "model:build"}, "max_batch_size": 4,
        "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}], "outputs": [{"name": "y"}]}))
    real = load.run

    def swallowing(ctx):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except BaseException:  # noqa: BLE001
            pass
        return real(ctx)
    monkeypatch.setattr(load, "run", swallowing)
    with terminate_as_interrupt(), pytest.raises(KeyboardInterrupt):
        build(tmp_path / "spec.yaml", tmp_path / "repo", variants=["onnx"], benchmark_seconds=0,
              progress=lambda m: None)
    assert not (tmp_path / "repo" / "m").exists()
