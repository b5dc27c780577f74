#!/usr/bin/env bash
# The GPU checks, in one go on a lent GPU host (no network there: what the project needs beyond the host's own
# Python comes carried in .gpu_carry/, made on a networked machine by `bash benchmarks/gpu_carry.sh`).
#
#   bash benchmarks/gpu_host.sh [STEP ...]     steps: facts tests fp16 serve (default: all)
#
# Writes logs and results under $OUT (default /tmp/gpu-out). Every step runs even when an earlier one fails;
# the exit status is the number of failed steps.
set -u
OUT=${OUT:-/tmp/gpu-out}
SITE=${SITE:-/tmp/gpu-site}
CARRY=${CARRY:-.gpu_carry}
mkdir -p "$OUT" "$SITE"
steps=${*:-facts tests fp16 serve}
failed=0

setup() {
    [ -f "$SITE/.ready" ] && return 0
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$CARRY"/whl/*.whl || return 1
    tar -xJf "$CARRY/site.tar.xz" -C "$SITE" || return 1
    mkdir -p ~/.cache/triton-builder && tar -xJf "$CARRY/perf_analyzer.tar.xz" -C ~/.cache/triton-builder || return 1
    if [ -f "$CARRY/backends.tar.xz" ]; then  # Triton's C++ onnxruntime backend (CPU build), made by gpu_carry.sh
        tar -xJf "$CARRY/backends.tar.xz" -C ~/.cache/triton-builder || return 1
    fi
    touch "$SITE/.ready"
}
setup || { echo "setup failed: is .gpu_carry/ there (bash benchmarks/gpu_carry.sh)?"; exit 99; }
export PYTHONPATH="$PWD:$SITE" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
tb() { python3 -m builder "$@"; }

step_facts() {
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
    python3 -c "import sys, torch, numpy, onnxruntime; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.get_device_name(0)); print('numpy', numpy.__version__, 'onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())"
    grep -m1 "model name" /proc/cpuinfo; nproc
    python3 -c "import json; from builder.core.host import host_profile; p = host_profile(); p.pop('isa_flags'); print(json.dumps(p))"
}

step_tests() {
    python3 -m pytest -q -p no:cacheprovider -m gpu tests/integration/test_gpu.py -rs 2>&1 | tee "$OUT/pytest_gpu.log"
    return "${PIPESTATUS[0]}"
}

step_fp16() {
    python3 benchmarks/gpu_fp16.py --results "$OUT/gpu_fp16.md"
}

# the python backend on a KIND_GPU instance (deploy.instance_kind gpu): TorchScript FP32 and FP16 on the GPU,
# checked against the reference over HTTP and gRPC, measured with perf_analyzer at concurrency 1 and 16
step_serve() {
    local rc=0 work=/tmp/gpu-serve
    rm -rf "$work"; mkdir -p "$work"
    for example in ${GPU_SERVE_EXAMPLES:-digits convnet64}; do
        cp -r "examples/$example" "$work/$example"
        printf 'deploy:\n  instance_kind: gpu\n' >> "$work/$example/spec.yaml"
        tb build "$work/$example/spec.yaml" --repository "$work/repo" --variants torchscript,torchscript_fp16 \
            --publish-variants --benchmark-seconds 2 2>&1 | tee "$OUT/build_$example.log" | tail -8 || rc=1
    done
    tb serve --repository "$work/repo" --http-port 18000 --grpc-port 18001 --metrics-port 18002 > "$OUT/serve.log" 2>&1 &
    local pid=$!
    for _ in $(seq 90); do curl -sf 127.0.0.1:18000/v2/health/ready >/dev/null && break; sleep 1; done
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
    for model in $(ls "$work/repo"); do
        [ -f "$work/repo/$model/config.pbtxt" ] || continue
        grep -A2 instance_group "$work/repo/$model/config.pbtxt" | tr '\n' ' '; echo
        tb check "$model" --repository "$work/repo" --url 127.0.0.1:18000 --grpc-url 127.0.0.1:18001 || rc=1
        tb sweep "$model" --repository "$work/repo" --url 127.0.0.1:18001 --protocol grpc --engine perf_analyzer \
            --levels 1,16 --seconds-per-level 5 --out "/tmp/gpu-sweep/$model" 2>&1 | tail -6 || rc=1
    done
    curl -s 127.0.0.1:18002/metrics | grep -E "^nv_gpu_(utilization|memory_used)|^nv_inference_count" | head -20
    kill "$pid"; wait "$pid"
    grep -E "^  backend " "$OUT/serve.log"   # which backends were Triton's own C++ ones, which stand-ins
    tail -3 "$OUT/serve.log"
    return $rc
}

for step in $steps; do
    echo "=== $step ($(date +%T))"
    if ! "step_$step"; then
        echo "=== $step FAILED"
        failed=$((failed + 1))
    fi
done
echo "=== done: $failed failed step(s)"
exit "$failed"
