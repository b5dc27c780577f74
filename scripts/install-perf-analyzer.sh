#!/usr/bin/env bash
# Install Triton's perf_analyzer 2.51.0 - the measurement engine of `triton-builder sweep` and `tune` -
# into ~/.cache/triton-builder/perf_analyzer/2.51.0/ (or under $TRITON_BUILDER_CACHE), once:
# only the binary, taken out of the tritonclient 2.51.0 manylinux1 wheel (pip download, never
# installed: it would downgrade protobuf/grpcio), and links to the two libraries it needs, which the
# nvidia-pytriton wheel bundles (builder/tuning/perf_analyzer.py does the work).
#
# Idempotent: an installed one is reused and the script exits 0. Exits 2 (saying how to install it by
# hand) when it cannot; sweep/tune then fall back to the Python client with a warning.
#
# Usage: scripts/install-perf-analyzer.sh [VENV]     (default .venv)
set -euo pipefail

VENV="${1:-.venv}"
"$VENV/bin/python" - <<'PY'
import sys

from builder.tuning.perf_analyzer import PerfAnalyzerMissing, install_perf_analyzer

try:
    tool = install_perf_analyzer(progress=lambda m: print(f"install-perf-analyzer: {m}", flush=True))
except PerfAnalyzerMissing as exc:
    print(f"install-perf-analyzer: {exc}", file=sys.stderr)
    sys.exit(2)
print(f"install-perf-analyzer: ok: {tool.describe()}, libraries in {tool.lib_dir}")
PY
