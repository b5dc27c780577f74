"""The standard folder served through the embedded server's stand-in backend against today's python-backend
model of the same variant, side by side (issue 34's no-regression target; a benchmark, not a test).

For each example (default digits, overhead-bound, and convnet64, a conv net) this builds the ONNX variant
twice with the same sizing (no benchmark: 1 instance x 1 thread for both): ``--target python`` (a
python-backend folder: config backend "python" + model.py wrapping onnxruntime) and ``--target cpu`` (the
standard folder: platform "onnxruntime_onnx" + model.onnx, served here by the Python-based stand-in, on the
NGC image by the C++ onnxruntime backend). Both are served at once by one embedded tritonserver each and
measured in turns (python, standard, python, standard, ...) with Triton's perf_analyzer over gRPC at
concurrency 1, 8 and 16 (batch-1 requests from reference.npz, time windows until stable); the median of the
rounds is reported. Target: the standard folder reaches at least the python model's req/s and at most its
p99 at each level (within the host's run-to-run spread, printed as min-max of the rounds).

Prints the CPU model and ISA flags first, one JSON line per measurement, then a table
(benchmarks/served_side_by_side.py).

Usage: python benchmarks/standin_vs_python.py [--models digits,convnet64] [--rounds 3] [--levels 1,8,16]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served_side_by_side import compare  # noqa: E402

LAYOUTS = {"python": ("python", None), "standard": ("cpu", None)}

if __name__ == "__main__":
    raise SystemExit(compare(LAYOUTS, __doc__))
