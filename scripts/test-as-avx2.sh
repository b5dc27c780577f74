#!/usr/bin/env bash
# Run tests as an AVX2-only CPU would (no AVX-512, no VNNI, no AMX): the whole Python process runs under
# qemu-user emulating a Haswell, so onnxruntime's MLAS, OpenVINO's oneDNN and numpy all take their AVX2
# kernels (they pick them from CPUID, which qemu answers). INT8 verdicts differ between such CPUs and
# VNNI/AMX hosts; no test may depend on which one it runs on, and this is how to check that on a host
# that has AVX-512. About 7x slower than native: give it a few test modules, not the whole suite.
#
# Usage: scripts/test-as-avx2.sh tests/unit/test_quant_search_build.py [more pytest args]
#        (qemu-user is installed from Debian's packages when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
    echo "test-as-avx2: installing qemu-user (Debian) ..."
    apt-get update -qq && apt-get install -y -qq --no-install-recommends qemu-user >/dev/null
fi
python=${VENV:-.venv}/bin/python
# what the emulated process sees: AVX2 on, AVX-512 off
qemu-x86_64 -cpu Haswell-v4 "$python" -c '
from numpy._core._multiarray_umath import __cpu_features__ as f
print("test-as-avx2: emulated CPU features:", " ".join(k for k in ("AVX2", "FMA3", "AVX512F", "AVX512_VNNI") if f.get(k)))
' 2>&1 | grep -v "TCG doesn't support"
# the TCG warnings about host-only CPUID bits are noise; pytest's own output passes through
qemu-x86_64 -cpu Haswell-v4 "$python" -m pytest -q -p no:cacheprovider "$@" 2> >(grep -v "TCG doesn't support" >&2)
