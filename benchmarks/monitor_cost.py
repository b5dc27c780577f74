"""What deploy.monitor costs: the same standard ONNX folder served alone and behind the monitor ensemble
(<name> -> <name>__model -> <name>__monitor, the python step counting NaN/Inf and feeding the drift window),
side by side on the embedded tritonserver (issue 34: the monitor's cost measured, req/s and p99 with and
without, on digits and on a conv net). Both built for --target cpu with the same sizing (1 instance x 1
thread; the monitor step 1 instance), measured in turns with perf_analyzer over gRPC at c=1/8/16.

Prints the CPU model and ISA flags first, one JSON line per measurement, then a table
(benchmarks/served_side_by_side.py).

Usage: python benchmarks/monitor_cost.py [--models digits,convnet64] [--rounds 3] [--levels 1,8,16]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served_side_by_side import compare  # noqa: E402

LAYOUTS = {"plain": ("cpu", None), "monitored": ("cpu", True)}

if __name__ == "__main__":
    raise SystemExit(compare(LAYOUTS, __doc__))
