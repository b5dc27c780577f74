"""One module per stage. Importing this package registers every stage's variants.

PIPELINE lists the stages in order: (name, module, required). A required stage that fails stops
the build; an optional one is recorded and the build goes on.
"""

from __future__ import annotations

from builder.stages import (benchmark, export_onnx, export_torchscript, load, openvino, optimize, publish, quantize,
                            register, select, tensorrt, verify)
from builder.stages import compress  # the only stage that trains (issue 20)

PIPELINE = [
    ("load", load, True),
    ("export_torchscript", export_torchscript, False),
    ("export_onnx", export_onnx, False),
    ("optimize", optimize, False),
    ("quantize", quantize, False),
    ("openvino", openvino, False),
    ("tensorrt", tensorrt, False),
    ("compress", compress, False),
    ("verify", verify, True),
    ("benchmark", benchmark, False),
    ("select", select, True),
    ("publish", publish, True),
    ("register", register, True),
]
