"""onnxruntime's quantizers warn through the root logger: builder.optimise.onnx_tools.quiet_quantizer keeps those
multi-line WARNING:root dumps out of the build's output without installing a handler for good."""

import subprocess
import sys

PROGRAM = """
import logging
from builder.optimise.onnx_tools import quiet_quantizer
with quiet_quantizer():
    logging.warning("Inference failed or unsupported type to quantize for tensor 'val_2'")
    logging.error("an error still shows")
assert logging.getLogger().handlers == [], logging.getLogger().handlers  # no basicConfig left behind
logging.getLogger().warning("after the call: python's own last-resort handler prints this")
"""


def test_quantizer_warnings_are_kept_out_and_errors_are_not():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Inference failed" not in done.stderr and "WARNING:root" not in done.stderr
    assert "an error still shows" in done.stderr
    assert "after the call" in done.stderr  # the root logger works as before once the call is over
