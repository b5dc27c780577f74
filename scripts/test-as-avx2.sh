#!/usr/bin/env bash
# Run tests as an AVX2-only CPU would (no AVX-512, no VNNI, no AMX), so that onnxruntime's MLAS, OpenVINO's
# oneDNN, PyTorch and numpy all take their AVX2 kernels (they pick them from CPUID). INT8 verdicts differ between
# such CPUs and VNNI/AMX hosts; no test may depend on which one it runs on, and this is how to check that on a
# host that has AVX-512.
# - Where the CPU and kernel have CPUID faulting (/proc/cpuinfo flag cpuid_fault): at native speed, through
#   benchmarks/as_avx2_only.sh (CPUID and /proc/cpuinfo answer as an AVX2-only CPU; the whole suite fits).
# - Otherwise under qemu-user emulating a Haswell: about 7x slower, give it a few test modules.
#
# Usage: scripts/test-as-avx2.sh tests/unit/test_quant_search_build.py [more pytest args]
#        (qemu-user is installed from Debian's packages when it is needed and missing)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${VENV:-.venv}/bin/python
if grep -qw cpuid_fault /proc/cpuinfo && [ -z "${TEST_AS_AVX2_QEMU:-}" ]; then
    exec benchmarks/as_avx2_only.sh "$python" -m pytest -q -p no:cacheprovider "$@"
fi
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
    echo "test-as-avx2: installing qemu-user (Debian) ..."
    apt-get update -qq && apt-get install -y -qq --no-install-recommends qemu-user >/dev/null
fi
# what the emulated process sees: AVX2 on, AVX-512 off
qemu-x86_64 -cpu Haswell-v4 "$python" -c '
from numpy._core._multiarray_umath import __cpu_features__ as f
print("test-as-avx2: emulated CPU features:", " ".join(k for k in ("AVX2", "FMA3", "AVX512F", "AVX512_VNNI") if f.get(k)))
' 2>&1 | grep -v "TCG doesn't support"
# the TCG warnings about host-only CPUID bits are noise; pytest's own output passes through
qemu-x86_64 -cpu Haswell-v4 "$python" -m pytest -q -p no:cacheprovider "$@" 2> >(grep -v "TCG doesn't support" >&2)
