#!/usr/bin/env bash
# Print the host's CPU model, usable cores and the ISA flags that decide which variants win here
# (INT8 speed and accuracy depend on AVX-512 VNNI / AMX; see docs/explanation/variants.md).
# CI prints it first so that numbers and INT8 verdicts in a log can be read against the machine.
#
# Usage: scripts/host-info.sh
set -uo pipefail

model=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2-)
wanted="avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16 avx512_fp16 avx_vnni amx_tile amx_int8 amx_bf16"
present=()
absent=()
for flag in $wanted; do
    if [[ " $flags " == *" $flag "* ]]; then present+=("$flag"); else absent+=("$flag"); fi
done

echo "host: ${model:-unknown CPU} | $(nproc 2>/dev/null || echo '?') usable cores | $(uname -m) | $(uname -sr)"
echo "host: ISA present: ${present[*]:-none of: $wanted}"
echo "host: ISA absent:  ${absent[*]:-none}"
if command -v nvidia-smi >/dev/null 2>&1; then
    echo "host: GPU: $(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | paste -sd ';')"
else
    echo "host: GPU: none (no nvidia-smi)"
fi
