#!/usr/bin/env bash
# Run a command as on an AVX2-only CPU: AVX-512, AVX-VNNI and AMX hidden from CPUID (every process, every
# thread: benchmarks/isa_mask/cpuid_mask.c) and from /proc/cpuinfo (a masked copy bound over it in a private
# mount namespace). A stand-in for an AVX2-only machine, named as such in every figure it gives: the kernels
# dispatched are an AVX2 CPU's, the cores, caches and clocks are still this host's.
#
#   benchmarks/as_avx2_only.sh .venv/bin/python benchmarks/anchors.py --models resnet18
#   benchmarks/as_avx2_only.sh --check      # what torch, onnxruntime, OpenVINO and numpy see
#
# Needs: gcc, unshare (user namespaces), and CPUID faulting (flag cpuid_fault: Intel since Ivy Bridge,
# KVM guests on such hosts; AMD Zen 3 and later).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
work="${TMPDIR:-/tmp}/triton-builder-avx2-only"
mkdir -p "$work"

if ! grep -qw cpuid_fault /proc/cpuinfo; then
  echo "as_avx2_only: this CPU or kernel has no CPUID faulting (flag cpuid_fault in /proc/cpuinfo): cannot hide ISA" >&2
  exit 2
fi
if [ "${1:-}" = "" ]; then
  echo "usage: $0 COMMAND [ARG...] | --check" >&2
  exit 2
fi

lib="$work/cpuid_mask.so"
if [ ! -f "$lib" ] || [ "$here/isa_mask/cpuid_mask.c" -nt "$lib" ]; then
  gcc -O2 -shared -fPIC -o "$lib.tmp" "$here/isa_mask/cpuid_mask.c" -ldl
  mv "$lib.tmp" "$lib"
fi
# the flags an AVX2-only CPU lacks, dropped from every "flags" line
sed -E '/^flags/{s/ (avx512[a-z0-9_]*|amx_[a-z0-9]*|avx_vnni[a-z0-9_]*|avx_ifma|avx_ne_convert|avx10[a-z0-9_.]*)\b//g}' \
  /proc/cpuinfo > "$work/cpuinfo"

if [ "$1" = "--check" ]; then
  python="$repo/.venv/bin/python"
  set -- "$python" -c '
import re, torch, openvino as ov
from pathlib import Path
from builder.core.host import host_profile
flags = next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags")).split()
print("/proc/cpuinfo:", " ".join(f for f in flags if re.match(r"avx|amx", f)))
print("torch cpu capability:", torch.backends.cpu.get_cpu_capability())
print("OpenVINO CPU capabilities:", " ".join(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")))
print("triton-builder host class:", host_profile(with_gpu=False)["isa_class"])
'
fi
echo "as_avx2_only: AVX-512, AVX-VNNI and AMX hidden from $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" \
  "- a stand-in for an AVX2-only CPU: its kernels, this host's cores and clocks" >&2
# GLIBC_TUNABLES: glibc chose its string functions before the library loads; hide the same ISA from it
exec unshare --map-root-user --mount bash -c '
  mount --bind "$0" /proc/cpuinfo
  exec env LD_PRELOAD="$1${LD_PRELOAD:+:$LD_PRELOAD}" \
    GLIBC_TUNABLES="glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD,-AMX_TILE,-AMX_INT8,-AMX_BF16" \
    "${@:2}"' "$work/cpuinfo" "$lib" "$@"
